"""The action lists are torch's: the same as torch's own schedule helper produces, accepted by torch's dry run, and
for the single-stage schedules what their runtime loop runs."""

from __future__ import annotations

import pytest

from commsched.pipeline import SCHEDULES, ActionKind, lower_schedule

MULTI = [("Interleaved1F1B", 2), ("Interleaved1F1B", 4), ("LoopedBFS", 2), ("InterleavedZeroBubble", 2),
         ("ZBVZeroBubble", 2), ("DualPipeV", 2)]  # fmt: skip


@pytest.mark.parametrize(("schedule", "v"), MULTI)
def test_multi_stage_lists_equal_torch_s_get_schedule_ops(schedule, v):
    """torch's visualiser helper (``get_schedule_ops(..., with_comms=True)``) lowers the same schedules on its own
    stand-in stages: rank for rank, action for action, the same lists."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    for defer in (False, True):
        program = lower_schedule(schedule, 4, 8, v, defer_recv=defer)
        theirs = get_schedule_ops(schedule, 4, 8, v, with_comms=True, defer_pp_recv=defer)
        for rank in range(4):
            assert program.rank_strs(rank) == [str(a) for a in theirs[rank]], (schedule, rank, defer)


def expand(action: str) -> list[str]:
    return action[1:].split(")")[0].split(";") if action.endswith("OVERLAP_F_B") else [action]


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_torch_s_dry_run_runs_each_rank_s_actions_in_our_order(schedule):
    """torch's ``_simulate_comms_compute`` (its dry run, which flags deadlocks; it takes compute and P2P actions,
    not FSDP's or the gradient reduction's) runs our lists, read back from the strings we print (torch's
    ``_dump_csv`` format), to the end, each rank's actions in our order. Its dry run has no OVERLAP_F_B: DualPipeV's
    pairs go in as their two sub-actions, in the order torch's runtime runs them without a custom function; the
    WAITs of GPipe's and 1F1B's runtime loops are not torch actions and stay out."""
    from torch.distributed.pipelining.schedules import _Action, _simulate_comms_compute

    v = 1 if schedule in ("GPipe", "1F1B") else 2
    program = lower_schedule(schedule, 4, 8, v)
    untimed = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
    ours = {r: [sub for a in program.rank_strs(r) if not a.endswith(untimed) and not a.startswith("WAIT")
                for sub in expand(a)] for r in range(4)}  # fmt: skip
    order = {r: [_Action.from_str(a) for a in acts] for r, acts in ours.items()}
    steps = _simulate_comms_compute(order, lambda s: int(program.stage_to_rank[s]), program.num_stages)
    for rank in range(4):
        assert [str(a) for a in steps[rank] if a is not None] == ours[rank]


def test_single_stage_schedules_are_what_torch_s_runtime_runs():
    """Schedule1F1B runs min(M, P - rank) warm-up forwards, then a backward and a forward in turn
    (``_step_microbatches``); its drawn ``pipeline_order`` starts the last rank at F1 instead of F0 (torch 2.13),
    which is why the single-stage lists are recorded from the runtime, not read from the drawing."""
    from torch.distributed.pipelining._schedule_visualizer import get_schedule_ops

    p, m = 4, 8
    for rank in range(p):
        computes = [a for a in lower_schedule("1F1B", p, m).rank_strs(rank) if a[-2:-1] in "FB" and "_" not in a]
        warmup = min(m, p - rank)
        assert computes[:warmup] == [f"{rank}F{i}" for i in range(warmup)]
        assert computes[warmup : warmup + 2] == [f"{rank}B0", f"{rank}F{warmup}"]
        assert sorted(computes) == sorted([f"{rank}F{i}" for i in range(m)] + [f"{rank}B{i}" for i in range(m)])
    drawn = get_schedule_ops("1F1B", p, m)[p - 1]
    assert str(next(a for a in drawn if a is not None)) == f"{p - 1}F1"
    gpipe = [a for a in lower_schedule("GPipe", p, m).rank_strs(1) if a[1] in "FB" and "_" not in a]
    assert gpipe == [f"1F{i}" for i in range(m)] + [f"1B{i}" for i in range(m)]


def test_programs_are_cached_and_read_only():
    first = lower_schedule("ZBVZeroBubble", 2, 4)
    assert lower_schedule("zbvzerobubble", 2, 4, 2) is first
    assert list(first.stage_to_rank) == [0, 1, 1, 0]  # the V: rank r holds stages r and 2P - 1 - r
    with pytest.raises(ValueError):
        first.actions[0][0, 0] = ActionKind.RESHARD

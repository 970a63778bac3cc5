"""Issue 39's acceptance at scale: every torch schedule class runs on a zoo workload at P up to 16 and world sizes up
to 16384 with no deadlock, and each rank runs its computes in the order torch's own dry run
(``_simulate_comms_compute``) runs them. The stage costs are one traced llama-tiny block (traced once, reused for
every stage: the test is about the schedules, not the split)."""

from __future__ import annotations

import pytest

from commsched.hardware import for_graph
from commsched.pipeline import SCHEDULES, ActionKind, StageCosts, lower_schedule, simulate_program
from commsched.pipeline.actions import SINGLE_STAGE

COMPUTE = (ActionKind.FORWARD, ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT,
           ActionKind.OVERLAP_F_B)  # fmt: skip
HARDWARE = "h100-sxm"


@pytest.fixture(scope="module")
def block_costs() -> StageCosts:
    """One llama-tiny transformer block (a middle stage, fsdp+tp with TP 2), traced on fake tensors and timed."""
    from commsched.pipeline.job import PipelineJob
    from commsched.pipeline.stages import stage_seconds, trace_stage

    job = PipelineJob(preset="llama-tiny", parallel="fsdp+tp", world_size=8, tp_size=2, pp_size=2,
                      schedule="1F1B", microbatches=2, layers=2).resolve()  # fmt: skip
    traced = trace_stage(job.compute, False, 1, False)
    secs = stage_seconds(traced, HARDWARE)
    return StageCosts(forward_s=secs.forward_s, backward_s=secs.backward_s, backward_input_s=secs.backward_input_s,
                      backward_weight_s=secs.backward_weight_s, send_bytes=traced.send_bytes,
                      activation_bytes=traced.activation_bytes)  # fmt: skip


def test_the_schedules_are_every_torch_schedule_class():
    from torch.distributed.pipelining import schedules

    assert {name for name in dir(schedules) if name.startswith("Schedule")} == {f"Schedule{s}" for s in SCHEDULES}


def dry_run_computes(program) -> dict[int, list[str]]:
    """Each rank's computes in the order torch's dry run runs them (an OVERLAP_F_B as its two sub-actions; the
    FSDP actions and the WAITs of the single-stage runtimes are not in its vocabulary)."""
    from torch.distributed.pipelining.schedules import _Action, _simulate_comms_compute

    def subs(action: str) -> list[str]:
        return action[1:].split(")")[0].split(";") if action.endswith("OVERLAP_F_B") else [action]

    skip = ("UNSHARD", "RESHARD", "REDUCE_GRAD")
    order = {r: [_Action.from_str(sub) for a in program.rank_strs(r) if not a.endswith(skip) and
                 not a.startswith("WAIT") for sub in subs(a)] for r in range(program.pp_size)}  # fmt: skip
    steps = _simulate_comms_compute(order, lambda s: int(program.stage_to_rank[s]), program.num_stages)
    return {r: [str(a) for a in steps[r] if a is not None and "_" not in str(a)] for r in range(program.pp_size)}


def simulated_computes(res) -> dict[int, list[str]]:
    """Each rank's computes in the order the simulator started them (an OVERLAP_F_B as its two sub-actions)."""
    out = {}
    for rank, acts in enumerate(res.program.actions):
        timed = [i for i, kind in enumerate(acts[:, 0]) if kind in COMPUTE]
        assert all(res.start_ns[rank][i] >= 0 for i in timed), f"rank {rank}: a compute never ran"
        timed.sort(key=lambda i: (int(res.start_ns[rank][i]), i))
        strs = [res.program.action_str(rank, i) for i in timed]
        out[rank] = [sub for a in strs for sub in (a[1:].split(")")[0].split(";") if a.endswith("_F_B") else [a])]
    return out


@pytest.mark.parametrize("schedule", SCHEDULES)
def test_every_schedule_runs_at_p_up_to_16_and_16384_ranks_in_torch_s_order(schedule, block_costs):
    v = 1 if schedule in SINGLE_STAGE else 2
    for p in (2, 4, 8, 16):
        program = lower_schedule(schedule, p, 2 * p, v)  # M = 2P: every schedule takes it (DualPipeV's minimum)
        torch_order = dry_run_computes(program)
        steps = {}
        for ranks_between in (1, 8, 16384 // p):  # one node, one node per pipeline rank, 16384 GPUs
            res = simulate_program(program, block_costs, HARDWARE, ranks_between_stages=ranks_between)
            assert simulated_computes(res) == torch_order, (schedule, p, ranks_between)
            for r in res.per_rank:
                assert 0 < r.busy_s <= res.step_s and 0 <= r.exposed_comm_s <= r.bubble_s + 1e-9
            steps[ranks_between] = res.step_s
        hw = for_graph(HARDWARE, world_size=16384)
        assert 16384 // p >= hw.gpus_per_node  # across nodes every transfer takes the network: slower
        assert steps[16384 // p] >= steps[1], (schedule, p, steps)

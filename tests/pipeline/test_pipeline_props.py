"""Issue 39's property tests of the pipeline simulator, beyond ``test_pipeline_sim.py`` (which checks each action
once, the dependencies, step = busy + bubble and the activation peak on random costs): every cost field, FSDP's
per-step collectives and the backward's transient memory drawn too; the step never shrinks when any of them grows;
the memory covers the static bytes and what each rank holds at its peak; the same results on every run and every
way of building the same input."""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.hardware import for_graph
from commsched.pipeline import ActionKind, StageCosts, lower_schedule, program_from_torch, simulate_program

CASES = [("GPipe", 1, (1, 2)), ("1F1B", 1, (1, 2)), ("Interleaved1F1B", 2, (1, 2)), ("LoopedBFS", 2, (1,)),
         ("InterleavedZeroBubble", 2, (1, 2)), ("ZBVZeroBubble", 2, (1, 2)), ("DualPipeV", 2, (2,))]  # fmt: skip
TIME_FIELDS = ("forward_s", "backward_s", "backward_input_s", "backward_weight_s", "unshard_s", "reduce_grad_s")
BYTE_FIELDS = ("send_bytes", "activation_bytes", "static_bytes", "backward_peak_bytes")


@st.composite
def pipelines(draw):
    """A torch schedule on 2-4 ranks with every StageCosts field drawn per stage, and where its P2P runs: free,
    pipeline ranks 1 or 8 global ranks apart on H100s."""
    name, v, m_per_p = draw(st.sampled_from(CASES))
    p = draw(st.sampled_from((2, 3, 4)))
    stages = p * v

    def per_stage(elements):
        return draw(st.lists(elements, min_size=stages, max_size=stages))

    micros = st.integers(1, 3000).map(lambda k: k * 1e-6)
    costs = StageCosts(**{name: per_stage(micros) for name in TIME_FIELDS[:4]},
                       unshard_s=per_stage(st.integers(0, 2000).map(lambda k: k * 1e-6)),
                       reduce_grad_s=per_stage(st.integers(0, 2000).map(lambda k: k * 1e-6)),
                       overlap_f_b_s=draw(st.none() | st.integers(1, 5000).map(lambda k: k * 1e-6)),
                       send_bytes=per_stage(st.integers(0, 1 << 27)),
                       activation_bytes=per_stage(st.integers(0, 1 << 30)),
                       static_bytes=per_stage(st.integers(0, 1 << 34)),
                       backward_peak_bytes=per_stage(st.integers(0, 1 << 30)))  # fmt: skip
    comm = draw(st.sampled_from(["free", 1, 8]))
    return lower_schedule(name, p, p * draw(st.sampled_from(m_per_p)), v), costs, comm


def simulate(program, costs, comm, *, slowdown: float | None = None):
    """``costs`` on ``program``; with ``slowdown`` the H100 profile's compute slowdown replaced by it."""
    if comm == "free":
        return simulate_program(program, costs, free_comm=True)
    hw = for_graph("h100-sxm", world_size=program.pp_size * comm)
    if slowdown is not None:
        hw = dataclasses.replace(hw, compute_slowdown=slowdown)
    return simulate_program(program, costs, hw, ranks_between_stages=comm)


def held_peak(res, costs: StageCosts) -> list[int]:
    """Per rank, from the timeline: the most bytes held at once, a micro-batch's activations from its forward's
    start to its backward's end (B, or W), plus a stage's ``backward_peak_bytes`` while its B or I runs."""
    program = res.program
    held = np.broadcast_to(costs.activation_bytes, (program.num_stages,))
    transient = np.broadcast_to(costs.backward_peak_bytes, (program.num_stages,))
    peaks = []
    for rank, acts in enumerate(program.actions):
        events = []  # (time, order at equal times: releases first, bytes, transient seen at that time)
        for i, (kind, stage, _mb, kind2, stage2, _mb2) in enumerate(acts.tolist()):
            parts = (
                [(kind, stage)] if kind != ActionKind.OVERLAP_F_B else [(ActionKind.FORWARD, stage), (kind2, stage2)]
            )
            start, end = int(res.start_ns[rank][i]), int(res.end_ns[rank][i])
            for part, s in parts:
                if part == ActionKind.FORWARD:
                    events.append((start, 1, int(held[s]), 0))
                if part in (ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_INPUT):
                    events.append((start, 2, 0, int(transient[s])))
                if part in (ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_WEIGHT):
                    events.append((end, 0, -int(held[s]), 0))
        now = peak = 0
        for _, _, delta, extra in sorted(events):
            now += delta
            peak = max(peak, now + extra)
        peaks.append(peak)
    return peaks


@settings(max_examples=30, deadline=None)
@given(pipelines())
def test_time_covers_busy_and_memory_covers_static_and_what_is_held(case):
    program, costs, comm = case
    res = simulate(program, costs, comm)
    static = np.zeros(program.pp_size, np.int64)
    np.add.at(static, program.stage_to_rank, costs.static_bytes)
    peaks = held_peak(res, costs)
    for rank, r in enumerate(res.per_rank):
        assert r.busy_s <= res.step_s and max(int(e) for e in res.end_ns[rank]) <= round(res.step_s * 1e9)
        assert r.peak_memory_bytes == int(static[rank]) + peaks[rank]
        assert r.exposed_comm_s <= r.bubble_s + 1e-9


def grown(costs: StageCosts, field: str, stage: int, amount: float) -> StageCosts:
    value = getattr(costs, field)
    if field == "overlap_f_b_s":
        return dataclasses.replace(costs, overlap_f_b_s=value + amount)
    arr = np.array(value, dtype=np.float64 if field.endswith("_s") else np.int64)
    arr[stage] += amount if field.endswith("_s") else int(amount * 1e12)  # 1 ms -> 1 GB
    return dataclasses.replace(costs, **{field: arr})


@settings(max_examples=40, deadline=None)
@given(pipelines(), st.data())
def test_the_step_never_shrinks_when_any_cost_grows(case, data):
    """Without the compute slowdown the simulator is a max-plus system (every start is a max of ends plus
    durations), so a longer cost can only delay; growing a memory field never changes the timeline. With the
    slowdown a later transfer may overlap less compute, so only the case without it is a theorem."""
    program, costs, comm = case
    fields = [*TIME_FIELDS, "send_bytes"] + (["overlap_f_b_s"] if costs.overlap_f_b_s is not None else [])
    field = data.draw(st.sampled_from(fields))
    stage = data.draw(st.integers(0, program.num_stages - 1))
    amount = data.draw(st.sampled_from([1e-9, 1e-6, 1e-3]))
    before = simulate(program, costs, comm, slowdown=1.0)
    after = simulate(program, grown(costs, field, stage, amount), comm, slowdown=1.0)
    assert after.step_s >= before.step_s
    memory = data.draw(st.sampled_from(BYTE_FIELDS[1:]))
    more = simulate(program, grown(costs, memory, stage, 1e-3), comm, slowdown=1.0)
    assert more.step_s == before.step_s
    assert all(a.peak_memory_bytes >= b.peak_memory_bytes for a, b in zip(more.per_rank, before.per_rank, strict=True))


def rebuilt(program):
    """The same program built again from torch ``_Action`` s, ranks and stages given in reverse order."""
    from torch.distributed.pipelining.schedules import _Action

    actions = {r: [_Action.from_str(a) if not a.startswith("WAIT") else None for a in program.rank_strs(r)]
               for r in reversed(range(program.pp_size))}  # fmt: skip
    stage_to_rank = {s: int(program.stage_to_rank[s]) for s in reversed(range(program.num_stages))}
    return program_from_torch(program.schedule, program.pp_size, program.microbatches, program.stages_per_rank,
                              stage_to_rank, actions)  # fmt: skip


@settings(max_examples=20, deadline=None)
@given(pipelines())
def test_results_are_identical_on_every_run_and_every_way_of_building_the_input(case):
    program, costs, comm = case
    first = simulate(program, costs, comm)
    as_arrays = StageCosts(**{f.name: (np.asarray(getattr(costs, f.name)) if getattr(costs, f.name) is not None
                                       else None) for f in dataclasses.fields(costs)})  # fmt: skip
    by_microbatch = dataclasses.replace(as_arrays, forward_s=np.repeat(np.asarray(costs.forward_s)[:, None],
                                                                       program.microbatches, axis=1))  # fmt: skip
    runs = [simulate(program, costs, comm), simulate(program, as_arrays, comm), simulate(program, by_microbatch, comm)]
    if program.schedule not in ("GPipe", "1F1B"):  # their WAITs are not torch actions: no torch list holds them
        runs.append(simulate(rebuilt(program), costs, comm))
    for again in runs:
        assert again.as_dict() == first.as_dict()
        for a, b in zip((*again.start_ns, *again.end_ns), (*first.start_ns, *first.end_ns), strict=True):
            assert np.array_equal(a, b)

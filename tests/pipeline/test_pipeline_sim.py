"""The pipeline simulator: its invariants on torch's schedules with random costs (hypothesis), P2P transfers timed by
the collective model, and errors that name the field."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.cost.collectives import plan_collective
from commsched.hardware import for_graph
from commsched.pipeline import (
    ActionKind,
    DeadlockError,
    StageCosts,
    lower_schedule,
    program_from_torch,
    simulate_pipeline,
    simulate_program,
)

COMPUTE = (ActionKind.FORWARD, ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_INPUT, ActionKind.BACKWARD_WEIGHT)
# (schedule, V, M as multiples of P) that torch accepts for every P drawn here
CASES = [("GPipe", 1, (1, 2)), ("1F1B", 1, (1, 2)), ("Interleaved1F1B", 2, (1, 2)), ("LoopedBFS", 2, (1,)),
         ("InterleavedZeroBubble", 2, (1, 2)), ("ZBVZeroBubble", 2, (1, 2)), ("DualPipeV", 2, (2,))]  # fmt: skip


@st.composite
def pipelines(draw):
    name, v, m_per_p = draw(st.sampled_from(CASES))
    p = draw(st.sampled_from((2, 3, 4)))
    m = p * draw(st.sampled_from(m_per_p))
    stages = p * v
    seconds = st.lists(st.integers(1, 3000).map(lambda k: k * 1e-6), min_size=stages, max_size=stages)
    costs = StageCosts(
        forward_s=draw(seconds), backward_input_s=draw(seconds), backward_weight_s=draw(seconds),
        overlap_f_b_s=draw(st.none() | st.integers(1, 5000).map(lambda k: k * 1e-6)),
        send_bytes=draw(st.lists(st.integers(0, 1 << 27), min_size=stages, max_size=stages)),
        activation_bytes=draw(st.lists(st.integers(0, 1 << 30), min_size=stages, max_size=stages)),
        static_bytes=draw(st.integers(0, 1 << 34)),
    )  # fmt: skip
    comm = draw(st.sampled_from(["free", 1, 8]))  # free, or pipeline ranks 1 / 8 global ranks apart on H100s
    return lower_schedule(name, p, m, v), costs, comm


def simulate(program, costs, comm):
    if comm == "free":
        return simulate_program(program, costs, free_comm=True)
    return simulate_program(program, costs, "h100-sxm", ranks_between_stages=comm)


def timed_parts(res) -> dict[tuple[int, int, int], tuple[int, int, int]]:
    """(kind, stage, mb) -> (rank, start ns, end ns) of every compute part (an OVERLAP_F_B's two parts share its
    interval); AssertionError if a part runs twice."""
    out = {}
    for rank, acts in enumerate(res.program.actions):
        for i, (kind, stage, mb, kind2, stage2, mb2) in enumerate(acts.tolist()):
            parts = [(kind, stage, mb)] if kind != ActionKind.OVERLAP_F_B else [(0, stage, mb), (kind2, stage2, mb2)]
            for part in parts:
                if part[0] in COMPUTE:
                    assert part not in out, f"{part} runs twice"
                    out[part] = (rank, int(res.start_ns[rank][i]), int(res.end_ns[rank][i]))
    return out


def transfers(res) -> dict[tuple[int, int, int], tuple[int, int]]:
    """(RECV kind, stage, mb) -> the transfer's (start, end) ns, read at the receive."""
    out = {}
    for rank, acts in enumerate(res.program.actions):
        for i, (kind, stage, mb, *_) in enumerate(acts.tolist()):
            if kind in (ActionKind.RECV_F, ActionKind.RECV_B):
                out[kind, stage, mb] = (int(res.start_ns[rank][i]), int(res.end_ns[rank][i]))
    return out


def check_dependencies(res) -> None:
    """Each compute part after its inputs (through the transfer when they cross ranks), each rank's computes one
    at a time in its order, a transfer after the compute that produced it."""
    parts, xfers = timed_parts(res), transfers(res)
    last = res.program.num_stages - 1
    for (kind, stage, mb), (rank, start, _) in parts.items():
        needs = []
        if kind == ActionKind.FORWARD and stage > 0:
            needs.append(((ActionKind.RECV_F, stage, mb), parts[ActionKind.FORWARD, stage - 1, mb]))
        if kind in (ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_INPUT):
            assert start >= parts[ActionKind.FORWARD, stage, mb][2]
            if stage < last:
                grad = parts.get((ActionKind.FULL_BACKWARD, stage + 1, mb)) or parts[ActionKind.BACKWARD_INPUT,
                                                                                     stage + 1, mb]  # fmt: skip
                needs.append(((ActionKind.RECV_B, stage, mb), grad))
        if kind == ActionKind.BACKWARD_WEIGHT:
            assert start >= parts[ActionKind.BACKWARD_INPUT, stage, mb][2]
        for recv, (producer_rank, _, producer_end) in needs:
            assert start >= producer_end
            if producer_rank != rank:
                x_start, x_end = xfers[recv]
                assert x_start >= producer_end and start >= x_end and x_start >= 0
    for rank, acts in enumerate(res.program.actions):
        timed = np.isin(acts[:, 0], [*COMPUTE, ActionKind.OVERLAP_F_B])
        start, end = res.start_ns[rank][timed], res.end_ns[rank][timed]
        assert (start >= 0).all() and (end >= start).all() and (start[1:] >= end[:-1]).all()


def activation_peak(res, costs: StageCosts) -> list[int]:
    """Per rank, the most activation bytes held at once, from the timeline: a micro-batch's stage holds its bytes
    from its forward's start to its backward's end (B, or W); at equal times a release comes first."""
    parts, held = timed_parts(res), np.broadcast_to(costs.activation_bytes, (res.program.num_stages,))
    events: list[list[tuple[int, int]]] = [[] for _ in range(res.program.pp_size)]
    for (kind, stage, _mb), (rank, start, end) in parts.items():
        if kind == ActionKind.FORWARD:
            events[rank].append((start, int(held[stage])))
        elif kind in (ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_WEIGHT):
            events[rank].append((end, -int(held[stage])))
    return [int(np.max(np.cumsum([0] + [b for _, b in sorted(ev)]))) for ev in events]


@settings(max_examples=40)
@given(pipelines())
def test_every_action_once_dependencies_step_and_memory(case):
    program, costs, comm = case
    res = simulate(program, costs, comm)
    parts = timed_parts(res)
    pairs = {(s, m) for s in range(program.num_stages) for m in range(program.microbatches)}
    assert {(s, m) for k, s, m in parts if k == ActionKind.FORWARD} == pairs
    for s, m in pairs:  # one whole backward, or both halves
        assert ((ActionKind.FULL_BACKWARD, s, m) in parts) != ((ActionKind.BACKWARD_INPUT, s, m) in parts)
        assert ((ActionKind.BACKWARD_INPUT, s, m) in parts) == ((ActionKind.BACKWARD_WEIGHT, s, m) in parts)
    check_dependencies(res)
    step_ns = round(res.step_s * 1e9)
    assert max(int(e.max()) for e in res.end_ns) == step_ns
    for r in res.per_rank:
        assert res.step_s >= r.busy_s > 0
        assert r.busy_s + r.bubble_s == pytest.approx(res.step_s, abs=1e-9)
        assert 0 <= r.exposed_comm_s <= r.bubble_s + 1e-9
    if comm == "free":
        assert all(r.exposed_comm_s == 0 for r in res.per_rank)
    static = np.zeros(program.pp_size, np.int64)
    np.add.at(static, program.stage_to_rank, np.broadcast_to(costs.static_bytes, (program.num_stages,)))
    peaks = activation_peak(res, costs)
    assert [r.peak_memory_bytes for r in res.per_rank] == [int(static[r]) + peaks[r] for r in range(program.pp_size)]
    again = simulate(program, costs, comm)
    assert again.as_dict() == res.as_dict()
    assert all((a == b).all() for a, b in zip(again.start_ns, res.start_ns, strict=True))


@settings(max_examples=25)
@given(pipelines(), st.data())
def test_the_step_never_shrinks_when_a_cost_grows(case, data):
    program, costs, comm = case
    field = data.draw(st.sampled_from(["forward_s", "backward_input_s", "backward_weight_s", "send_bytes"]))
    stage = data.draw(st.integers(0, program.num_stages - 1))
    grown = np.array(getattr(costs, field), dtype=np.float64 if field.endswith("_s") else np.int64)
    grown[stage] += 1e-3 if field.endswith("_s") else 1 << 24
    before = simulate(program, costs, comm).step_s
    after = simulate(program, StageCosts(**{**costs.__dict__, field: grown}), comm).step_s
    assert after >= before


def test_a_p2p_transfer_is_the_collective_model_s_sendrecv_and_shows_as_exposed():
    """GPipe on 2 ranks, one micro-batch: F0 -> activation over the wire -> F1 B1 -> gradient back -> B0; with
    pipeline ranks 8 global ranks apart on 8-GPU H100 nodes, each transfer crosses the network. GPipe's runtime
    waits for its forward sends before its first backward and for its backward sends at the end
    (``_step_microbatches``), so each rank is exposed to both transfers: one it receives, one it sends."""
    nbytes, fwd, bwd = 64 << 20, 1e-3, 2e-3
    costs = StageCosts(forward_s=fwd, backward_s=bwd, send_bytes=nbytes)
    for ranks_between in (1, 8):
        hw = for_graph("h100-sxm", world_size=2 * ranks_between)
        wire = plan_collective("sendrecv", nbytes, 2, hw, stride=ranks_between)
        res = simulate_pipeline("GPipe", 2, 1, None, costs, "h100-sxm", ranks_between_stages=ranks_between)
        assert res.step_s == pytest.approx(2 * fwd + 2 * bwd + 2 * wire.time_s, abs=2e-9)
        assert [r.exposed_comm_s for r in res.per_rank] == pytest.approx([2 * wire.time_s] * 2, abs=2e-9)
        assert (wire.nodes > 1) == (ranks_between == 8)


def test_memory_of_1f1b_is_bounded_by_p_and_gpipe_s_grows_with_m():
    costs = StageCosts(forward_s=1e-3, backward_s=2e-3, activation_bytes=1 << 30, static_bytes=5 << 30)
    for p, m in ((4, 8), (4, 16)):
        one_f_one_b = simulate_pipeline("1F1B", p, m, None, costs, free_comm=True)
        gpipe = simulate_pipeline("GPipe", p, m, None, costs, free_comm=True)
        assert [r.peak_memory_bytes for r in one_f_one_b.per_rank] == [(5 + p - r) << 30 for r in range(p)]
        assert [r.peak_memory_bytes for r in gpipe.per_rank] == [(5 + m) << 30] * p


def test_errors_name_the_field():
    zb = lower_schedule("InterleavedZeroBubble", 2, 2, 2)
    with pytest.raises(ValueError, match="backward_input_s, backward_weight_s: InterleavedZeroBubble splits"):
        simulate_program(zb, StageCosts(forward_s=1, backward_s=2), free_comm=True)
    gpipe = lower_schedule("GPipe", 2, 2)
    bad_costs = ((StageCosts(forward_s=-1, backward_s=1), "forward_s: expected finite seconds"),
                 (StageCosts(forward_s=[1, 2, 3], backward_s=1), r"forward_s: shape \(3,\)"),
                 (StageCosts(forward_s=1), "backward_s: expected"),
                 (StageCosts(forward_s=1, backward_s=1, send_bytes=[1, -1]), "send_bytes: expected byte"))  # fmt: skip
    for bad, match in bad_costs:
        with pytest.raises(ValueError, match=match):
            simulate_program(gpipe, bad, free_comm=True)
    with pytest.raises(ValueError, match="hardware: needed"):
        simulate_program(gpipe, StageCosts(forward_s=1, backward_s=1, send_bytes=8))
    for args, match in ((("GPipe", 2, 2, 2), "stages_per_rank=2: GPipe runs one stage"),
                        (("DualPipeV", 2, 2, 2), "microbatches=2.*DualPipeV requires"),
                        (("ZBVZeroBubble", 2, 4, 3), "stages_per_rank=3: ZBVZeroBubble runs exactly 2"),
                        (("Interleaved1F1B", 4, 6, 1), "stages_per_rank=1: Interleaved1F1B runs 2 or more"),
                        (("Interleaved1F1B", 4, 6, 2), None),
                        (("PipeDream", 2, 2, None), "schedule='PipeDream': expected one of"),
                        (("1F1B", 1, 2, None), "pp_size=1: a pipeline needs")):  # fmt: skip
        if match is None:
            lower_schedule(*args)  # torch's flexible interleaving: 6 micro-batches in one round of 6
            continue
        with pytest.raises(ValueError, match=match):
            lower_schedule(*args)


def custom(orders: dict[int, str]):
    """A 2-rank, 2-micro-batch program from action strings in torch's ``_dump_csv`` format."""
    from torch.distributed.pipelining.schedules import _Action

    actions = {r: [_Action.from_str(a) for a in text.split()] for r, text in orders.items()}
    return program_from_torch("custom", 2, 2, 1, {0: 0, 1: 1}, actions)


def test_a_program_whose_ranks_wait_on_each_other_is_a_deadlock():
    rank0 = "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1"
    good = custom({0: rank0, 1: "1RECV_F0 1F0 1RECV_F1 1F1 1B0 1SEND_B0 1B1 1SEND_B1"})
    simulate_program(good, StageCosts(forward_s=1, backward_s=1), free_comm=True)
    # rank 1 receives micro-batch 1 first: NCCL matches a pair's P2P in order, so it waits behind micro-batch 0
    swapped = custom({0: rank0, 1: "1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F0 1F0 1B0 1SEND_B0"})
    with pytest.raises(DeadlockError, match="deadlocks: rank 0 at 0B0; rank 1 at 1F1"):
        simulate_program(swapped, StageCosts(forward_s=1, backward_s=1), free_comm=True)
    # rank 1 sends B0 before it receives F1, rank 0 sends F1 before it receives B0: both directions of a peer pair
    # share one NCCL stream on each rank (ProcessGroupNCCL's two-rank communicator), so each send waits for a
    # receive queued behind the other
    crossed = custom({0: rank0, 1: "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"})
    with pytest.raises(DeadlockError, match="deadlocks: rank 0 at 0B0; rank 1 at 1F1"):
        simulate_program(crossed, StageCosts(forward_s=1, backward_s=1), free_comm=True)
    backwards_first = custom({0: "0RECV_B0 0B0 " + rank0, 1: "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"})
    with pytest.raises(DeadlockError, match="0B0: an input it needs from its own rank runs later"):
        simulate_program(backwards_first, StageCosts(forward_s=1, backward_s=1), free_comm=True)

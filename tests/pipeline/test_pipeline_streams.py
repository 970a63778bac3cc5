"""The simulator's realism rules, each on a case small enough to check by hand: ProcessGroupNCCL's P2P streams, the
waits of GPipe's and 1F1B's runtime loops, compute slowed while communication is in flight, and a traced stage's
backward transient memory."""

from __future__ import annotations

import math

import numpy as np
import pytest

from commsched.hardware import for_graph
from commsched.pipeline import ActionKind, StageCosts, lower_schedule, simulate_program
from commsched.pipeline.actions import P2P_KINDS, coalesced
from commsched.pipeline.costs import p2p_times_ns, stage_times

HW = "h100-sxm"
P2P = [int(k) for k in P2P_KINDS]


def transfers(res) -> list[tuple[int, int, int, int, bool]]:
    """(rank, peer, start ns, end ns, in a coalesced batch) of every P2P row."""
    program, out = res.program, []
    for rank, acts in enumerate(program.actions):
        batches = {}
        for kind, _, _, _, batch, _ in acts.tolist():
            if kind in P2P and batch >= 0:
                batches.setdefault(batch, []).append(kind)
        for i, (kind, stage, *_rest) in enumerate(acts.tolist()):
            if kind not in P2P:
                continue
            peer_stage = stage + 1 if kind in (ActionKind.SEND_F, ActionKind.RECV_B) else stage - 1
            grouped = acts[i, 4] >= 0 and coalesced(batches[int(acts[i, 4])])
            out.append((rank, int(program.stage_to_rank[peer_stage]), int(res.start_ns[rank][i]),
                        int(res.end_ns[rank][i]), grouped))  # fmt: skip
    return out


def test_each_peer_pair_has_its_own_fifo_stream_and_different_peers_run_side_by_side():
    """Interleaved1F1B posts every P2P op alone: each runs on its peer pair's two-rank communicator, one stream per
    peer on each rank (both directions on it, in posting order), so a rank's transfers with one peer never overlap,
    while a send to the next rank and one to the previous rank do."""
    costs = StageCosts(forward_s=1e-4, backward_s=2e-4, send_bytes=256 << 20)
    res = simulate_program(lower_schedule("Interleaved1F1B", 4, 8, 2), costs, HW, ranks_between_stages=8)
    xfers = [x for x in transfers(res) if not x[4]]
    assert len(xfers) == len(transfers(res)) > 0
    side_by_side = 0
    for rank in range(4):
        mine = sorted(x for x in xfers if x[0] == rank)
        for a in mine:
            for b in mine:
                if a < b and a[3] > b[2] and b[3] > a[2]:  # overlapping in time
                    assert a[1] != b[1], f"rank {rank}: two transfers with peer {a[1]} overlap"
                    side_by_side += 1
    assert side_by_side > 0


def test_1f1b_fuses_a_send_and_the_next_receive_and_its_waits_hold_the_compute_stream():
    """Schedule1F1B's loop posts a send with the next receive from the same peer as one ``batch_isend_irecv``
    (one coalesced NCCL group, on the pipeline group's communicator) and waits for both before its next compute;
    in warm-up it waits for the previous forward's send after the next forward."""
    program = lower_schedule("1F1B", 4, 8)
    strs = program.rank_strs(1)
    assert strs[strs.index("1RECV_B0") - 1] == "1SEND_F2"  # the last warm-up send goes with the first receive
    res = simulate_program(program, StageCosts(forward_s=1e-4, backward_s=2e-4, send_bytes=256 << 20), HW,
                           ranks_between_stages=8)  # fmt: skip
    assert any(x[4] for x in transfers(res))
    for rank, acts in enumerate(program.actions):
        rows = acts.tolist()
        for i, (kind, *_rest) in enumerate(rows):
            if kind != ActionKind.WAIT:
                continue
            batch = rows[i][4]
            batch_end = max(int(res.end_ns[rank][j]) for j, row in enumerate(rows) if row[0] in P2P and row[4] == batch)
            later = [j for j in range(i + 1, len(rows)) if rows[j][0] in (ActionKind.FORWARD, ActionKind.FULL_BACKWARD)]
            assert all(res.start_ns[rank][j] >= batch_end for j in later)


def test_compute_runs_slower_while_a_transfer_is_in_flight():
    """GPipe on 2 ranks: rank 0's F1 starts when F0 ends, as F0's activation starts over the network; while that
    transfer runs F1 progresses at 1 / compute_slowdown (the hardware profile's factor), then at full rate."""
    f_s, nbytes = 1e-3, 16 << 20
    costs = StageCosts(forward_s=f_s, backward_s=2e-3, send_bytes=nbytes)
    program = lower_schedule("GPipe", 2, 2)
    hw = for_graph(HW, world_size=16)
    wire_ns = int(p2p_times_ns(program, stage_times(costs, program).send_bytes, hw, 8)[0])
    f_ns, slowdown = round(f_s * 1e9), hw.compute_slowdown
    assert slowdown > 1 and wire_ns < f_ns * slowdown
    res = simulate_program(program, costs, hw, ranks_between_stages=8)
    f1 = program.rank_strs(0).index("0F1")
    assert int(res.start_ns[0][f1]) == f_ns
    expected = f_ns + wire_ns + math.ceil(f_ns - wire_ns / slowdown - 1e-6)
    assert int(res.end_ns[0][f1]) == expected
    free = simulate_program(program, costs, free_comm=True)
    assert int(free.end_ns[0][f1]) == 2 * f_ns


@pytest.fixture(scope="module")
def traced_stages():
    from commsched.pipeline.job import PipelineJob
    from commsched.pipeline.stages import trace_stage

    job = PipelineJob(preset="llama-tiny", parallel="fsdp+tp", world_size=8, tp_size=2, pp_size=2,
                      schedule="1F1B", microbatches=2, layers=2).resolve()  # fmt: skip
    return {shape: trace_stage(job.compute, *shape) for shape in ((False, 1, False), (False, 2, False),
                                                                  (False, 1, True))}  # fmt: skip


def test_a_stage_s_backward_transient_is_one_block_s_and_the_loss_s(traced_stages):
    """The backward frees each block's activation gradients before the next block's backward, so a middle stage's
    transient does not grow with its depth while its held activations do; the last stage's is larger (the logits'
    gradient). The simulator adds it while a B or I runs."""
    from commsched.pipeline.stage_memory import backward_peak_bytes

    one, two, last = (traced_stages[s] for s in ((False, 1, False), (False, 2, False), (False, 1, True)))
    peak_one, peak_two, peak_last = (backward_peak_bytes(t) for t in (one, two, last))
    assert 0 < peak_one == peak_two < one.activation_bytes < two.activation_bytes
    assert peak_last > peak_one
    costs = StageCosts(forward_s=1e-3, backward_s=2e-3, activation_bytes=one.activation_bytes)
    base = simulate_program(lower_schedule("GPipe", 2, 4), costs, free_comm=True)
    with_transient = simulate_program(lower_schedule("GPipe", 2, 4), StageCosts(
        forward_s=1e-3, backward_s=2e-3, activation_bytes=one.activation_bytes, backward_peak_bytes=peak_one),
        free_comm=True)  # fmt: skip
    # GPipe holds all 4 micro-batches when its first backward starts
    assert [r.peak_memory_bytes for r in base.per_rank] == [4 * one.activation_bytes] * 2
    assert np.array_equal([r.peak_memory_bytes for r in with_transient.per_rank],
                          [4 * one.activation_bytes + peak_one] * 2)  # fmt: skip


def test_a_pair_is_on_nvlink_exactly_when_both_ranks_sit_in_one_node():
    """Pipeline rank r is global rank r x ranks_between; a looped schedule's wrap-around pair (the last rank's stage
    to the first rank's next stage) is on NVLink inside a node although the ranks are P - 1 apart."""
    program = lower_schedule("Interleaved1F1B", 8, 8, 2)  # stages 0..15, stage s on rank s % 8
    send = np.full(program.num_stages, 64 << 20)
    one_node = p2p_times_ns(program, send, HW, 1)  # 8 ranks on one 8-GPU node
    assert len(set(one_node.tolist())) == 1  # 7 -> 8 (rank 7 to rank 0) as fast as 0 -> 1
    two_nodes = p2p_times_ns(program, send, HW, 2)  # global ranks 0, 2, ..., 14: node 0 holds pipeline ranks 0-3
    crossing = {s for s in range(program.num_stages - 1) if (s % 8 < 4) != ((s + 1) % 8 < 4)}
    assert crossing == {3, 7, 11}
    assert all(two_nodes[s] > two_nodes[0] for s in crossing)
    assert all(two_nodes[s] == two_nodes[0] for s in range(program.num_stages - 1) if s not in crossing)

"""Issue 39's acceptance on bubbles: torch's schedules, simulated with unit costs and free communication, have the
published bubbles to 1e-9 for P in {2, 4, 8, 16}, M in {P, 2P, 4P}, V in {1, 2, 4} where the schedule allows.

F, B, W, F&B are one stage's (chunk's) times, B the whole backward (I + W), as in DualPipe's table
(github.com/deepseek-ai/DualPipe README: "F: a forward chunk, B: a full backward chunk, W: a backward for weights
chunk, F&B: two mutually overlapped forward and backward chunks"). A rank's bubble is its compute stream's idle time
over the step (``RankResult.bubble_s``).
"""

from __future__ import annotations

import numpy as np
import pytest

from commsched.pipeline import ActionKind, StageCosts, simulate_pipeline

PP_SIZES = (2, 4, 8, 16)
F, I, W = 1.0, 1.0, 1.0  # unit costs: F = I = W  # noqa: E741 (the papers' names)
B = I + W


def grid(vs: tuple[int, ...], min_m_per_p: int = 1):
    return [(p, k * p, v) for p in PP_SIZES for k in (1, 2, 4) if k >= min_m_per_p for v in vs]


def run(schedule: str, p: int, m: int, v: int, **extra: float):
    costs = StageCosts(forward_s=F, backward_input_s=I, backward_weight_s=W, **extra)
    return simulate_pipeline(schedule, p, m, v, costs, free_comm=True)


def bubbles(res) -> np.ndarray:
    return np.array([r.bubble_s for r in res.per_rank])


def compute_spans_idle(res) -> np.ndarray:
    """Per rank: idle time between its own first compute start and last compute end."""
    out = []
    for rank, acts in enumerate(res.program.actions):
        timed = res.end_ns[rank] >= 0
        timed &= np.isin(acts[:, 0], [ActionKind.FORWARD, ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_INPUT,
                                      ActionKind.BACKWARD_WEIGHT, ActionKind.OVERLAP_F_B])  # fmt: skip
        start, end = res.start_ns[rank][timed], res.end_ns[rank][timed]
        out.append(((end.max() - start.min()) - (end - start).sum()) * 1e-9)
    return np.array(out)


@pytest.mark.parametrize("schedule", ["GPipe", "1F1B"])
def test_gpipe_and_1f1b_bubble_is_p_minus_1_times_f_plus_b(schedule):
    for p, m, v in grid((1,)):
        res = run(schedule, p, m, v)
        np.testing.assert_allclose(bubbles(res), (p - 1) * (F + B), rtol=0, atol=1e-9, err_msg=f"P={p} M={m}")
        assert res.step_s == pytest.approx(m * (F + B) + (p - 1) * (F + B), abs=1e-9)


def test_interleaved_bubble_is_1f1b_s_over_v():
    """Megatron's interleaved bubble (P-1)(F+B)/V, F and B a rank's whole forward and backward (V chunks)."""
    for p, m, v in grid((2, 4)):
        res = run("Interleaved1F1B", p, m, v)
        rank_f, rank_b = v * F, v * B
        np.testing.assert_allclose(bubbles(res), (p - 1) * (rank_f + rank_b) / v, atol=1e-9, err_msg=f"{p} {m} {v}")


def test_zb1p_bubble_is_p_minus_1_times_f_plus_b_minus_2w():
    """torch's InterleavedZeroBubble is ZB1P over V >= 2 chunks per rank: (P-1)(F+B-2W) per chunk. Checked also at
    W = I / 2, where the W's fill less of the bubble."""
    for p, m, v in grid((2, 4)):
        for w in (W, I / 2):
            costs = StageCosts(forward_s=F, backward_input_s=I, backward_weight_s=w)
            res = simulate_pipeline("InterleavedZeroBubble", p, m, v, costs, free_comm=True)
            np.testing.assert_allclose(bubbles(res), (p - 1) * (F + (I + w) - 2 * w), atol=1e-9,
                                       err_msg=f"P={p} M={m} V={v} W={w}")  # fmt: skip


def test_zbv_is_zero_bubble_inside_each_rank_when_f_equals_i_equals_w():
    """ZB-V's zero bubble (Qi et al. 2024, section 6) is a parallelogram: no rank idles between its first and last
    action. The step still has the fill skew no schedule avoids: rank r's first forward waits for micro-batch 0 to
    cross r stages, so each rank's step-level bubble is (P-1)F. Torch builds its order for max(2P-1, M)
    micro-batches and drops those >= M (ScheduleZBVZeroBubble), so at M = P < 2P-1 the dropped slots stay empty:
    a bubble on purpose, larger than (P-1)F."""
    for p, m, v in grid((2,)):
        res = run("ZBVZeroBubble", p, m, v)
        if m >= 2 * p - 1:
            np.testing.assert_allclose(compute_spans_idle(res), 0.0, atol=1e-9, err_msg=f"P={p} M={m}")
            np.testing.assert_allclose(bubbles(res), (p - 1) * F, atol=1e-9, err_msg=f"P={p} M={m}")
        else:
            assert (bubbles(res) > (p - 1) * F + 1e-9).all(), f"P={p} M={m}"


@pytest.mark.parametrize("overlapped", [2.0, 2.5, 3.0])
def test_dualpipev_worst_rank_bubble_is_dualpipe_s(overlapped):
    """DualPipe's (PP/2-1)(F&B+B-3W) counts PP in stages; DualPipeV holds 2 per rank, so on P ranks PP = 2P and
    the bubble is (P-1)(F&B+B-3W) (DualPipe README: "based on the same number of PP stages", DualPipeV on PP/2
    devices). Torch's DualPipeV (M >= 2P stages' worth of micro-batches) gives rank r one overlapped pair more than
    rank r-1 (its step 4 runs M - 2P + r + 1 times), so busy times differ by F+B-F&B per pair: the formula is the
    bubble of the rank with the most pairs, and every other rank's is that minus its missing pairs' saving."""
    for p, m, v in grid((2,), min_m_per_p=2):
        res = run("DualPipeV", p, m, v, overlap_f_b_s=overlapped)
        pairs = np.array([(acts[:, 0] == ActionKind.OVERLAP_F_B).sum() for acts in res.program.actions])
        expected_worst = (p - 1) * (overlapped + B - 3 * W)
        expected = expected_worst - (pairs.max() - pairs) * (F + B - overlapped)
        np.testing.assert_allclose(bubbles(res), expected, atol=1e-9, err_msg=f"P={p} M={m}")
        assert bubbles(res).max() == pytest.approx(expected_worst, abs=1e-9)

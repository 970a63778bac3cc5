"""``commsched plan``'s terminal report: the ranked layouts and what makes the winner win (exposed communication,
pipeline bubble, recompute), against the runner-up and the best layout without overlap optimisation."""

from __future__ import annotations

from typing import Any

from commsched.report.rates import fmt_mfu, fmt_rate
from commsched.report.tables import new_table
from commsched.report.units import fmt_bytes

COLUMNS = ("#", "layout", "step", "tokens/s/GPU", "MFU", "peak memory", "exposed comm", "bubble", "recompute",
           "framework step")  # fmt: skip


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def plan_table(result: Any, top: int) -> Any:
    """The best ``top`` layouts, best first (a rich Table)."""
    req, hw = result.request, result.hardware
    title = (f"plan: {req.preset} on {req.gpus} x {hw.name} ({hw.compute.hbm_capacity_bytes / 2**30:.0f} GiB), "
             f"global batch {req.batch} x seq {req.seq}")  # fmt: skip
    table = new_table(title, COLUMNS, left=2)
    for rank, j in enumerate(result.ranked[:top], 1):
        table.add_row(str(rank), j.layout.label(), _ms(j.step_s), fmt_rate(j.tokens_per_s_per_gpu), fmt_mfu(j.mfu),
                      fmt_bytes(j.peak_memory_bytes), _ms(j.exposed_comm_s), f"{100 * j.bubble_fraction:.1f} %",
                      _ms(j.recompute_s), _ms(j.framework_step_s))  # fmt: skip
    return table


def _spent(j: Any) -> dict[str, float]:
    return {"exposed comm": j.exposed_comm_s, "bubble": j.bubble_fraction * j.step_s, "recompute": j.recompute_s}


def why_lines(result: Any) -> list[str]:
    """What makes the winner win: its step against the runner-up's and the best framework-order layout's, and
    the seconds each spends on exposed communication, bubbles and recompute (winner minus other)."""
    w = result.winner
    lines = [f"winner: {w.layout.label()}: step {_ms(w.step_s)} ({w.kept}), "
             + ", ".join(f"{k} {_ms(v)}" for k, v in _spent(w).items()) + f"; judged at {w.how}"]  # fmt: skip
    others = (("runner-up", result.runner_up), ("best without overlap optimisation", result.best_without_optimisation))
    for name, other in others:
        if other is None or other.layout == w.layout:
            continue
        mine, theirs = _spent(w), _spent(other)
        diffs = ", ".join(f"{k} {1e3 * (mine[k] - theirs[k]):+.1f} ms" for k in mine)
        lines.append(f"vs {name} ({other.layout.label()}, step {_ms(other.step_s)}, framework order "
                     f"{_ms(other.framework_step_s)}): {100 * (1 - w.step_s / other.step_s):.1f} % faster; "
                     f"{diffs}")  # fmt: skip
    lines.append(f"{result.candidates_judged} layouts judged of {result.enumerated} enumerated "
                 f"({result.pruned_memory} pruned by the memory bound, {result.pruned_bound} by the step bound, "
                 f"{result.over_memory} over HBM when simulated, {len(result.failed)} failed; "
                 f"{result.not_optimised} not optimised: lower bound above the best step) in "
                 f"{result.wall_s:.1f} s")  # fmt: skip
    v = result.verified
    if v is not None and v.get("error") is None:
        lines.append(f"winner at every layer: step {_ms(v['full_step_s'])} (scaled estimate {_ms(v['scaled_step_s'])}, "
                     f"{100 * v['difference']:+.2f} %)")  # fmt: skip
    elif v is not None:
        lines.append(f"winner at every layer: failed: {v['error']}")
    return lines

"""``optimize``'s answer against its references (``experiments/references.py``), as text and terminal table: the
kept step against what the user's framework runs today and against torch's best configuration, the traced order
as a detail; the HTML page is ``report/html.py``'s ``render_optimize_html`` over the same rows."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from rich.console import Console

from commsched.report.tables import new_table
from commsched.report.units import fmt_bytes, fmt_seconds

if TYPE_CHECKING:
    from commsched.experiments.references import References
    from commsched.optimize import Optimized
    from commsched.sim import SimResult


@dataclass(frozen=True)
class StepRow:
    """One step of the comparison: its label, what it is, its simulation (None: not built, see ``note``)."""

    label: str
    kind: str  # "optimize", "framework", "torch", "traced"
    sim: SimResult | None
    note: str = ""


def step_rows(o: Optimized, refs: References) -> list[StepRow]:
    """The kept step first, then the framework, torch's configurations (best first) and the traced order."""
    rows = [StepRow(f"optimize: {o.label}", "optimize", o.after)]
    rows.append(StepRow(refs.framework.label, "framework", refs.framework.sim, refs.framework.note))
    torch_rows = sorted(refs.torch, key=lambda r: (r.sim is None, r.sim.makespan_s if r.sim else 0.0))
    rows += [StepRow(r.label, "torch", r.sim, r.note) for r in torch_rows]
    rows.append(StepRow("traced order (no framework runs it)", "traced", refs.traced.sim))
    return rows


def _versus(mine: SimResult, other: SimResult, budget_bytes: int, label: str, detail: str = "") -> str:
    """ "1.18x faster than LABEL (DETAIL: 46.198 ms, peak 5.24 GiB, over the budget)" """
    ratio = other.makespan_s / mine.makespan_s if mine.makespan_s > 0 else 1.0
    word = f"{ratio:.2f}x faster than" if ratio >= 1.0 else f"{1 / ratio:.2f}x slower than"
    over = ", over the budget" if other.peak_memory_bytes > budget_bytes else ""
    lead = f"{detail}: " if detail else ""
    return f"{word} {label} ({lead}{fmt_seconds(other.makespan_s)}, peak {fmt_bytes(other.peak_memory_bytes)}{over})"


def headline(o: Optimized, refs: References) -> str:
    """One line: the kept step against the framework and torch's best, the traced order last."""
    parts = [f"optimize: {fmt_seconds(o.after.makespan_s)} (peak {fmt_bytes(o.after.peak_memory_bytes)}, budget "
             f"{fmt_bytes(o.budget_bytes)})"]  # fmt: skip
    if refs.framework.sim is not None:
        parts.append(_versus(o.after, refs.framework.sim, o.budget_bytes, refs.framework.label))
    best = refs.torch_best
    if best is not None:
        parts.append(_versus(o.after, best.sim, o.budget_bytes, "torch's best configuration", best.label))
    traced = refs.traced.sim
    tail = f"; traced order {fmt_seconds(traced.makespan_s)} ({traced.makespan_s / o.after.makespan_s:.2f}x)"
    return parts[0] + ": " + ", ".join(parts[1:]) + tail if len(parts) > 1 else parts[0] + tail


def headline_dict(o: Optimized, refs: References) -> dict[str, Any]:
    """The same answer for JSON: the step, each reference, and the ratios (reference step / kept step)."""
    best = refs.torch_best

    def ratio(sim: SimResult | None) -> float | None:
        return None if sim is None or o.after.makespan_s <= 0 else sim.makespan_s / o.after.makespan_s

    return {
        "step_s": o.after.makespan_s,
        "speedup_vs_framework": ratio(refs.framework.sim),
        "speedup_vs_torch_best": ratio(best.sim if best else None),
        "speedup_vs_traced": ratio(refs.traced.sim),
        "references": refs.to_dict(),
        "headline": headline(o, refs),
    }


def print_references(o: Optimized, refs: References, console: Console, title: str) -> None:
    """The comparison table (each step, how much slower than the kept one, its exposed communication and peak),
    then the headline."""
    table = new_table(title, ("step", "time", "vs optimize", "exposed comm", "peak memory", "collectives", "note"),
                      left={"step", "note"})  # fmt: skip
    for row in step_rows(o, refs):
        s = row.sim
        if s is None:
            table.add_row(row.label, "-", "-", "-", "-", "-", row.note)
            continue
        rel = s.makespan_s / o.after.makespan_s if o.after.makespan_s > 0 else 1.0
        table.add_row(row.label, fmt_seconds(s.makespan_s), f"{rel:.3f}x", fmt_seconds(s.exposed_comm_s),
                      fmt_bytes(s.peak_memory_bytes), str(len(s.graph.collectives)), row.note,
                      style="bold" if row.kind == "optimize" else None)  # fmt: skip
    console.print(table)
    console.print(headline(o, refs), highlight=False, soft_wrap=True)

"""``commsched optimize`` in the terminal: every program variant tried, its simulated step and its verdict."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

from commsched.report.tables import new_table
from commsched.report.units import fmt_bytes, fmt_seconds

if TYPE_CHECKING:
    from commsched.optimize import Optimized


def print_optimized(o: Optimized, console: Console, title: str) -> None:
    """One row per variant (the kept one in bold; "probe": a bucket plan's step after one scheduling attempt, which
    ranks plans for the full search), then the summary line."""
    table = new_table(
        title,
        ("variant", "collectives", "probe", "step time", "peak memory", "verdict"),
        left={"variant", "verdict"},
    )
    for t in o.tried:
        style = "bold" if t.verdict == "kept" else None
        step = "-" if t.makespan_s is None else fmt_seconds(t.makespan_s)
        probe = "-" if t.probe_s is None else fmt_seconds(t.probe_s)
        peak = "-" if t.peak_memory_bytes is None else fmt_bytes(t.peak_memory_bytes)
        n = "-" if t.collectives is None else str(t.collectives)
        table.add_row(t.label, n, probe, step, peak, t.verdict, style=style)
    console.print(table)
    console.print(optimized_line(o), highlight=False, soft_wrap=True)


def optimized_line(o: Optimized) -> str:
    """The line under the table: :meth:`Optimized.summary` (human units)."""
    return o.summary()

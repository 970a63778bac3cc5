"""Simulated steps in the terminal: one step's summary (``commsched simulate``), orders of one graph compared
(``commsched demo``), a schedule before and after its passes and the pass list (``commsched schedule``)."""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import TYPE_CHECKING

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table

from commsched.report.tables import (
    EXPOSED_COLUMNS,
    STREAM_COLUMNS,
    comparison_rows,
    exposed_rows,
    new_table,
    stream_rows,
    title_width,
)
from commsched.report.units import fmt_bytes, fmt_percent, fmt_seconds, humanize
from commsched.sim.result import SimResult

if TYPE_CHECKING:
    from commsched.cost.model import CostEstimate
    from commsched.passes.pipeline import Schedule
    from commsched.passes.registry import PassSpec, PassStats
    from commsched.report.step import StepPrediction
    from commsched.report.summary import GraphSummary


def summary_table(res: SimResult, title: str = "simulated step", contention_s: float = 0.0) -> Table:
    """Step time (with ``contention_s``, the charge of kernels overlapping on several compute streams), its bound,
    exposed communication, overlap and peak memory."""
    t = Table(title=title, show_header=False, show_edge=False, pad_edge=False, min_width=title_width(title))
    t.add_column("metric", style="bold")
    t.add_column("value", justify="right")
    b = res.bound
    t.add_row("step time", fmt_seconds(res.makespan_s + contention_s))
    if contention_s > 0:
        t.add_row("  of which contention", f"{fmt_seconds(contention_s)} (kernels overlapping on compute streams)")
    t.add_row("lower bound", f"{fmt_seconds(res.lower_bound_s)} ({b.binding})")
    ratio = (res.makespan_s + contention_s) / res.lower_bound_s if res.lower_bound_s > 0 else res.bound_ratio
    t.add_row("step time / bound", f"{ratio:.3f}")
    t.add_row(
        "exposed communication", f"{fmt_seconds(res.exposed_comm_s)} ({_pct(res.exposed_comm_s, res.makespan_s)})"
    )
    t.add_row("comm/compute overlap (HTA)", fmt_percent(res.overlap_ratio))
    t.add_row("peak memory", fmt_bytes(res.peak_memory_bytes))
    return t


def streams_table(res: SimResult) -> Table:
    t = new_table("streams", STREAM_COLUMNS)
    for row in stream_rows(res):
        t.add_row(*row)
    return t


def exposed_table(res: SimResult, k: int = 8) -> Table:
    t = new_table(f"top {k} exposed collectives", EXPOSED_COLUMNS, left=3)
    for row in exposed_rows(res, k):
        t.add_row(*row)
    if not t.row_count:
        t.add_row("(none: all communication is hidden)", "", "", "", "", "")
    return t


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole > 0 else "-"


def print_summary(
    res: SimResult, console: Console | None = None, title: str | None = None, contention_s: float = 0.0
) -> None:
    """Print the summary, the streams and the most exposed collectives."""
    console = console or Console()
    title = title or str(res.graph.meta.get("workload", "simulated step"))
    summary = summary_table(res, title, contention_s)
    console.print(Panel(Group(summary, streams_table(res), exposed_table(res)), expand=False))


def comparison_table(results: list[tuple[str, SimResult]], title: str = "orders compared") -> Table:
    """One row per order: step time, speedup over the first, gap to the bound, exposed comm, overlap, peak memory."""
    columns = ("order", "step time", "speedup", "vs bound", "exposed comm", "overlap", "peak memory")
    t = new_table(title, columns, no_wrap=True)
    for row in comparison_rows(results, bound=lambda r: f"+{100 * (r.bound_ratio - 1):.1f} %"):
        t.add_row(*row)
    return t


def print_demo_report(
    summary: GraphSummary,
    results: list[tuple[str, SimResult]],
    stats: Iterable[PassStats],
    console: Console,
    *,
    graph_title: str,
    title: str,
) -> None:
    """The traced graph, its orders compared, and the notes of the passes that made them."""
    from commsched.report.terminal_inputs import print_graph_info

    print_graph_info(summary, console, title=graph_title)
    console.print(comparison_table(results, title=title))
    for st in stats:
        for note in st.notes:
            console.print(f"  {st.name}: {humanize(note)}", soft_wrap=True, highlight=False)


def print_pass_list(passes: Mapping[str, PassSpec], presets: Mapping[str, Sequence[str]], console: Console) -> None:
    """Every registered pass with what it does, then every preset's passes."""
    t = new_table("passes", ("name", "what it does"), left=2)
    for name, spec in sorted(passes.items()):
        t.add_row(name, spec.description)
    console.print(t)
    for name, ps in presets.items():
        console.print(f"preset [bold]{name}[/]: {', '.join(ps) or '(no passes)'}")


def print_schedule_report(
    result: Schedule,
    before: StepPrediction,
    after: StepPrediction,
    console: Console,
    *,
    title: str,
    costs: CostEstimate,
    stats: bool = False,
    timeline: bool = False,
) -> None:
    """A schedule's effect: what each pass did (``stats``), a text timeline of the final order (``timeline``), then
    the input and the scheduled order side by side. Step times are :func:`commsched.report.step.predict`'s: with
    several compute streams they include the contention charge, in its own column."""
    from commsched.report.pass_stats import overlap_timeline, print_pass_stats

    if stats:
        for st in result.stats:
            print_pass_stats(st, console)
    if timeline:
        for line in overlap_timeline(result.graph, result.order, costs, max_lines=400):
            console.print(line, highlight=False)
    contention = before.contention_s > 0 or after.contention_s > 0
    columns = ("order", "step time", *(("of which contention",) if contention else ()), "exposed comm", "overlap",
               "peak memory", "pass time")  # fmt: skip
    table = new_table(f"{title}: {', '.join(result.passes) or 'no passes'}", columns)
    wall = sum(s.wall_s for s in result.stats)
    for label, p, w in (("input", before, None), ("scheduled", after, wall)):
        r = p.sim
        table.add_row(
            label,
            fmt_seconds(p.makespan_s),
            *((fmt_seconds(p.contention_s),) if contention else ()),
            fmt_seconds(r.exposed_comm_s),
            fmt_percent(r.overlap_ratio),
            fmt_bytes(r.peak_memory_bytes),
            "" if w is None else fmt_seconds(w),
        )
    console.print(table)

"""A rich terminal summary of a simulated step."""

from __future__ import annotations

from rich.console import Console, Group
from rich.panel import Panel
from rich.table import Table

from commsched.report.units import fmt_bytes, fmt_seconds
from commsched.sim.result import SimResult


def summary_table(res: SimResult, title: str = "simulated step") -> Table:
    t = Table(title=title, show_header=False, show_edge=False, pad_edge=False)
    t.add_column("metric", style="bold")
    t.add_column("value", justify="right")
    b = res.bound
    t.add_row("step time (makespan)", fmt_seconds(res.makespan_s))
    t.add_row("lower bound", f"{fmt_seconds(res.lower_bound_s)} ({b.binding})")
    t.add_row("makespan / bound", f"{res.bound_ratio:.3f}")
    t.add_row(
        "exposed communication", f"{fmt_seconds(res.exposed_comm_s)} ({_pct(res.exposed_comm_s, res.makespan_s)})"
    )
    t.add_row("comm/compute overlap (HTA)", f"{100 * res.overlap_ratio:.1f} %")
    t.add_row("peak memory", fmt_bytes(res.peak_memory_bytes))
    return t


def streams_table(res: SimResult) -> Table:
    t = Table(title="streams", show_edge=False)
    for col in ("stream", "busy", "utilisation"):
        t.add_column(col, justify="left" if col == "stream" else "right")
    for name, busy, util in zip(res.stream_names, res.stream_busy_ns, res.stream_utilization.values(), strict=True):
        t.add_row(name, fmt_seconds(int(busy) * 1e-9), f"{100 * util:.1f} %")
    return t


def exposed_table(res: SimResult, k: int = 8) -> Table:
    t = Table(title=f"top {k} exposed collectives", show_edge=False)
    for col in ("collective", "type", "group", "bytes", "duration", "exposed"):
        t.add_column(col, justify="left" if col in ("collective", "type", "group") else "right")
    for row in res.top_exposed(k):
        t.add_row(
            row["name"],
            row["type"],
            row["group"],
            fmt_bytes(row["bytes"]),
            fmt_seconds(row["duration_s"]),
            fmt_seconds(row["exposed_s"]),
        )
    if not t.row_count:
        t.add_row("(none: all communication is hidden)", "", "", "", "", "")
    return t


def _pct(part: float, whole: float) -> str:
    return f"{100 * part / whole:.1f} %" if whole > 0 else "-"


def print_summary(res: SimResult, console: Console | None = None, title: str | None = None) -> None:
    """Print the summary, the streams and the most exposed collectives."""
    console = console or Console()
    title = title or str(res.graph.meta.get("workload", "simulated step"))
    console.print(Panel(Group(summary_table(res, title), streams_table(res), exposed_table(res)), expand=False))


def comparison_table(results: list[tuple[str, SimResult]], title: str = "orders compared") -> Table:
    """One row per order: step time, speedup over the first, gap to the bound, exposed comm, overlap, peak memory."""
    t = Table(title=title, show_edge=False)
    for col in ("order", "step time", "speedup", "vs bound", "exposed comm", "overlap", "peak memory"):
        t.add_column(col, justify="left" if col == "order" else "right", no_wrap=True)
    first = results[0][1]
    for label, r in results:
        t.add_row(
            label,
            fmt_seconds(r.makespan_s),
            f"{first.makespan_s / r.makespan_s:.3f}x" if r.makespan_s > 0 else "-",
            f"+{100 * (r.bound_ratio - 1):.1f} %",
            fmt_seconds(r.exposed_comm_s),
            f"{100 * r.overlap_ratio:.1f} %",
            fmt_bytes(r.peak_memory_bytes),
        )
    return t

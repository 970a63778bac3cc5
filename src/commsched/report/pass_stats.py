"""What scheduling passes did, for people: per-collective stats tables and a text timeline of overlap."""

from __future__ import annotations

import numpy as np
from rich.console import Console

from commsched.cost.model import CostEstimate
from commsched.ir import Graph, OpKind
from commsched.passes.registry import PassStats
from commsched.report.tables import new_table
from commsched.report.units import column_label, fmt_seconds, fmt_value, humanize

_COLUMNS = (
    ("collective", "collective"),
    ("wait", "wait"),
    ("comm_time_s", "comm"),
    ("comp_time_s", "compute"),
    ("initial_exposed_s", "exposed before"),
    ("final_exposed_s", "exposed after"),
    ("limiting_factor", "limiting factor"),
    ("moves", "moves"),
    ("grouped", "grouped"),
)


def print_pass_stats(stats: PassStats, console: Console, max_rows: int = 40) -> None:
    """A table of one pass's per-collective rows (like the seeds' ReorderInfo / SinkWaitInfo logs)."""
    title = f"{stats.name}  ({stats.wall_s * 1e3:.1f} ms)"
    if stats.rows and any(k in stats.rows[0] for k, _ in _COLUMNS):
        cols = [(k, label) for k, label in _COLUMNS if k in stats.rows[0]]
        numbers = {k for k, _ in cols if k.endswith("_s") or k in ("moves", "grouped")}
        table = new_table(title, [label for _, label in cols], left={label for k, label in cols if k not in numbers})
        for row in stats.rows[:max_rows]:
            table.add_row(*(fmt_seconds(row[k]) if k.endswith("_s") else str(row[k]) for k, _ in cols))
        if len(stats.rows) > max_rows:
            table.add_row(f"... {len(stats.rows) - max_rows} more", *[""] * (len(cols) - 1))
        console.print(table)
        improvement = sum(r.get("initial_exposed_s", 0) - r.get("final_exposed_s", 0) for r in stats.rows)
        moves = sum(r.get("moves", 0) for r in stats.rows)
        console.print(f"  estimated exposed time hidden: {fmt_seconds(improvement)} after {moves} moves")
    elif stats.rows:
        keys = list(stats.rows[0])
        table = new_table(title, [column_label(k) for k in keys], left=1)
        for row in stats.rows[:max_rows]:
            table.add_row(*(fmt_value(k, row.get(k)) for k in keys))
        console.print(table)
    else:
        console.print(f"[bold]{title}[/]")
    if stats.refused:
        reasons = ", ".join(f"{k}: {v}" for k, v in sorted(stats.refused.items(), key=lambda kv: -kv[1]))
        console.print(f"  stop reasons: {reasons}")
    for note in stats.notes:
        console.print(f"  {humanize(note)}", soft_wrap=True, highlight=False)


def overlap_timeline(g: Graph, order: np.ndarray, costs: CostEstimate, max_lines: int | None = None) -> list[str]:
    """A text timeline of ``order`` (the seeds' ``visualize_overlap``): one line per timed node, compute that runs
    while a collective is in flight marked ``|``, and the serial estimate (no overlap model) at the end."""
    lines: list[str] = []
    in_flight: set[int] = set()
    total = 0.0
    for step, node in enumerate(order.tolist()):
        kind = g.kinds[node]
        t = float(costs.node_s[node])
        if kind == OpKind.COLLECTIVE:
            in_flight.add(node)
            total += t
            lines.append(f"{step:>6}: ISSUE {g.names[node]} ({g.targets[node]}, {fmt_seconds(t)})")
        elif kind == OpKind.WAIT:
            c = int(g.wait_of[node])
            in_flight.discard(c)
            lines.append(f"{step:>6}: WAIT  {g.names[node]} (for {g.names[c]})")
        elif t > 0:
            mark = "| " if in_flight else ""
            if not in_flight:
                total += t
            lines.append(f"{step:>6}: {mark}{g.names[node]} ({g.targets[node]}, {fmt_seconds(t)})")
        if max_lines is not None and len(lines) >= max_lines:
            lines.append("   ...")
            break
    lines.append(f"estimated runtime counting overlapped compute as hidden: {fmt_seconds(total)}")
    return lines

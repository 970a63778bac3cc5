"""The one table shape of every terminal report, and the rows the terminal and the HTML report share."""

from __future__ import annotations

from collections.abc import Callable, Collection, Sequence
from typing import TYPE_CHECKING, Any

from rich.console import OverflowMethod
from rich.table import Table

from commsched.report.units import fmt_bytes, fmt_seconds

if TYPE_CHECKING:
    from commsched.sim.result import SimResult


def new_table(
    title: str | None,
    columns: Sequence[str],
    *,
    left: int | Collection[str] = 1,
    no_wrap: bool = False,
    overflow: OverflowMethod = "ellipsis",
    **table_options: Any,
) -> Table:
    """A rich table without an outer edge whose ``columns`` hold text (left-aligned: the first ``left`` columns, or
    those named in ``left``) or numbers (right-aligned: the others). ``no_wrap`` / ``overflow`` apply to every
    column (rich's defaults otherwise); ``table_options`` go to :class:`rich.table.Table` (box, padding...)."""
    table = Table(title=title, show_edge=False, **{"min_width": title_width(title), **table_options})
    for k, col in enumerate(columns):
        is_text = k < left if isinstance(left, int) else col in left
        table.add_column(col, justify="left" if is_text else "right", no_wrap=no_wrap, overflow=overflow)
    return table


def title_width(title: str | None) -> int | None:
    """The least width a table needs for ``title`` to stay on one line (rich wraps a title at the table's width)."""
    return len(title) + 2 if title else None


EXPOSED_COLUMNS = ("collective", "type", "group", "bytes", "duration", "exposed")


def exposed_rows(res: SimResult, k: int) -> list[list[str]]:
    """The ``k`` collectives that stall compute longest (``EXPOSED_COLUMNS``)."""
    return [
        [
            row["name"],
            row["type"],
            row["group"],
            fmt_bytes(row["bytes"]),
            fmt_seconds(row["duration_s"]),
            fmt_seconds(row["exposed_s"]),
        ]
        for row in res.top_exposed(k)
    ]


STREAM_COLUMNS = ("stream", "busy", "utilisation")


def stream_rows(res: SimResult) -> list[list[str]]:
    """Each stream's busy time and utilisation (``STREAM_COLUMNS``)."""
    return [
        [name, fmt_seconds(int(busy) * 1e-9), f"{100 * util:.1f} %"]
        for name, busy, util in zip(res.stream_names, res.stream_busy_ns, res.stream_utilization.values(), strict=True)
    ]


def comparison_rows(results: Sequence[tuple[str, SimResult]], bound: Callable[[SimResult], str]) -> list[list[str]]:
    """One row per order: label, step time, speedup over the first order, ``bound(result)`` (how far from the lower
    bound, as the caller writes it), exposed comm, overlap, peak memory."""
    first = results[0][1]
    return [
        [
            label,
            fmt_seconds(r.makespan_s),
            f"{first.makespan_s / r.makespan_s:.3f}x" if r.makespan_s > 0 else "-",
            bound(r),
            fmt_seconds(r.exposed_comm_s),
            f"{100 * r.overlap_ratio:.1f} %",
            fmt_bytes(r.peak_memory_bytes),
        ]
        for label, r in results
    ]

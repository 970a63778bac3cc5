"""The one table shape of every terminal report, and the rows the terminal and the HTML report share."""

from __future__ import annotations

from collections.abc import Collection, Sequence
from typing import Any

from rich.console import OverflowMethod
from rich.table import Table


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
    table = Table(title=title, show_edge=False, **table_options)
    for k, col in enumerate(columns):
        is_text = k < left if isinstance(left, int) else col in left
        table.add_column(col, justify="left" if is_text else "right", no_wrap=no_wrap, overflow=overflow)
    return table

"""A sweep over pipeline schedules in the terminal (``commsched sweep --pp-size``): one row per (parallel, world
size, hardware, P, schedule, M, V) with its step, tokens/s per GPU, bubble, worst rank's exposed communication and
peak memory; a combination torch refuses shows "error" here and its reason under the table (``print_sweep``)."""

from __future__ import annotations

import math
from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich import box
from rich.table import Table

from commsched.report.rates import fmt_rate
from commsched.report.tables import new_table
from commsched.report.units import fmt_bytes, fmt_percent, fmt_seconds_short

if TYPE_CHECKING:
    from commsched.experiments.sweep_row import SweepRow

COLUMNS = ("parallel", "world", "hardware", "P", "schedule", "M", "V", "step", "tokens/s\n/GPU", "bubble",
           "exposed\ncomm", "peak\nmemory")  # fmt: skip


def _count(value: int) -> str:
    return "-" if value < 0 else str(value)


def pipeline_sweep_table(rows: Sequence[SweepRow], title: str) -> Table:
    """The pipeline rows of a sweep, one line each (M and V as torch ran them; "-" where a failed row's default
    was never resolved)."""
    table = new_table(title, COLUMNS, left=("parallel", "hardware", "schedule"), box=box.SIMPLE_HEAD, padding=(0, 1))
    for r in rows:
        head = [r.parallel, str(r.world_size), r.hardware, str(r.pp_size), r.pp_schedule or "-",
                _count(r.microbatches), _count(r.stages_per_rank)]  # fmt: skip
        if not r.ok:
            table.add_row(*head, "[red]error[/]", *[""] * 4)
            continue
        tps = None if math.isnan(r.tokens_per_s_per_gpu) else r.tokens_per_s_per_gpu
        table.add_row(*head, fmt_seconds_short(r.step_time_s), fmt_rate(tps), fmt_percent(r.bubble_fraction),
                      fmt_seconds_short(r.exposed_comm_s), fmt_bytes(r.peak_memory_bytes))  # fmt: skip
    return table


def where(row: SweepRow) -> str:
    """A pipeline row's configuration in words, for its error line."""
    m, v = _count(row.microbatches), _count(row.stages_per_rank)
    return f"{row.parallel} world {row.world_size} P={row.pp_size} {row.pp_schedule} M={m} V={v} on {row.hardware}"

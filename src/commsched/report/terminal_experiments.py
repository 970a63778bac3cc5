"""Experiments in the terminal: every scheduler on one graph (``commsched compare``) and one preset over
parallelisms x world sizes x hardware profiles (``commsched sweep``)."""

from __future__ import annotations

from collections.abc import Sequence
from typing import TYPE_CHECKING

from rich import box
from rich.console import Console
from rich.markup import escape
from rich.table import Table

from commsched.report.tables import new_table
from commsched.report.units import fmt_bytes, fmt_percent, fmt_seconds, fmt_seconds_short, fmt_signed_percent

if TYPE_CHECKING:
    from commsched.experiments.compare import CompareResult
    from commsched.experiments.sweep_row import SweepRow


def compare_table(result: CompareResult, title: str) -> Table:
    """One row per scheduler: step time, gap to the lower bound, exposed comm, overlap, peak memory, pass time and
    a note (why a scheduler did not run, or what it proved). ``title`` is followed by the lower bound."""
    columns = ("scheduler", "step time", "vs bound", "exposed comm", "overlap", "peak memory", "pass time", "note")
    table = new_table(
        f"{title}; lower bound {fmt_seconds(result.lower_bound_s)} ({result.bound_binding})",
        columns,
        left=("scheduler", "note"),
    )
    for r in result.rows:
        if r.makespan_s is None:  # the whole reason goes below the table (print_compare), never cut off here
            table.add_row(r.scheduler, "-", "-", "-", "-", "-", fmt_seconds(r.wall_s or 0), "failed: see below")
            continue
        table.add_row(
            r.scheduler,
            fmt_seconds(r.makespan_s),
            fmt_signed_percent(r.gap_to_bound) if r.gap_to_bound is not None else "",
            fmt_seconds(r.exposed_comm_s),
            fmt_percent(r.overlap_ratio),
            fmt_bytes(r.peak_memory_bytes),
            "" if r.wall_s is None else fmt_seconds(r.wall_s),
            r.note[:60],
        )
    return table


def print_compare(result: CompareResult, console: Console, title: str) -> None:
    """The compare table, then each scheduler that did not run with its whole reason, one line each."""
    console.print(compare_table(result, title))
    for r in result.rows:
        if r.makespan_s is None:
            console.print(f"[red]{escape(r.scheduler)}[/]: {escape(r.note)}", highlight=False, soft_wrap=True)


def sweep_table(rows: Sequence[SweepRow], title: str) -> Table:
    """One row per configuration; fits an 80-column terminal where it can. A number is never cut: each number
    column is as wide as its widest value; the text columns (parallelism, hardware) wrap instead."""
    columns = ("parallel", "world", "hardware", "step\ntraced", "step\nsched.", "speed\nup", "exposed\ncomm")
    columns += ("over-\nlap", "peak\nmemory", "lower\nbound")
    text = ("parallel", "hardware")
    cells = []
    for r in rows:
        # the sweep's other dimensions, only when swept: FSDP buckets per block, optimize on
        parallel = r.parallel + ("/block" if r.fsdp_bucket == "block" else "")
        head = [parallel, str(r.world_size), r.hardware + (" (opt.)" if r.optimize else "")]
        if not r.ok:
            cells.append([*head, "[red]error[/]", *[""] * 6])
            continue
        cells.append([
            *head,
            fmt_seconds_short(r.step_time_input_s),
            fmt_seconds_short(r.step_time_s),
            f"{r.speedup:.2f}x",
            fmt_seconds_short(r.exposed_comm_s),
            fmt_percent(r.overlap_ratio),
            fmt_bytes(r.peak_memory_bytes),
            fmt_seconds_short(r.lower_bound_s),
        ])  # fmt: skip
    table = new_table(title, columns, left=text, box=box.SIMPLE_HEAD, padding=0)
    for k, column in enumerate(table.columns):
        if columns[k] in text:
            column.overflow = "fold"
        else:  # numbers: never wrapped nor shortened (an "error" cell is markup: 5 characters shown)
            widest = max((len(row[k]) if row[k] != "[red]error[/]" else 5 for row in cells), default=0)
            column.no_wrap, column.min_width = True, max(widest, *map(len, columns[k].split("\n")))
    for row in cells:
        table.add_row(*row)
    return table


def print_sweep(rows: Sequence[SweepRow], console: Console, *, title: str, wall_s: float) -> None:
    """The sweep's table, then why each failed configuration failed, then how many succeeded in how long."""
    from commsched.report import pipeline_sweep

    pipelined = any(r.pp_size > 1 for r in rows)  # a pipeline sweep (commsched sweep --pp-size)
    console.print(pipeline_sweep.pipeline_sweep_table(rows, title) if pipelined else sweep_table(rows, title))
    for r in rows:
        if not r.ok:
            where = pipeline_sweep.where(r) if pipelined else f"{r.parallel} world {r.world_size} on {r.hardware}"
            console.print(f"[red]error[/] {escape(where)}: {escape(r.error or '')}", highlight=False)
    ok = sum(1 for r in rows if r.ok)
    console.print(f"{ok}/{len(rows)} configurations in {wall_s:.1f} s")

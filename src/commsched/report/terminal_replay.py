"""Terminal tables of ``commsched replay``: measured next to replayed, per rank and per stream (rows from
``report/replay_view.py``, which the HTML report renders too)."""

from __future__ import annotations

from rich.console import Console

from commsched.replay.run import MultiReplay, ReplayReport
from commsched.report.replay_view import STREAM_COLUMNS, SUMMARY_COLUMNS, naive_line, stream_rows, summary_rows, title
from commsched.report.tables import new_table
from commsched.report.units import fmt_seconds


def print_replay_report(r: ReplayReport, console: Console) -> None:
    """One trace: step, exposed communication and overlap (measured, replayed), the naive estimates, streams."""
    table = new_table(title(r), SUMMARY_COLUMNS)
    for row in summary_rows(r):
        table.add_row(*row)
    console.print(table)
    console.print(naive_line(r), soft_wrap=True, highlight=False)
    streams = new_table(None, STREAM_COLUMNS)
    for row in stream_rows(r):
        streams.add_row(*row)
    console.print(streams)


def print_multi_replay(mr: MultiReplay, console: Console) -> None:
    """Every rank's report; with several, the per-rank summary, the slowest rank and the stragglers."""
    for r in mr.reports:
        print_replay_report(r, console)
    if len(mr.reports) < 2:
        return
    table = new_table(f"{len(mr.reports)} ranks aligned on {mr.aligned_collectives} collectives",
                      ("rank", "measured step", "replayed step", "last to arrive", "median lag"))  # fmt: skip
    for r in mr.reports:
        rank = r.trace.rank
        mark = " (slowest)" if r is mr.slowest else ""
        lag_s = mr.median_lag_s.get(rank, 0.0)
        table.add_row(f"{rank}{mark}", fmt_seconds(r.measured.step_s), fmt_seconds(r.replayed.step_s),
                      str(mr.last_arrivals.get(rank, 0)), fmt_seconds(lag_s))  # fmt: skip
    console.print(table)

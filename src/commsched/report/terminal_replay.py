"""Terminal tables of ``commsched replay``: measured next to replayed, per rank and per stream."""

from __future__ import annotations

from rich.console import Console

from commsched.replay.run import MultiReplay, ReplayReport
from commsched.report.tables import new_table
from commsched.report.units import fmt_percent, fmt_seconds


def _signed(ratio: float) -> str:
    return ("+" if ratio >= 0 else "") + fmt_percent(ratio)


def print_replay_report(r: ReplayReport, console: Console) -> None:
    """One trace: step, exposed communication and overlap (measured, replayed), the naive estimates, streams."""
    m, p = r.measured, r.replayed
    rank = "" if r.trace.rank is None else f" (rank {r.trace.rank})"
    what = [s.text for s in r.scales]
    if r.hardware:
        what.insert(0, f"{r.recosted} collectives on {r.hardware}")
    title = f"{r.trace.path.name}{rank}: {r.trace.mode} trace, {len(r.trace)} items" + (
        f"; what-if: {', '.join(what)}" if what else ""
    )
    table = new_table(title, ("", "measured", "replayed", "replayed vs measured"))
    table.add_row("step (first work start to last work end)", fmt_seconds(m.step_s), fmt_seconds(p.step_s),
                  _signed(r.error))  # fmt: skip
    table.add_row("exposed communication", fmt_seconds(m.exposed_comm_s), fmt_seconds(p.exposed_comm_s), "")
    table.add_row("overlap ratio (HTA)", fmt_percent(m.overlap_ratio), fmt_percent(p.overlap_ratio), "")
    console.print(table)
    naive = []
    for label, value in (("sum of all work", r.sum_of_work_s), ("busiest stream", r.longest_stream_s)):
        err = (value - m.step_s) / m.step_s if m.step_s else 0.0
        naive.append(f"{label} {fmt_seconds(value)} ({_signed(err)})")
    console.print(f"naive estimates of the measured step: {', '.join(naive)}", soft_wrap=True, highlight=False)
    streams = new_table(None, ("stream", "busy measured", "busy replayed", "replayed utilisation"))
    for name, busy in m.stream_busy_s.items():
        after = p.stream_busy_s[name]
        streams.add_row(name, fmt_seconds(busy), fmt_seconds(after), fmt_percent(after / p.step_s if p.step_s else 0))
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

"""What a replay shows, as rows of text: the one source of the terminal's tables (``report/terminal_replay.py``)
and the HTML report's (``report/replay_html.py``), so both print the same numbers from the same
:class:`~commsched.replay.run.ReplayReport` as its JSON (``ReplayReport.to_dict``)."""

from __future__ import annotations

import numpy as np

from commsched.replay.run import ReplayReport
from commsched.replay.work import COMM, ROLES
from commsched.report.units import fmt_percent, fmt_seconds

SUMMARY_COLUMNS = ("", "measured", "replayed", "replayed vs measured")
STREAM_COLUMNS = ("stream", "busy measured", "busy replayed", "replayed utilisation")
CLASS_COLUMNS = ("class", "items", "busy measured", "busy replayed")


def signed(ratio: float) -> str:
    """A ratio as a signed percentage: ``+1.2 %``."""
    return ("+" if ratio >= 0 else "") + fmt_percent(ratio)


def title(r: ReplayReport) -> str:
    """The trace, its rank, what it holds (items, recorded collectives, communication items) and the what-ifs."""
    t = r.trace
    rank = "" if t.rank is None else f" (rank {t.rank})"
    what = [s.text for s in r.scales]
    if r.hardware:
        what.insert(0, f"{r.recosted} collectives on {r.hardware}")
    comm = int((t.role == COMM).sum())
    return f"{t.path.name}{rank}: {t.mode} trace, {len(t)} items, {len(t.collectives)} collectives, {comm} " + (
        "communication items" + (f"; what-if: {', '.join(what)}" if what else "")
    )


def summary_rows(r: ReplayReport) -> list[list[str]]:
    """Step, exposed communication and overlap ratio: measured, replayed, and the step's error."""
    m, p = r.measured, r.replayed
    return [
        ["step (first work start to last work end)", fmt_seconds(m.step_s), fmt_seconds(p.step_s), signed(r.error)],
        ["exposed communication", fmt_seconds(m.exposed_comm_s), fmt_seconds(p.exposed_comm_s), ""],
        ["overlap ratio (HTA)", fmt_percent(m.overlap_ratio), fmt_percent(p.overlap_ratio), ""],
    ]


def naive_line(r: ReplayReport) -> str:
    """The two naive estimates of the measured step and their errors."""
    step_s, naive = r.measured.step_s, []
    for label, value in (("sum of all work", r.sum_of_work_s), ("busiest stream", r.longest_stream_s)):
        naive.append(f"{label} {fmt_seconds(value)} ({signed((value - step_s) / step_s if step_s else 0.0)})")
    return f"naive estimates of the measured step: {', '.join(naive)}"


def stream_rows(r: ReplayReport) -> list[list[str]]:
    """Per device stream: busy time measured and replayed, and its share of the replayed step."""
    p = r.replayed
    return [
        [name, fmt_seconds(busy), fmt_seconds(p.stream_busy_s[name]),
         fmt_percent(p.stream_busy_s[name] / p.step_s if p.step_s else 0)]
        for name, busy in r.measured.stream_busy_s.items()
    ]  # fmt: skip


def class_rows(r: ReplayReport) -> list[list[str]]:
    """Per class of device work, as the replay classified it (compute, comm, memory): items and busy time."""
    t, dur = r.trace, r.sim.end_ns - r.sim.start_ns
    rows = []
    for role in np.unique(t.role[t.work]).tolist():
        mask = t.role == role
        rows.append([ROLES[role], str(int(mask.sum())), fmt_seconds(float(t.dur_ns[mask].sum()) * 1e-9),
                     fmt_seconds(float(dur[mask].sum()) * 1e-9)])  # fmt: skip
    return rows

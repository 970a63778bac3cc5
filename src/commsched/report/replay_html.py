"""The HTML report of one replayed trace (``commsched replay --html``): the replay's own result, the same
:class:`~commsched.replay.run.ReplayReport` the terminal and the JSON print, rendered with the same rows
(``report/replay_view.py``): measured next to replayed, the naive estimates, the work by the replay's own classes,
the most exposed communication, the streams, and a timeline of the measured and the replayed step on one axis.

A profiler trace records no memory: the page says so instead of drawing an empty curve."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

import numpy as np

from commsched.io import atomic_write_text
from commsched.replay.run import ReplayReport, Timing, exposed_per_item_ns
from commsched.replay.work import COMM, COMPUTE, MEMORY
from commsched.report import html_assets
from commsched.report.html import html_table, page_head, timeline_block
from commsched.report.replay_view import (
    CLASS_COLUMNS,
    STREAM_COLUMNS,
    SUMMARY_COLUMNS,
    class_rows,
    naive_line,
    stream_rows,
    summary_rows,
    title,
)
from commsched.report.timeline import BLOCKED, COLLECTIVE, OTHER
from commsched.report.timeline import COMPUTE as COMPUTE_BAR
from commsched.report.units import fmt_bytes, fmt_seconds

_BAR_OF_ROLE = {COMPUTE: COMPUTE_BAR, MEMORY: OTHER, COMM: COLLECTIVE}
_KINDS = {COMPUTE_BAR: "compute", OTHER: "memory copy / set", BLOCKED: "waiting", COLLECTIVE: "communication"}


def _order(
    r: ReplayReport, label: str, timing: Timing, start_ns: np.ndarray, end_ns: np.ndarray, names: dict[str, int]
) -> dict[str, Any]:
    """One timeline panel (the shape of ``report/timeline.py``'s orders) of ``timing``'s timeline: a lane per device
    stream, a bar per work item from the step's start, classed as the replay classified it; communication carries
    its exposed time."""
    t = r.trace
    work = np.flatnonzero(t.work)
    origin = int(start_ns[work].min()) if len(work) else 0
    lane_of = {s: k for k, s in enumerate(sorted(set(t.stream[work].tolist())))}
    exposed = exposed_per_item_ns(t, start_ns, end_ns)
    bars = [
        [lane_of[int(t.stream[i])], int(start_ns[i]) - origin, int(end_ns[i]) - origin,
         _BAR_OF_ROLE[int(t.role[i])], names.setdefault(t.names[i], len(names)), int(exposed[i])]
        for i in work.tolist()
    ]  # fmt: skip
    return {
        "label": label, "makespan_ns": round(timing.step_s * 1e9), "exposed_ns": round(timing.exposed_comm_s * 1e9),
        "peak_bytes": None, "lanes": [t.streams[s] for s in lane_of], "compute_lanes": len(lane_of), "bars": bars,
        "memory": [],
    }  # fmt: skip


def timeline_of(r: ReplayReport) -> dict[str, Any]:
    """The measured and the replayed step as two panels on one time axis (``report/timeline.py``'s shape)."""
    names: dict[str, int] = {}
    t, sim = r.trace, r.sim
    orders = [
        _order(r, "measured (the trace's timestamps)", r.measured, t.start_ns, t.start_ns + t.dur_ns, names),
        _order(r, "replayed", r.replayed, sim.start_ns, sim.end_ns, names),
    ]
    return {
        "axis_ns": max(o["makespan_ns"] for o in orders), "capacity_bytes": None, "comm_lanes": {},
        "names": list(names), "orders": orders, "kinds": [_KINDS[k] for k in sorted(_KINDS)],
    }  # fmt: skip


def _exposed_rows(r: ReplayReport, k: int) -> list[list[str]]:
    """The ``k`` communication items most exposed in the replay, with what the trace records of them."""
    t, sim = r.trace, r.sim
    exposed = exposed_per_item_ns(t, sim.start_ns, sim.end_ns)
    top = [i for i in np.argsort(-exposed, kind="stable")[:k].tolist() if exposed[i] > 0]
    rows = []
    for i in top:
        c = t.collectives.get(i)
        what = f"{c.kind} of {fmt_bytes(c.nbytes)} over {c.group_size} ranks" if c else "not recorded"
        rows.append([t.names[i], t.streams[t.stream[i]], what, fmt_seconds(int(sim.end_ns[i] - sim.start_ns[i]) * 1e-9),
                     fmt_seconds(int(exposed[i]) * 1e-9)])  # fmt: skip
    return rows


def render_replay_html(r: ReplayReport, *, context: dict[str, Any] | None = None) -> str:
    """The report of one replayed trace as one HTML string; ``context``: extra key/value lines for the header."""
    t = r.trace
    comm_items = int((t.role == COMM).sum())
    ctx = {"trace": str(t.path), **({"rank": t.rank} if t.rank is not None else {}), "items": len(t),
           "collectives": len(t.collectives), "communication items": comm_items, "memory": "not in the trace",
           **(context or {})}  # fmt: skip
    exposed = _exposed_rows(r, 15)
    swatches = [
        ("compute", html_assets.COLORS["compute"], ""),
        ("memory copy / set", html_assets.COLORS["other"], ""),
        ("communication", html_assets.COMM_COLORS[0], ""),
        ("exposed communication (no computation runs beside it)", "", "outline"),
    ]
    none = "<p>No communication item runs while no computation does.</p>" if comm_items else (
        "<p>No communication found in the trace (name its kernels with --comm-pattern).</p>"
    )  # fmt: skip
    parts = [
        *page_head(f"commsched replay: {t.path.name}", ctx),
        f'<section id="summary"><h2>{html.escape(title(r))}</h2>',
        html_table(list(SUMMARY_COLUMNS), summary_rows(r)),
        f'<p id="naive">{html.escape(naive_line(r))}</p></section>',
        *timeline_block(timeline_of(r), swatches, "the measured and the replayed step"),
        '<section id="classes"><h2>Work by class</h2>',
        html_table(list(CLASS_COLUMNS), class_rows(r)),
        "</section>",
        '<section id="exposed"><h2>Most exposed communication (replayed)</h2>',
        html_table(["item", "stream", "collective", "duration", "exposed"], exposed, numeric_from=3) if exposed
        else none,
        "</section>",
        '<section id="streams"><h2>Streams</h2>',
        html_table(list(STREAM_COLUMNS), stream_rows(r)),
        "</section></body></html>",
    ]  # fmt: skip
    return "\n".join(parts)


def write_replay_html(r: ReplayReport, path: str | Path, **kw: Any) -> Path:
    """Write :func:`render_replay_html` to ``path`` atomically; returns the path."""
    path = Path(path)
    atomic_write_text(path, render_replay_html(r, **kw))
    return path

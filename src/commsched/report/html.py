"""A self-contained HTML report of a simulated step: summary, Gantt chart with memory curve, top exposed
collectives, streams. Pictures are embedded as base64 PNG, so the file opens anywhere without other files."""

from __future__ import annotations

import base64
import html
from pathlib import Path
from typing import Any

from commsched.io import atomic_write_text
from commsched.report.gantt import gantt_png
from commsched.report.tables import EXPOSED_COLUMNS, STREAM_COLUMNS, comparison_rows, exposed_rows, stream_rows
from commsched.report.units import fmt_bytes, fmt_seconds
from commsched.sim.result import SimResult

_CSS = """
body { font-family: system-ui, -apple-system, Segoe UI, Helvetica, Arial, sans-serif; margin: 2rem; color: #222; }
h1 { font-size: 1.5rem; margin-bottom: 0.2rem; } h2 { font-size: 1.15rem; margin-top: 2rem; }
.sub { color: #666; margin-top: 0; }
.cards { display: flex; flex-wrap: wrap; gap: 0.8rem; }
.card { border: 1px solid #ddd; border-radius: 6px; padding: 0.6rem 1rem; min-width: 10rem; }
.card .v { font-size: 1.3rem; font-weight: 600; } .card .k { color: #666; font-size: 0.85rem; }
table { border-collapse: collapse; margin-top: 0.5rem; }
th, td { padding: 0.25rem 0.8rem; border-bottom: 1px solid #eee; }
th { text-align: left; background: #f6f6f6; } td.n { text-align: right; font-variant-numeric: tabular-nums; }
img { max-width: 100%; border: 1px solid #eee; }
.warn { color: #8a1c1c; background: #fdecea; border-left: 4px solid #d62728; padding: 0.4rem 0.8rem; }
"""


def _table(headers: list[str], rows: list[list[Any]], numeric_from: int = 1) -> str:
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>"
        + "".join(f'<td class="{"n" if i >= numeric_from else ""}">{html.escape(str(v))}</td>' for i, v in enumerate(r))
        + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def _page_head(title: str, context: dict[str, Any]) -> list[str]:
    """The document's start: its title and a line of ``context`` (key: value) under the heading."""
    sub = " · ".join(f"{html.escape(str(k))}: {html.escape(str(v))}" for k, v in context.items())
    return [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{_CSS}</style></head><body>",
        f'<h1>{html.escape(title)}</h1><p class="sub">{sub}</p>',
    ]


def _warnings(lines: list[str] | tuple[str, ...]) -> list[str]:
    """Warnings (a step that does not fit, padding) right under the heading, where they are seen first."""
    if not lines:
        return []
    items = "".join(f'<p class="warn">warning: {html.escape(line)}</p>' for line in lines)
    return [f'<section id="warnings">{items}</section>']


def _exposed_table(res: SimResult, k: int) -> str:
    rows = exposed_rows(res, k)
    if not rows:
        return "<p>None: all communication is hidden behind computation.</p>"
    return _table(list(EXPOSED_COLUMNS), rows, numeric_from=3)


def render_html(
    res: SimResult,
    *,
    title: str | None = None,
    context: dict[str, Any] | None = None,
    capacity_bytes: float | None = None,
    warnings: tuple[str, ...] | list[str] = (),
) -> str:
    """The report as one HTML string. ``context``: extra key/value lines for the header (hardware, world size...);
    ``capacity_bytes``: the device's HBM, a line on the memory plot; ``warnings``: lines shown under the title."""
    g = res.graph
    title = title or f"commsched: {g.meta.get('workload', 'simulated step')}"
    png = base64.b64encode(gantt_png(res, capacity_bytes=capacity_bytes)).decode("ascii")
    cards = [
        ("step time", fmt_seconds(res.makespan_s)),
        ("lower bound", fmt_seconds(res.lower_bound_s)),
        ("makespan / bound", f"{res.bound_ratio:.3f}"),
        ("exposed comm", fmt_seconds(res.exposed_comm_s)),
        ("overlap (HTA)", f"{100 * res.overlap_ratio:.1f} %"),
        ("peak memory", fmt_bytes(res.peak_memory_bytes)),
    ]
    cards_html = "".join(
        f'<div class="card"><div class="v">{html.escape(v)}</div><div class="k">{html.escape(k)}</div></div>'
        for k, v in cards
    )
    ctx = {"nodes": len(g), "collectives": len(g.collectives), "binding bound": res.bound.binding, **(context or {})}
    b = res.bound
    bounds = [
        ["busiest compute stream", fmt_seconds(b.compute_s)],
        ["critical path", fmt_seconds(b.critical_path_s)],
        ["compute + interference", fmt_seconds(b.interference_s)],
    ]
    bounds += [[f"comm on {k}", fmt_seconds(v)] for k, v in b.comm_s.items()]
    parts = [
        *_page_head(title, ctx),
        *_warnings(warnings),
        f'<section id="summary"><h2>Summary</h2><div class="cards">{cards_html}</div></section>',
        '<section id="gantt"><h2>Timeline and memory</h2>',
        f'<img alt="Gantt chart of the streams above the memory curve" src="data:image/png;base64,{png}"></section>',
        '<section id="exposed"><h2>Top exposed collectives</h2>',
        _exposed_table(res, 15),
        "</section>",
        '<section id="streams"><h2>Streams</h2>',
        _table(list(STREAM_COLUMNS), stream_rows(res)),
        "</section>",
        '<section id="bounds"><h2>Lower bound terms</h2>',
        _table(["term", "time"], bounds),
        "</section></body></html>",
    ]
    return "\n".join(parts)


def write_html(res: SimResult, path: str | Path, **kw: Any) -> Path:
    """Write :func:`render_html` to ``path`` atomically; returns the path."""
    path = Path(path)
    atomic_write_text(path, render_html(res, **kw))
    return path


def render_comparison_html(
    results: list[tuple[str, SimResult]],
    *,
    title: str | None = None,
    context: dict[str, Any] | None = None,
    capacity_bytes: float | None = None,
    warnings: tuple[str, ...] | list[str] = (),
) -> str:
    """One report for several orders of the same graph (e.g. the input order and the scheduled one): a comparison
    table first, then each order's timeline and most exposed collectives (``capacity_bytes`` and ``warnings`` as
    in :func:`render_html`)."""
    if not results:
        raise ValueError("render_comparison_html needs at least one (label, SimResult)")
    g = results[0][1].graph
    title = title or f"commsched: {g.meta.get('workload', 'simulated step')}"
    first = results[0][1]
    rows = comparison_rows(results, bound=lambda r: f"{r.bound_ratio:.3f}")
    ctx = {
        "nodes": len(g),
        "collectives": len(g.collectives),
        "lower bound": fmt_seconds(first.lower_bound_s),
        "binding bound": first.bound.binding,
        **(context or {}),
    }
    parts = [
        *_page_head(title, ctx),
        *_warnings(warnings),
        '<section id="comparison"><h2>Orders compared</h2>',
        _table(
            ["order", "step time", "speedup", "makespan / bound", "exposed comm", "overlap (HTA)", "peak memory"], rows
        ),
        "</section>",
    ]
    for k, (label, r) in enumerate(results):
        png = base64.b64encode(gantt_png(r, title=label, capacity_bytes=capacity_bytes)).decode("ascii")
        parts += [
            f'<section id="order-{k}"><h2>{html.escape(label)}: timeline and memory</h2>',
            f'<img alt="Gantt chart of {html.escape(label)}" src="data:image/png;base64,{png}">',
            "<h3>Top exposed collectives</h3>",
            _exposed_table(r, 10),
            "</section>",
        ]
    parts.append("</body></html>")
    return "\n".join(parts)


def write_comparison_html(results: list[tuple[str, SimResult]], path: str | Path, **kw: Any) -> Path:
    """Write :func:`render_comparison_html` to ``path`` atomically; returns the path."""
    path = Path(path)
    atomic_write_text(path, render_comparison_html(results, **kw))
    return path

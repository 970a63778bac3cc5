"""A self-contained HTML report of a simulated step, or of several orders of one step: summary with MFU and
tokens/s, an interactive timeline (one panel per order on a shared, zoomable time axis: compute, each process
group's collectives, exposed communication in red, the memory curve with the HBM capacity), what the schedule
moved and why each collective still exposed stays exposed (``report/why.py``), streams and bounds. Script and
style are inline (``report/html_assets.py``), so the file opens anywhere with no network."""

from __future__ import annotations

import html
import json
from pathlib import Path
from typing import TYPE_CHECKING, Any, TypedDict, Unpack

from commsched.io import atomic_write_text
from commsched.report import html_assets
from commsched.report.rates import fmt_mfu, fmt_rate, step_rates
from commsched.report.tables import STREAM_COLUMNS, comparison_rows, stream_rows
from commsched.report.timeline import timeline_data, timeline_json
from commsched.report.units import fmt_bytes, fmt_seconds
from commsched.report.why import collective_facts, what_moved
from commsched.sim.result import SimResult

if TYPE_CHECKING:
    from commsched.hardware import Hardware


def html_table(headers: list[str], rows: list[list[Any]], numeric_from: int = 1, *, text: tuple[str, ...] = ()) -> str:
    """A table of ``rows`` under ``headers``, cells escaped. Columns from ``numeric_from`` on are right-aligned
    numbers, except those named in ``text`` (the last one named "why" wraps as prose)."""
    classes = ["why" if h == "why" else "" if i < numeric_from or h in text else "n" for i, h in enumerate(headers)]
    head = "".join(f"<th>{html.escape(h)}</th>" for h in headers)
    body = "".join(
        "<tr>" + "".join(f'<td class="{classes[i]}">{html.escape(str(v))}</td>' for i, v in enumerate(r)) + "</tr>"
        for r in rows
    )
    return f"<table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table>"


def page_head(title: str, context: dict[str, Any]) -> list[str]:
    """The document's start: its title and a line of ``context`` (key: value) under the heading."""
    sub = " · ".join(f"{html.escape(str(k))}: {html.escape(str(v))}" for k, v in context.items())
    return [
        "<!DOCTYPE html>",
        '<html lang="en"><head><meta charset="utf-8">',
        f"<title>{html.escape(title)}</title><style>{html_assets.CSS}</style></head><body>",
        f'<h1>{html.escape(title)}</h1><p class="sub">{sub}</p>',
    ]


def _warnings(lines: list[str] | tuple[str, ...]) -> list[str]:
    """Warnings (a step that does not fit, padding) right under the heading, where they are seen first."""
    if not lines:
        return []
    items = "".join(f'<p class="warn">warning: {html.escape(line)}</p>' for line in lines)
    return [f'<section id="warnings">{items}</section>']


def _timeline_section(results: list[tuple[str, SimResult]], capacity_bytes: float | None) -> list[str]:
    """The interactive timeline of simulated orders: compute, other kernels, exposed waits, each process group's
    collectives, the memory curve and the HBM line."""
    data = timeline_data(results, capacity_bytes=capacity_bytes)
    swatches = [
        ("compute kernel", html_assets.COLORS["compute"], ""),
        ("other kernel", html_assets.COLORS["other"], ""),
        ("waiting on communication (exposed)", html_assets.COLORS["blocked"], ""),
    ]
    if data["recompute"]:
        swatches.append(("recomputed kernel (activation checkpointing)", html_assets.COLORS["recompute"], ""))
    for lane, k in data["comm_lanes"].items():
        swatches.append((f"collective on {lane}", html_assets.COMM_COLORS[k % len(html_assets.COMM_COLORS)], ""))
    swatches += [("exposed collective", "", "outline"), ("memory", html_assets.COLORS["memory"], "")]
    if capacity_bytes:
        peak = max(r.peak_memory_bytes for _, r in results)
        share = f"{100 * peak / capacity_bytes:.0f} %"
        scale = "" if capacity_bytes <= 2 * peak else f": off the scale, the peak uses {share}"
        swatches.append((f"HBM capacity ({fmt_bytes(capacity_bytes)}{scale})", "", "line"))
    shared = "one time axis for every order" if len(results) > 1 else "the step"
    return timeline_block(data, swatches, shared)


def timeline_block(data: dict[str, Any], swatches: list[tuple[str, str, str]], shared: str) -> list[str]:
    """The interactive timeline of ``data`` (:func:`commsched.report.timeline.timeline_data`'s shape): a legend of
    ``swatches`` (label, colour, css class) above (never over) the bars, zoom buttons, one panel per order on one
    shared time axis (``shared`` says what it spans), and the data and script that draw it."""
    colors = {**html_assets.COLORS, "comm": list(html_assets.COMM_COLORS)}
    legend = "".join(
        f'<span><i class="{cls}"{f" style=background:{color}" if color else ""}></i>{html.escape(label)}</span>'
        for label, color, cls in swatches
    )
    return [
        '<section id="timeline"><h2>Timeline</h2>',
        f'<div class="legend" id="legend">{legend}</div>',
        '<div class="tools"><button id="zoom-in" type="button">zoom in</button>'
        '<button id="zoom-out" type="button">zoom out</button><button id="zoom-reset" type="button">reset</button>'
        f'<span id="zoom-level"></span><span>({shared}; wheel: zoom, drag: pan, double click: reset)</span></div>',
        '<div id="timeline-panels"></div><div id="tip"></div>',
        f'<script type="application/json" id="timeline-data">{timeline_json(data)}</script>',
        f'<script type="application/json" id="timeline-colors">{json.dumps(colors)}</script>',
        f"<script>{html_assets.JS}</script></section>",
    ]


def _exposed_table(res: SimResult, k: int, budget_bytes: float | None = None) -> str:
    """The ``k`` most exposed collectives with why each stayed exposed (``report/why.py``)."""
    facts = sorted((f for f in collective_facts(res, memory_budget_bytes=budget_bytes) if f.exposed_ns > 0),
                   key=lambda f: -f.exposed_ns)[:k]  # fmt: skip
    if not facts:
        return "<p>None: all communication is hidden behind computation.</p>"
    rows = [
        [f.name, f.type, f.group, fmt_bytes(f.nbytes), _ns(f.duration_ns), _ns(f.exposed_ns), f.reason, f.why]
        for f in facts
    ]
    headers = ["collective", "type", "group", "bytes", "duration", "exposed", "reason", "why"]
    return html_table(headers, rows, numeric_from=3, text=("reason",))


def _ns(ns: int) -> str:
    return fmt_seconds(ns * 1e-9)


def _moved_section(before: SimResult, after: SimResult, label: str, budget_bytes: float | None, k: int = 40) -> str:
    """What ``after`` changed against ``before``: counts by status, then the ``k`` collectives most exposed."""
    rows = what_moved(before, after, memory_budget_bytes=budget_bytes)
    counts: dict[str, int] = {}
    for r in rows:
        counts[r.status] = counts.get(r.status, 0) + 1
    summary = ", ".join(f"{n} {status}" for status, n in sorted(counts.items(), key=lambda kv: -kv[1]))
    body = [
        [r.name, r.type, r.group, fmt_bytes(r.nbytes), _ns(r.exposed_before_ns), _ns(r.exposed_after_ns),
         _ns(r.issue_shift_ns), r.status, r.reason, r.why if r.exposed_after_ns > 0 else ""]
        for r in rows[:k]
    ]  # fmt: skip
    headers = ["collective", "type", "group", "bytes", "exposed before", "exposed after", "issue moved", "status",
               "reason", "why"]  # fmt: skip
    more = f"<p>... and {len(rows) - k} more, all less exposed.</p>" if len(rows) > k else ""
    return (
        f'<section class="moved" id="moved-{html.escape(label)}"><h3>{html.escape(label)} against the first order: '
        f"{html.escape(summary)}</h3>{html_table(headers, body, numeric_from=3, text=('status', 'reason'))}{more}"
        "</section>"
    )


def _title(g: Any, options: ReportOptions) -> str:
    return options.get("title") or f"commsched: {g.meta.get('workload', 'simulated step')}"


def _capacity(options: ReportOptions) -> float | None:
    """The memory line of the report: ``capacity_bytes``, else the hardware's HBM where known."""
    capacity_bytes, hardware = options.get("capacity_bytes"), options.get("hardware")
    if capacity_bytes is None and hardware is not None and hardware.compute.hbm_capacity_bytes > 0:
        return float(hardware.compute.hbm_capacity_bytes)
    return capacity_bytes


class ReportOptions(TypedDict, total=False):
    """What every HTML report of simulated orders takes besides them. ``title`` (default: the graph's workload);
    ``context``: extra key/value lines for the header (hardware, world size...); ``capacity_bytes``: the device's
    HBM, a line on the memory curve (default: ``hardware``'s); ``warnings``: lines shown under the title;
    ``hardware``: its peak FLOP/s gives MFU; ``memory_budget_bytes``: the cap the order was scheduled under, named
    where an earlier issue would pass it."""

    title: str | None
    context: dict[str, Any] | None
    capacity_bytes: float | None
    warnings: tuple[str, ...] | list[str]
    hardware: Hardware | None
    memory_budget_bytes: float | None


def render_html(res: SimResult, **options: Unpack[ReportOptions]) -> str:
    """The report of one simulated order as one HTML string (``options``: :class:`ReportOptions`)."""
    g = res.graph
    title, capacity_bytes, hardware = _title(g, options), _capacity(options), options.get("hardware")
    context, warnings = options.get("context"), options.get("warnings", ())
    memory_budget_bytes = options.get("memory_budget_bytes")
    rates = step_rates(res, hardware)
    cards = [
        ("step time", fmt_seconds(res.makespan_s)),
        ("lower bound", fmt_seconds(res.lower_bound_s)),
        ("makespan / bound", f"{res.bound_ratio:.3f}"),
        ("exposed comm", fmt_seconds(res.exposed_comm_s)),
        ("overlap (HTA)", f"{100 * res.overlap_ratio:.1f} %"),
        ("peak memory", fmt_bytes(res.peak_memory_bytes)),
        (rates.mfu_label, fmt_mfu(rates.mfu)),
        ("tokens / s", fmt_rate(rates.tokens_per_s)),
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
        *page_head(title, ctx),
        *_warnings(warnings),
        f'<section id="summary"><h2>Summary</h2><div class="cards">{cards_html}</div></section>',
        *_timeline_section([("simulated step", res)], capacity_bytes),
        '<section id="exposed"><h2>Top exposed collectives, and why</h2>',
        _exposed_table(res, 15, memory_budget_bytes),
        "</section>",
        '<section id="streams"><h2>Streams</h2>',
        html_table(list(STREAM_COLUMNS), stream_rows(res)),
        "</section>",
        '<section id="bounds"><h2>Lower bound terms</h2>',
        html_table(["term", "time"], bounds),
        "</section></body></html>",
    ]
    return "\n".join(parts)


def write_html(res: SimResult, path: str | Path, **kw: Any) -> Path:
    """Write :func:`render_html` to ``path`` atomically; returns the path."""
    path = Path(path)
    atomic_write_text(path, render_html(res, **kw))
    return path


def render_comparison_html(results: list[tuple[str, SimResult]], **options: Unpack[ReportOptions]) -> str:
    """One report for several orders of the same graph (e.g. the input order and the scheduled ones): a table with
    each order's step, MFU and tokens/s, every order's timeline on one shared time axis, then what each later order
    moved against the first and why what stays exposed does (``options``: :class:`ReportOptions`)."""
    if not results:
        raise ValueError("render_comparison_html needs at least one (label, SimResult)")
    g = results[0][1].graph
    title, capacity_bytes, hardware = _title(g, options), _capacity(options), options.get("hardware")
    context, warnings = options.get("context"), options.get("warnings", ())
    memory_budget_bytes = options.get("memory_budget_bytes")
    first = results[0][1]
    rows = comparison_rows(results, bound=lambda r: f"{r.bound_ratio:.3f}")
    for row, (_, r) in zip(rows, results, strict=True):
        rates = step_rates(r, hardware)
        row += [fmt_mfu(rates.mfu), fmt_rate(rates.tokens_per_s)]
    ctx = {
        "nodes": len(g),
        "collectives": len(g.collectives),
        "lower bound": fmt_seconds(first.lower_bound_s),
        "binding bound": first.bound.binding,
        **(context or {}),
    }
    headers = ["order", "step time", "speedup", "makespan / bound", "exposed comm", "overlap (HTA)", "peak memory",
               step_rates(first).mfu_label, "tokens / s"]  # fmt: skip
    parts = [
        *page_head(title, ctx),
        *_warnings(warnings),
        '<section id="comparison"><h2>Orders compared</h2>',
        html_table(headers, rows),
        "</section>",
        *_timeline_section(results, capacity_bytes),
    ]
    if len(results) > 1:
        parts.append('<section id="what-moved"><h2>What moved, and why the rest stays exposed</h2>')
        parts += [_moved_section(first, r, label, memory_budget_bytes) for label, r in results[1:]]
        parts.append("</section>")
    parts += ['<section id="exposed"><h2>First order: top exposed collectives, and why</h2>',
              _exposed_table(first, 10, memory_budget_bytes), "</section>", "</body></html>"]  # fmt: skip
    return "\n".join(parts)


def write_comparison_html(results: list[tuple[str, SimResult]], path: str | Path, **kw: Any) -> Path:
    """Write :func:`render_comparison_html` to ``path`` atomically; returns the path."""
    path = Path(path)
    atomic_write_text(path, render_comparison_html(results, **kw))
    return path


def render_optimize_html(
    o: Any,
    refs: Any,
    *,
    title: str | None = None,
    context: dict[str, Any] | None = None,
    warnings: tuple[str, ...] | list[str] = (),
    hardware: Hardware | None = None,
) -> str:
    """``optimize``'s report: first, in plain words, what bounds the kept step and what would move it, and the
    headline against the framework and torch's best; then every step side by side (the kept one, the framework's,
    torch's configurations, the traced order) with MFU and tokens/s, their timelines on one time axis, the kept
    step's exposed collectives and why, and every variant the search tried with its verdict. ``o``: an
    ``Optimized``; ``refs``: its ``References``."""
    from commsched.report.bound_text import what_bounds_the_step, what_would_move_it
    from commsched.report.optimize_report import headline, step_rows

    kept = o.after
    g = kept.graph
    title = title or f"commsched optimize: {g.meta.get('workload', 'step')}"
    rows = step_rows(o, refs)
    table_rows = []
    for r in rows:
        if r.sim is None:
            table_rows.append([r.label, "-", "-", "-", "-", "-", "-", "-", "-", r.note])
            continue
        s, rates = r.sim, step_rates(r.sim, hardware)
        rel = s.makespan_s / kept.makespan_s if kept.makespan_s > 0 else 1.0
        table_rows.append([r.label, fmt_seconds(s.makespan_s), f"{rel:.3f}x", fmt_seconds(s.exposed_comm_s),
                           f"{100 * s.overlap_ratio:.1f} %", fmt_bytes(s.peak_memory_bytes), fmt_mfu(rates.mfu),
                           fmt_rate(rates.tokens_per_s), str(len(s.graph.collectives)), r.note])  # fmt: skip
    dtype = step_rates(kept).dtype
    headers = ["step", "time", "vs optimize", "exposed comm", "overlap (HTA)", "peak memory", f"MFU ({dtype})",
               "tokens / s", "collectives", "note"]  # fmt: skip
    verdicts = [[t.label, "-" if t.collectives is None else str(t.collectives),
                 "-" if t.makespan_s is None else fmt_seconds(t.makespan_s),
                 "-" if t.peak_memory_bytes is None else fmt_bytes(t.peak_memory_bytes), t.verdict]
                for t in o.tried]  # fmt: skip
    ctx = {"nodes": len(g), "collectives": len(g.collectives), "memory budget": fmt_bytes(o.budget_bytes),
           **(context or {})}  # fmt: skip
    lead = [what_bounds_the_step(kept, hardware), what_would_move_it(kept, hardware), headline(o, refs)]
    timelines = [(r.label, r.sim) for r in rows if r.sim is not None]
    parts = [
        *page_head(title, ctx),
        '<section id="answer">' + "".join(f'<p class="lead">{html.escape(line)}</p>' for line in lead) + "</section>",
        *_warnings(warnings),
        '<section id="comparison"><h2>The kept step against what runs today</h2>',
        html_table(headers, table_rows, text=("note",)),
        "</section>",
        *_timeline_section(timelines, _capacity({"hardware": hardware})),
        '<section id="exposed"><h2>Kept step: top exposed collectives, and why</h2>',
        _exposed_table(kept, 15, o.budget_bytes),
        "</section>",
        '<section id="variants"><h2>Every variant tried, and its verdict</h2>',
        html_table(["variant", "collectives", "step time", "peak memory", "verdict"], verdicts, text=("verdict",)),
        "</section></body></html>",
    ]
    return "\n".join(parts)


def write_optimize_html(o: Any, refs: Any, path: str | Path, **kw: Any) -> Path:
    """Write :func:`render_optimize_html` to ``path`` atomically; returns the path."""
    path = Path(path)
    atomic_write_text(path, render_optimize_html(o, refs, **kw))
    return path

"""The HTML report of a simulated pipeline step (``commsched pipeline --html``): the step, bubble, rates and memory
as cards, the per-rank table, and the interactive timeline of ``report/html.py`` with one panel per pipeline rank
(its lanes from ``report/pipeline_view.py``: compute, send, recv, FSDP all_gather and reduce_scatter), every action
labelled with its micro-batch and stage. Self-contained, as every report of ``report/html.py``."""

from __future__ import annotations

import html
from pathlib import Path
from typing import Any

from commsched.io import atomic_write_text
from commsched.pipeline.actions import ActionKind
from commsched.pipeline.simulate import PipelineResult
from commsched.report import html_assets
from commsched.report.html import html_table, page_head, timeline_block
from commsched.report.pipeline_view import (
    COMPUTE_LANE,
    LANES,
    RANK_COLUMNS,
    rank_lanes,
    rank_rows,
    rank_spans,
    schedule_title,
)
from commsched.report.rates import fmt_mfu, fmt_rate
from commsched.report.timeline import COLLECTIVE, OTHER
from commsched.report.timeline import COMPUTE as COMPUTE_BAR
from commsched.report.units import fmt_bytes, fmt_seconds

_KINDS = ["forward", "backward (B, I or W)", "waiting", "transfer / FSDP collective"]
"""the tooltip's name of each bar class (``report/timeline.py``'s classes, in their order)"""


def _bar_class(kind: ActionKind, lane: int) -> int:
    if lane != COMPUTE_LANE:
        return COLLECTIVE
    return COMPUTE_BAR if kind in (ActionKind.FORWARD, ActionKind.OVERLAP_F_B) else OTHER


def pipeline_timeline(result: PipelineResult) -> dict[str, Any]:
    """One timeline panel per pipeline rank on the step's time axis (``report/timeline.py``'s shape): a bar per
    timed action, named by its label; the panel's exposed time is the rank's exposed communication, its peak the
    rank's peak memory (the curve over time is not drawn)."""
    names: dict[str, int] = {}
    step_ns = round(result.step_s * 1e9)
    orders = []
    for rank, stats in enumerate(result.per_rank):
        spans = rank_spans(result, rank)
        lanes = rank_lanes(spans)
        at = {lane: k for k, lane in enumerate(lanes)}
        bars = [[at[s.lane], s.start_ns, s.end_ns, _bar_class(s.kind, s.lane), names.setdefault(s.label, len(names)), 0]
                for s in spans]  # fmt: skip
        orders.append({"label": f"rank {rank}", "makespan_ns": step_ns,
                       "exposed_ns": round(stats.exposed_comm_s * 1e9), "peak_bytes": stats.peak_memory_bytes,
                       "lanes": [LANES[lane] for lane in lanes], "compute_lanes": 1, "bars": bars,
                       "memory": []})  # fmt: skip
    comm_lanes = {name: k for k, name in enumerate(LANES[1:])}
    return {"axis_ns": step_ns, "capacity_bytes": None, "comm_lanes": comm_lanes, "names": list(names),
            "orders": orders, "kinds": _KINDS}  # fmt: skip


def _cards(result: PipelineResult, step: Any) -> str:
    worst = max(result.per_rank, key=lambda r: r.exposed_comm_s)
    cards = [("step time", fmt_seconds(result.step_s)),
             ("bubble (mean over ranks)", f"{100 * result.bubble_fraction:.1f} %"),
             ("exposed comm (worst rank)", fmt_seconds(worst.exposed_comm_s)),
             ("peak memory (worst rank)", fmt_bytes(result.peak_memory_bytes))]  # fmt: skip
    if step is not None:
        cards += [("tokens / s per GPU", fmt_rate(step.tokens_per_s_per_gpu)), ("MFU", fmt_mfu(step.mfu))]
    return "".join(f'<div class="card"><div class="v">{html.escape(v)}</div><div class="k">{html.escape(k)}</div></div>'
                   for k, v in cards)  # fmt: skip


def render_pipeline_html(result: PipelineResult, *, step: Any = None, title: str | None = None,
                         context: dict[str, Any] | None = None) -> str:  # fmt: skip
    """The report of one simulated pipeline step as one HTML string. ``step``: the
    :class:`commsched.pipeline.job.PipelineStep` it came from (its rates, stages' layers and hardware), if any;
    ``context``: extra key/value lines for the header."""
    stages = step.job.stages if step is not None else None
    ctx = {"schedule": schedule_title(result), "stages": result.program.num_stages,
           **({"hardware": step.hardware.name} if step is not None else {}), **(context or {})}  # fmt: skip
    swatches = [("forward (F, or an F + B pair)", html_assets.COLORS["compute"], ""),
                ("backward (B, I, W)", html_assets.COLORS["other"], "")]  # fmt: skip
    comm = html_assets.COMM_COLORS
    swatches += [(f"{lane} (transfer time)" if lane in ("send", "recv") else lane, comm[k % len(comm)], "")
                 for k, lane in enumerate(LANES[1:])]  # fmt: skip
    parts = [
        *page_head(title or f"commsched pipeline: {schedule_title(result)}", ctx),
        f'<section id="summary"><h2>Summary</h2><div class="cards">{_cards(result, step)}</div></section>',
        '<section id="ranks"><h2>Pipeline ranks</h2>',
        html_table(list(RANK_COLUMNS), rank_rows(result, stages), numeric_from=3),
        "</section>",
        *timeline_block(pipeline_timeline(result), swatches, "one panel per pipeline rank, one time axis"),
        "</body></html>",
    ]
    return "\n".join(parts)


def write_pipeline_html(result: PipelineResult, path: str | Path, **kw: Any) -> Path:
    """Write :func:`render_pipeline_html` to ``path`` atomically; returns the path."""
    return atomic_write_text(Path(path), render_pipeline_html(result, **kw))

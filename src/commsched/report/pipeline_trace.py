"""A simulated pipeline step as Chrome trace event JSON, for Perfetto (ui.perfetto.dev) or chrome://tracing.

One process per pipeline rank (pid = the rank, named with its stages, busy and bubble time), one track per lane
(``report/pipeline_view.py``: compute, send, recv, FSDP all_gather, FSDP reduce_scatter) with the thread ids of
``report/trace.py`` (compute from 7, communication from 20). Each timed action is a complete event (``ph: "X"``)
named by its micro-batch and stage (``F3 s1``, ``SEND_F 3 s1``); its ``args`` carry the stage, the micro-batch and
torch's name of the action (``1F3``). A flow arrow runs from each transfer's SEND to its RECV. Timestamps are
microseconds with nanosecond decimals (``trace.ns_to_us``); the step's numbers sit under ``commsched``."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from commsched.io import atomic_write_text
from commsched.pipeline.simulate import PipelineResult
from commsched.report.pipeline_view import (
    COMPUTE_LANE,
    LANES,
    ActionSpan,
    rank_lanes,
    rank_spans,
    schedule_title,
    transfer_pairs,
)
from commsched.report.trace import COMM_TID0, COMPUTE_TID0, ns_to_us


def lane_tid(lane: int) -> int:
    """The trace thread id of a lane: the compute stream at Kineto's 7, the others from 20."""
    return COMPUTE_TID0 if lane == COMPUTE_LANE else COMM_TID0 + lane - 1


def _rank_metadata(result: PipelineResult, rank: int, lanes: list[int]) -> list[dict[str, Any]]:
    stats = result.per_rank[rank]
    stages = [s for s, r in enumerate(result.program.stage_to_rank.tolist()) if r == rank]
    name = f"pipeline rank {rank} (stage{'s' if len(stages) > 1 else ''} {', '.join(map(str, stages))})"
    labels = f"busy {stats.busy_s * 1e3:.3f} ms, bubble {stats.bubble_s * 1e3:.3f} ms"
    events = [
        {"ph": "M", "name": "process_name", "pid": rank, "tid": 0, "args": {"name": name}},
        {"ph": "M", "name": "process_labels", "pid": rank, "tid": 0, "args": {"labels": labels}},
        {"ph": "M", "name": "process_sort_index", "pid": rank, "tid": 0, "args": {"sort_index": rank}},
    ]
    for lane in lanes:
        tid = lane_tid(lane)
        events.append({"ph": "M", "name": "thread_name", "pid": rank, "tid": tid,
                       "args": {"name": f"stream {tid} {LANES[lane]}"}})  # fmt: skip
        events.append({"ph": "M", "name": "thread_sort_index", "pid": rank, "tid": tid, "args": {"sort_index": tid}})
    return events


def _span_event(result: PipelineResult, span: ActionSpan) -> dict[str, Any]:
    args = {"stage": span.stage, "microbatch": span.microbatch, "action": result.program.action_str(span.rank,
            span.index), "stream": lane_tid(span.lane), "device": span.rank}  # fmt: skip
    return {"ph": "X", "cat": "kernel" if span.lane == COMPUTE_LANE else "comm", "name": span.label,
            "pid": span.rank, "tid": lane_tid(span.lane), "ts": ns_to_us(span.start_ns),
            "dur": ns_to_us(span.end_ns - span.start_ns), "args": args}  # fmt: skip


def _flows(result: PipelineResult) -> list[dict[str, Any]]:
    """A flow from each transfer's SEND (sender's send lane) to its RECV (receiver's recv lane)."""
    events = []
    for k, (send, recv) in enumerate(transfer_pairs(result)):
        common = {"cat": "p2p", "name": "send -> recv", "id": k}
        events.append({**common, "ph": "s", "pid": send.rank, "tid": lane_tid(send.lane),
                       "ts": ns_to_us(send.start_ns)})  # fmt: skip
        events.append({**common, "ph": "f", "bp": "e", "pid": recv.rank, "tid": lane_tid(recv.lane),
                       "ts": ns_to_us(recv.start_ns)})  # fmt: skip
    return events


def to_pipeline_trace(result: PipelineResult, *, summary: dict[str, Any] | None = None) -> dict[str, Any]:
    """The trace as a JSON-able dict (see the module docstring); ``summary``: the step's numbers to carry under
    ``commsched`` (default: ``result.as_dict()``)."""
    events: list[dict[str, Any]] = []
    for rank in range(result.program.pp_size):
        spans = rank_spans(result, rank)
        events += _rank_metadata(result, rank, rank_lanes(spans))
        events += [_span_event(result, s) for s in spans]
    events += _flows(result)
    return {
        "schemaVersion": 1,
        "displayTimeUnit": "ns",
        "baseTimeNanoseconds": 0,
        "traceName": f"commsched pipeline simulation: {schedule_title(result)}",
        "commsched": summary if summary is not None else result.as_dict(),
        "traceEvents": events,
    }


def write_pipeline_trace(result: PipelineResult, path: str | Path, **kw: Any) -> Path:
    """Write :func:`to_pipeline_trace` to ``path`` atomically; returns the path."""
    text = json.dumps(to_pipeline_trace(result, **kw), separators=(",", ":"), allow_nan=False)
    return atomic_write_text(Path(path), text)

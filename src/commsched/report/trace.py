"""A simulated step as Chrome trace event JSON, shaped like a PyTorch profiler (Kineto) trace.

Open it in Perfetto (ui.perfetto.dev) or chrome://tracing, or feed it to Holistic Trace Analysis. Layout:

* process ``GPU 0`` (pid 0): one track per stream, named like Kineto's (``stream 7 compute:0``, ``stream 20 comm:dp``).
  Kernels and collectives are ``cat: "kernel"`` complete events whose ``args`` carry ``stream``, ``device``,
  ``correlation`` and ``External id``, as Kineto writes them. Collective kernels are named ``ncclDevKernel_<Type>``
  (the names NCCL gives them, which tools use to tell communication from computation).
* A wait is a ``gpu_user_annotation`` slice on its compute stream lasting as long as it blocked (no ``stream`` arg,
  so it is not counted as a kernel); a flow arrow runs forward in time from each collective (its last instant) to
  each of its waits (inside the wait's slice), as Perfetto and HTA draw producer -> consumer.
* A ``Memory`` counter track (``ph: "C"``) follows the memory model's curve: the value while each node runs from its
  start, the value after its frees from its end.
* Top level: ``schemaVersion``, ``deviceProperties``, ``distributedInfo`` (rank 0), ``baseTimeNanoseconds``;
  timestamps are microseconds with nanosecond decimals, as Kineto writes them.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from commsched.io import atomic_write_text
from commsched.ir.graph import CollType, OpKind
from commsched.sim.result import SimResult

GPU_PID = 0
HOST_PID = 1
COMPUTE_TID0 = 7  # Kineto's default stream id
COMM_TID0 = 20
_NCCL_NAMES = {
    CollType.ALL_REDUCE: "ncclDevKernel_AllReduce_Sum_RING_LL",
    CollType.ALL_GATHER: "ncclDevKernel_AllGather_RING_LL",
    CollType.REDUCE_SCATTER: "ncclDevKernel_ReduceScatter_Sum_RING_LL",
    CollType.ALL_TO_ALL: "ncclDevKernel_SendRecv",
    CollType.BROADCAST: "ncclDevKernel_Broadcast_RING_LL",
}


def ns_to_us(ns: int) -> float:
    """Nanoseconds as a Chrome trace timestamp: microseconds with nanosecond decimals, as Kineto writes them."""
    return round(ns / 1000.0, 3)


def stream_tids(res: SimResult) -> list[int]:
    """The trace thread id of each stream of ``res`` (compute streams from 7, comm streams from 20)."""
    k = res.num_compute_streams
    return [COMPUTE_TID0 + s for s in range(k)] + [COMM_TID0 + j for j in range(len(res.stream_names) - k)]


def to_chrome_trace(res: SimResult, *, device_name: str = "simulated GPU", world_size: int | None = None) -> dict:
    """The trace as a JSON-able dict (see the module docstring)."""
    g = res.graph
    tids = stream_tids(res)
    events: list[dict[str, Any]] = [
        {"ph": "M", "name": "process_name", "pid": GPU_PID, "tid": 0, "args": {"name": "GPU 0"}},
        {"ph": "M", "name": "process_labels", "pid": GPU_PID, "tid": 0, "args": {"labels": "commsched simulation"}},
        {"ph": "M", "name": "process_sort_index", "pid": GPU_PID, "tid": 0, "args": {"sort_index": 0}},
    ]
    for name, tid in zip(res.stream_names, tids, strict=True):
        events.append(
            {"ph": "M", "name": "thread_name", "pid": GPU_PID, "tid": tid, "args": {"name": f"stream {tid} {name}"}}
        )
        events.append({"ph": "M", "name": "thread_sort_index", "pid": GPU_PID, "tid": tid, "args": {"sort_index": tid}})

    start, end, kinds = res.start_ns.tolist(), res.end_ns.tolist(), g.kinds.tolist()
    node_tid = [tids[s] for s in res.stream.tolist()]
    issue_tid = [tids[s] for s in res.issue_stream.tolist()]
    coll_type, coll_group = g.coll_type.tolist(), g.coll_group.tolist()
    comm_bytes = g.comm_bytes.tolist()
    kernel_kinds = (int(OpKind.COMPUTE), int(OpKind.OTHER))
    for i in res.order.tolist():
        k = kinds[i]
        if k in kernel_kinds and end[i] > start[i]:
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": g.targets[i],
                    "pid": GPU_PID,
                    "tid": node_tid[i],
                    "ts": ns_to_us(start[i]),
                    "dur": ns_to_us(end[i] - start[i]),
                    "args": _kernel_args(i, node_tid[i], node=g.names[i], flops=float(g.flops[i])),
                }
            )
        elif coll_type[i] >= 0:
            ctype = CollType(coll_type[i])
            events.append(
                {
                    "ph": "X",
                    "cat": "kernel",
                    "name": _NCCL_NAMES[ctype],
                    "pid": GPU_PID,
                    "tid": node_tid[i],
                    "ts": ns_to_us(start[i]),
                    "dur": ns_to_us(end[i] - start[i]),
                    "args": _kernel_args(
                        i,
                        node_tid[i],
                        node=g.names[i],
                        collective=ctype.name.lower(),
                        group=g.groups[coll_group[i]].name,
                        group_size=g.groups[coll_group[i]].size,
                        bytes=comm_bytes[i],
                        issued_us=ns_to_us(int(res.issue_ns[i])),
                        exposed_us=ns_to_us(int(res.exposed_ns_per_collective[i])),
                    ),
                }
            )
        elif g.wait_of[i] >= 0:
            c = int(g.wait_of[i])
            blocked = int(res.blocked_ns[i])
            events.append(
                {
                    "ph": "X",
                    "cat": "gpu_user_annotation",
                    "name": f"wait {g.names[c]}",
                    "pid": GPU_PID,
                    "tid": issue_tid[i],
                    "ts": ns_to_us(start[i] - blocked),
                    "dur": ns_to_us(blocked),
                    "args": {"node": g.names[i], "blocked_us": ns_to_us(blocked)},
                }
            )
            # flow from the producer to the consumer, forward in time (Perfetto draws it from "s" to "f"; HTA's
            # critical-path flows do the same): "s" inside the collective's slice at its last instant, "f" (bp "e":
            # bound to its enclosing slice) inside the wait's slice, no earlier than "s". The wait ends when the
            # collective does (plus sync), so that instant exists.
            flow_ts = max(start[c], end[c] - 1)
            common = {"cat": "comm_wait", "name": "collective -> wait", "id": i, "pid": GPU_PID}
            events.append({**common, "ph": "s", "tid": node_tid[c], "ts": ns_to_us(flow_ts)})
            finish_ts = min(max(flow_ts, start[i] - blocked), start[i])
            events.append({**common, "ph": "f", "bp": "e", "tid": issue_tid[i], "ts": ns_to_us(finish_ts)})
    events.extend(_memory_counter(res))
    # the host side: one ProfilerStep annotation over the step, as the profiler's schedule writes it
    events += [
        {"ph": "M", "name": "process_name", "pid": HOST_PID, "tid": 0, "args": {"name": "python"}},
        {"ph": "M", "name": "thread_name", "pid": HOST_PID, "tid": HOST_PID, "args": {"name": "thread 1 (python)"}},
        {
            "ph": "X",
            "cat": "user_annotation",
            "name": "ProfilerStep#0",
            "pid": HOST_PID,
            "tid": HOST_PID,
            "ts": 0.0,
            "dur": ns_to_us(res.makespan_ns),
            "args": {"External id": 0},
        },
    ]
    groups = [grp.size for grp in g.groups]
    return {
        "schemaVersion": 1,
        "deviceProperties": [{"id": 0, "name": device_name}],
        "distributedInfo": {"backend": "nccl", "rank": 0, "world_size": world_size or max(groups, default=1)},
        "baseTimeNanoseconds": 0,
        "displayTimeUnit": "ns",
        "traceName": f"commsched simulation of {g.meta.get('workload', 'graph')}",
        "commsched": res.summary(),
        "traceEvents": events,
    }


def _kernel_args(i: int, tid: int, **extra: Any) -> dict[str, Any]:
    return {"External id": i + 1, "correlation": i + 1, "device": 0, "context": 1, "stream": tid, **extra}


def _memory_counter(res: SimResult) -> list[dict[str, Any]]:
    """Counter events along :meth:`SimResult.memory_over_time`, only where the value changes."""
    out, last = [], None
    for t, v in zip(*(a.tolist() for a in res.memory_over_time()), strict=True):
        if v != last:
            out.append(
                {
                    "ph": "C",
                    "name": "Memory",
                    "pid": GPU_PID,
                    "tid": 0,
                    "ts": ns_to_us(t),
                    "args": {"allocated_bytes": v},
                }
            )
            last = v
    return out


def write_chrome_trace(res: SimResult, path: str | Path, **kw: Any) -> Path:
    """Write :func:`to_chrome_trace` to ``path`` atomically; returns the path."""
    path = Path(path)
    atomic_write_text(path, json.dumps(to_chrome_trace(res, **kw), separators=(",", ":")))
    return path

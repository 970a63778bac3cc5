"""Replayable work as a commsched :class:`~commsched.ir.graph.Graph`, per-node costs and a multi-stream schedule,
simulated by :func:`commsched.sim.simulate_costs`: the simulator's event loop already runs each stream in program
order and starts a node once its predecessors on any stream are done, which is all a replay needs.

Every item is a timed node (kind ``other``) on its own compute stream; dependencies are data inputs. Collectives
stay timed work on the stream that ran them (an NCCL kernel occupies its stream for its measured time, which
already includes any link contention; the comm engine's link sharing would count it twice), so the simulator's
comm side is idle and its stream model's rules reduce to "start when the stream and the inputs are free".
"""

from __future__ import annotations

import numpy as np

from commsched.cost.model import CostEstimate
from commsched.ir.graph import Graph, OpKind, csr
from commsched.replay.work import ROLES, ReplayTrace
from commsched.sim.result import SimResult


def to_graph(trace: ReplayTrace) -> Graph:
    """The items as a graph (node i is item i; names ``ITEM:ROLE:NAME [LABEL]``, unique). O(N + E log E)."""
    n = len(trace)
    src, dst = trace.edges[:, 0], trace.edges[:, 1]
    in_ptr, in_idx = csr(n, src, dst)
    names = [
        f"{i}:{ROLES[r]}:{name}" + (f" [{label}]" if label else "")
        for i, (r, name, label) in enumerate(zip(trace.role.tolist(), trace.names, trace.labels, strict=True))
    ]
    return Graph(
        names=names, targets=list(trace.names), kinds=np.full(n, int(OpKind.OTHER), np.int8),
        in_ptr=in_ptr, in_idx=in_idx, dep_ptr=np.zeros(n + 1, np.int32), dep_idx=np.zeros(0, np.int32),
        flops=np.zeros(n), buf_ptr=np.zeros(n + 1, np.int32), buf_shape=[], buf_dtype=[],
        buf_nbytes=np.zeros(0, np.int64), buf_storage=np.zeros(0, np.int32), storage_nbytes=np.zeros(0, np.int64),
        storage_owner=np.zeros(0, np.int32), side_effect=np.zeros(n, bool), coll_type=np.full(n, -1, np.int8),
        coll_group=np.full(n, -1, np.int16), coll_reduce_op={}, coll_in_bytes=np.zeros(n, np.int64),
        coll_out_bytes=np.zeros(n, np.int64), coll_sync=np.zeros(n, bool), wait_of=np.full(n, -1, np.int32),
        groups=(), meta={"source": str(trace.path), "replay": True},
    )  # fmt: skip


def costs_of(dur_ns: np.ndarray) -> CostEstimate:
    """Per-node seconds from int ns (no collectives, no interference: the measured durations include it)."""
    n = len(dur_ns)
    return CostEstimate(
        node_s=np.asarray(dur_ns, np.float64) * 1e-9, coll_latency_s=np.zeros(n), coll_link=np.full(n, -1, np.int64)
    )


def simulate_replay(trace: ReplayTrace, dur_ns: np.ndarray, graph: Graph | None = None) -> SimResult:
    """Simulate the items with durations ``dur_ns`` (int ns, one per item) in the trace's order, each on its
    stream. The result's ``start_ns`` / ``end_ns`` are the replayed times."""
    from commsched.sim.simulate import simulate_costs

    g = graph if graph is not None else to_graph(trace)
    return simulate_costs(g, costs_of(dur_ns), streams=trace.stream.astype(np.int64), engine="events")

"""The data of the HTML report's interactive timeline: per simulated order, one lane per stream (compute streams,
then one comm stream per process group), its kernels, collectives and exposed waits as bars, and its memory curve;
every order on one time axis (the longest step's), so that a before and an after line up.

The page draws it with the script in ``report/html_assets.py``; this module only turns ``SimResult`` s into plain
JSON-able lists (times in ns)."""

from __future__ import annotations

import itertools
import json
from collections.abc import Sequence
from typing import Any

import numpy as np

from commsched.ir.graph import OpKind
from commsched.ir.transform import NODE_TAGS_META
from commsched.sim.result import SimResult

COMPUTE, OTHER, BLOCKED, COLLECTIVE = 0, 1, 2, 3
"""bar classes: a compute kernel, another kernel, a wait blocking its stream (exposed communication), a collective"""
MAX_MEMORY_POINTS = 4000
"""the memory curve is thinned to at most this many steps per order, keeping each stretch's highest value"""


def _memory_points(res: SimResult) -> list[list[int]]:
    """The memory step curve as ``[t_ns, bytes]`` pairs, thinned to :data:`MAX_MEMORY_POINTS` (peaks kept)."""
    times, values = res.memory_over_time()
    times, values = times.astype(np.int64), values.astype(np.int64)
    if len(times) > MAX_MEMORY_POINTS:
        edges = np.linspace(0, len(times), MAX_MEMORY_POINTS + 1).astype(np.int64)
        keep = [int(lo + np.argmax(values[lo:hi])) for lo, hi in itertools.pairwise(edges) if hi > lo]
        times, values = times[keep], values[keep]
    return np.stack([times, values], axis=1).tolist() if len(times) else []


def order_timeline(res: SimResult, label: str, names: dict[str, int]) -> dict[str, Any]:
    """One order's lanes, bars and memory curve. A bar is ``[lane, start_ns, end_ns, class, name, exposed_ns]``;
    ``name`` indexes the shared ``names`` list (filled here). A blocked wait is drawn on its stream for the time it
    blocked, just before it released; a collective carries the time its waits were exposed."""
    g = res.graph
    kinds = g.kinds
    kernels = np.isin(kinds, (OpKind.COMPUTE, OpKind.OTHER)) & (res.end_ns > res.start_ns)
    colls = g.coll_type >= 0
    blocked = (res.blocked_ns > 0) & ~colls
    exposed = res.exposed_ns_per_collective
    bars: list[list[int]] = []
    for i in np.flatnonzero(kernels | colls | blocked).tolist():
        name = names.setdefault(g.names[i], len(names))
        lane = int(res.stream[i])
        if blocked[i]:
            start, end, cls = int(res.start_ns[i] - res.blocked_ns[i]), int(res.start_ns[i]), BLOCKED
        elif colls[i]:
            start, end, cls = int(res.start_ns[i]), int(res.end_ns[i]), COLLECTIVE
        else:
            start, end = int(res.start_ns[i]), int(res.end_ns[i])
            cls = COMPUTE if kinds[i] == OpKind.COMPUTE else OTHER
        bars.append([lane, start, end, cls, name, int(exposed[i]) if colls[i] else 0])
    for i in np.flatnonzero(colls & (res.blocked_ns > 0)).tolist():  # a synchronous collective holds its issuer
        start = int(res.issue_ns[i])
        bars.append([int(res.issue_stream[i]), start, start + int(res.blocked_ns[i]), BLOCKED, names[g.names[i]], 0])
    return {
        "label": label,
        "makespan_ns": int(res.makespan_ns),
        "exposed_ns": int(res.blocked_ns.sum()),
        "peak_bytes": int(res.peak_memory_bytes),
        "lanes": list(res.stream_names),
        "compute_lanes": int(res.num_compute_streams),
        "bars": bars,
        "memory": _memory_points(res),
    }


def timeline_data(results: Sequence[tuple[str, SimResult]], *, capacity_bytes: float | None = None) -> dict[str, Any]:
    """Every order of ``results`` on one time axis (``axis_ns``: the longest makespan); ``comm_lanes`` gives each
    process group's comm stream one colour index across the orders; ``recompute``: the ``names`` indices of the
    nodes an activation checkpoint recomputes (the graph's ``recompute`` tag), drawn apart; ``capacity_bytes``: the
    device's HBM."""
    names: dict[str, int] = {}
    orders = [order_timeline(res, label, names) for label, res in results]
    comm_lanes: dict[str, int] = {}
    for o in orders:
        for lane in o["lanes"][o["compute_lanes"] :]:
            comm_lanes.setdefault(lane, len(comm_lanes))
    tagged = {n for _, res in results for n in res.graph.meta.get(NODE_TAGS_META, {}).get("recompute", ())}
    return {
        "axis_ns": max((o["makespan_ns"] for o in orders), default=0),
        "recompute": sorted(names[n] for n in tagged if n in names),
        "capacity_bytes": float(capacity_bytes) if capacity_bytes else None,
        "comm_lanes": comm_lanes,
        "names": list(names),
        "orders": orders,
    }


def timeline_json(data: dict[str, Any]) -> str:
    """``data`` as JSON safe inside ``<script type="application/json">`` (no ``</`` can close the element)."""
    return json.dumps(data, separators=(",", ":")).replace("</", "<\\/")

"""What a simulation returns, and the metrics derived from it."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from functools import cached_property
from typing import Any

import numpy as np

from commsched.ir.graph import CollType, Graph, OpKind
from commsched.memory.liveness import MemoryProfile
from commsched.sim.bounds import LowerBound


def _union(starts: np.ndarray, ends: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Merge intervals [start, end) into disjoint sorted ones."""
    keep = ends > starts
    starts, ends = starts[keep], ends[keep]
    if not len(starts):
        return starts, ends
    o = np.argsort(starts, kind="stable")
    starts, ends = starts[o], ends[o]
    reach = np.maximum.accumulate(ends)
    new = np.ones(len(starts), bool)
    new[1:] = starts[1:] > reach[:-1]
    return starts[new], np.maximum.reduceat(ends, np.flatnonzero(new))


def _overlap_ns(a: tuple[np.ndarray, np.ndarray], b: tuple[np.ndarray, np.ndarray]) -> int:
    """Length of the intersection of two disjoint-interval sets."""
    times = np.concatenate([a[0], a[1], b[0], b[1]])
    delta = np.concatenate(
        [np.full(len(a[0]), 1), np.full(len(a[1]), -1), np.full(len(b[0]), 2), np.full(len(b[1]), -2)]
    )
    if not len(times):
        return 0
    o = np.argsort(times, kind="stable")
    times, level = times[o], np.cumsum(delta[o])
    both = level[:-1] == 3
    return int((times[1:] - times[:-1])[both].sum())


def comm_overlap_ns(
    comp_start: np.ndarray, comp_end: np.ndarray, comm_start: np.ndarray, comm_end: np.ndarray
) -> tuple[int, int]:
    """Holistic Trace Analysis' overlap terms: (time both compute and communication run, time communication runs),
    each side a union of intervals. The overlap ratio is their quotient; the exposed communication their
    difference. Used for simulated and measured timelines alike (``commsched replay``)."""
    comp, comm = _union(comp_start, comp_end), _union(comm_start, comm_end)
    return _overlap_ns(comp, comm), int((comm[1] - comm[0]).sum())


@dataclass(frozen=True, eq=False)
class SimResult:
    """One simulated step. Times are int64 nanoseconds per node; ``*_s`` properties convert to seconds.

    ``start_ns``/``end_ns``: a kernel's run on its compute stream; a collective's run on its group's comm stream; a
    wait's instant of unblocking; zero-length for inputs, views and the output. ``issue_ns``: when each collective
    was issued (-1 for other nodes). ``blocked_ns``: how long each wait (or synchronous collective) held its stream
    waiting on communication. ``stream``: per node, an index into ``stream_names`` (compute streams first, then one
    comm stream per process group); ``issue_stream``: for collectives, the compute stream that issued them.
    """

    graph: Graph
    order: np.ndarray
    stream: np.ndarray
    issue_stream: np.ndarray
    stream_names: tuple[str, ...]
    num_compute_streams: int
    start_ns: np.ndarray
    end_ns: np.ndarray
    issue_ns: np.ndarray
    blocked_ns: np.ndarray
    standalone_ns: np.ndarray
    bound_fn: Callable[[], LowerBound]
    """computes :attr:`bound` when first read (it does not depend on the order; a search that only compares steps
    never needs it)"""
    memory: MemoryProfile

    @cached_property
    def bound(self) -> LowerBound:
        """The simulator's lower bound of this program's step (:mod:`commsched.sim.bounds`)."""
        return self.bound_fn()

    # ------------------------------------------------------------------ headline metrics
    @cached_property
    def makespan_ns(self) -> int:
        return int(self.end_ns.max(initial=0))

    @property
    def makespan_s(self) -> float:
        return self.makespan_ns * 1e-9

    @property
    def exposed_comm_s(self) -> float:
        """Total time compute streams waited on communication (waits and synchronous collectives)."""
        return int(self.blocked_ns.sum()) * 1e-9

    @cached_property
    def exposed_ns_per_collective(self) -> np.ndarray:
        """Per node: for a collective, the time its waits (or, when synchronous, itself) held a stream; else 0."""
        g = self.graph
        out = np.where(g.coll_type >= 0, self.blocked_ns, 0)
        waits = np.flatnonzero(g.wait_of >= 0)
        np.add.at(out, g.wait_of[waits], self.blocked_ns[waits])
        return out

    @property
    def exposed_comm_by_collective_s(self) -> dict[str, float]:
        g = self.graph
        return {g.names[c]: int(self.exposed_ns_per_collective[c]) * 1e-9 for c in g.collectives.tolist()}

    @cached_property
    def overlap_ratio(self) -> float:
        """Holistic Trace Analysis' comm/compute overlap: time both a kernel and a collective run / time a collective
        runs (each side as a union of intervals); 0 when there is no communication."""
        g = self.graph
        kernels = np.isin(g.kinds, (OpKind.COMPUTE, OpKind.OTHER))
        colls = g.coll_type >= 0
        both_ns, comm_ns = comm_overlap_ns(
            self.start_ns[kernels], self.end_ns[kernels], self.start_ns[colls], self.end_ns[colls]
        )
        return both_ns / comm_ns if comm_ns else 0.0

    @cached_property
    def stream_busy_ns(self) -> np.ndarray:
        """Per stream: the time it runs kernels (compute streams) or collectives (comm streams)."""
        g = self.graph
        runs = np.isin(g.kinds, (OpKind.COMPUTE, OpKind.OTHER)) | (g.coll_type >= 0)
        busy = np.bincount(
            self.stream[runs], weights=(self.end_ns - self.start_ns)[runs], minlength=len(self.stream_names)
        )
        return np.rint(busy).astype(np.int64)

    @property
    def stream_utilization(self) -> dict[str, float]:
        span = max(self.makespan_ns, 1)
        return {name: int(b) / span for name, b in zip(self.stream_names, self.stream_busy_ns, strict=True)}

    @property
    def peak_memory_bytes(self) -> int:
        return self.memory.peak_bytes

    @property
    def lower_bound_s(self) -> float:
        return self.bound.value_s

    @property
    def bound_ratio(self) -> float:
        """makespan / lower bound (>= 1; 1 means no schedule can do better)."""
        lb = self.lower_bound_s
        return self.makespan_s / lb if lb > 0 else 1.0

    def memory_over_time(self) -> tuple[np.ndarray, np.ndarray]:
        """The memory curve as a step function of time: (times_ns, bytes), sorted by time. A node's value while it
        runs holds from its start (a collective's from its issue, a wait's from when it began blocking), the value
        after its frees from its end."""
        g, mem, order = self.graph, self.memory, self.order
        is_coll = g.coll_type[order] >= 0
        t_on = np.where(is_coll, self.issue_ns[order], self.start_ns[order] - self.blocked_ns[order])
        t_off = np.where(is_coll, self.issue_ns[order], self.end_ns[order])
        times = np.stack([t_on, t_off], axis=1).ravel()
        values = np.stack([mem.curve_bytes, mem.after_bytes], axis=1).ravel()
        o = np.argsort(times, kind="stable")
        return times[o], values[o]

    # ------------------------------------------------------------------ tables
    def top_exposed(self, k: int = 10) -> list[dict[str, Any]]:
        """The ``k`` collectives that kept streams waiting longest."""
        g = self.graph
        colls = g.collectives
        exp = self.exposed_ns_per_collective[colls]
        pick = colls[np.argsort(-exp, kind="stable")[:k]]
        rows = []
        for c in pick.tolist():
            if self.exposed_ns_per_collective[c] <= 0:
                break
            rows.append(
                {
                    "name": g.names[c],
                    "type": CollType(int(g.coll_type[c])).name.lower(),
                    "group": g.groups[int(g.coll_group[c])].name,
                    "bytes": int(g.comm_bytes[c]),
                    "duration_s": int(self.end_ns[c] - self.start_ns[c]) * 1e-9,
                    "exposed_s": int(self.exposed_ns_per_collective[c]) * 1e-9,
                }
            )
        return rows

    def summary(self) -> dict[str, Any]:
        """The headline numbers as plain JSON-able values."""
        return {
            "nodes": len(self.graph),
            "makespan_s": self.makespan_s,
            "lower_bound_s": self.lower_bound_s,
            "bound_ratio": self.bound_ratio,
            "binding_bound": self.bound.binding,
            "exposed_comm_s": self.exposed_comm_s,
            "overlap_ratio": self.overlap_ratio,
            "peak_memory_bytes": self.peak_memory_bytes,
            "stream_utilization": self.stream_utilization,
            "bound": {
                "compute_s": self.bound.compute_s,
                "comm_s": dict(self.bound.comm_s),
                "critical_path_s": self.bound.critical_path_s,
            },
        }

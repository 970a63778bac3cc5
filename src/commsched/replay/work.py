"""The work a trace replays: items (device work, host segments, gaps) on streams, with their dependencies.

An item is one node of the replay. Its ``role`` says what it is:

* ``compute`` / ``comm`` / ``memory``: device work (a kernel; a memcpy or memset; a top-level op on a thread of
  a CPU-only trace), the only items the step and the busy times count; as in Holistic Trace Analysis, memory work
  is neither computation nor communication in the overlap ratio;
* ``host``: a segment of a CPU thread that launches or waits for device work (runtime calls and the host time
  before them): a kernel cannot start before its launch, a synchronising call not before the work it waits for;
* ``gap``: a fixed delay that stays a delay: the measured time between an item's last dependency and its start
  (a launch or queueing latency, a host pause), after that dependency (:func:`_add_gaps`).

Every item sits on one stream and runs after the previous item of that stream (program order) and after its
dependencies; its duration is its measured one until a what-if changes it.
"""

from __future__ import annotations

import heapq
from bisect import bisect_right
from dataclasses import dataclass, field
from pathlib import Path

import numpy as np

ROLES = ("compute", "comm", "memory", "host", "gap")
COMPUTE, COMM, MEMORY, HOST, GAP = range(5)


@dataclass(frozen=True)
class Collective:
    """What a communication item moved, where the trace says so (nccl-tests size convention)."""

    kind: str
    group_size: int
    nbytes: int
    group: str


@dataclass(frozen=True)
class ReplayTrace:
    """One trace as replayable work, items in a topological order (every edge goes from a smaller id to a larger).

    ``start_ns`` / ``dur_ns``: measured, relative to the trace's first event of interest; ``edges``: (src, dst)
    dependencies besides stream order; ``streams[stream[i]]`` names item i's stream; ``device``: per stream, whether
    it runs device work (a GPU stream, or a thread of a CPU-only trace)."""

    path: Path
    rank: int | None
    mode: str  # "gpu": device streams launched by CPU threads; "cpu": a CPU-only trace, threads as streams
    names: list[str]
    role: np.ndarray  # int8, ROLES
    stream: np.ndarray  # int32 index into streams
    streams: list[str]
    device: np.ndarray  # bool per stream
    start_ns: np.ndarray  # int64
    dur_ns: np.ndarray  # int64
    edges: np.ndarray  # int64 (E, 2)
    labels: list[str]
    collectives: dict[int, Collective] = field(default_factory=dict)
    inferred_edges: int = 0  # dependencies found by a late start right after other work ended
    event_edges: int = 0  # dependencies from cudaEventRecord / cudaStreamWaitEvent pairs
    events: int = 0  # trace events in the file

    @property
    def work(self) -> np.ndarray:
        """Mask of the device-work items (compute, comm and memory)."""
        return self.role <= MEMORY

    def __len__(self) -> int:
        return len(self.names)


class Items:
    """Accumulates items and their dependencies; :meth:`finish` adds each item's residual gap and sorts them."""

    def __init__(self) -> None:
        self.names: list[str] = []
        self.role: list[int] = []
        self.stream: list[int] = []
        self.start: list[int] = []
        self.dur: list[int] = []
        self.preds: list[list[int]] = []
        self.labels: list[str] = []
        self.streams: dict[object, int] = {}
        self.stream_names: list[str] = []
        self.device: list[bool] = []
        self.last: list[int] = []  # last item per stream

    def stream_id(self, key: object, name: str, device: bool) -> int:
        s = self.streams.get(key)
        if s is None:
            s = self.streams[key] = len(self.stream_names)
            self.stream_names.append(name)
            self.device.append(device)
            self.last.append(-1)
        return s

    def add(self, name: str, role: int, stream: int, start_ns: int, dur_ns: int, preds=(), label: str = "") -> int:
        """A new item after the stream's last one; returns its id."""
        i = len(self.names)
        self.names.append(name)
        self.role.append(role)
        self.stream.append(stream)
        self.start.append(int(start_ns))
        self.dur.append(max(0, int(dur_ns)))
        prev = self.last[stream]
        self.preds.append(([prev] if prev >= 0 else []) + [p for p in preds if p >= 0])
        self.labels.append(label)
        self.last[stream] = i
        return i

    def end(self, i: int) -> int:
        return self.start[i] + self.dur[i]

    def ready(self, i: int) -> int:
        """When item i's dependencies had all ended, as measured (0 without any)."""
        return max((self.end(p) for p in self.preds[i]), default=0)

    def infer(self, i: int, candidates: EndIndex, window_ns: int) -> bool:
        """Add the dependency that best explains a late start: the work item on another stream that ended last
        within ``window_ns`` before item i started (and after its known dependencies). Whether one was added."""
        ready, start = self.ready(i), self.start[i]
        if start - ready <= 0:
            return False
        p = candidates.latest_before(start, max(ready, start - window_ns), exclude_stream=self.stream[i])
        if p < 0 or p in self.preds[i]:
            return False
        self.preds[i].append(p)
        return True


class EndIndex:
    """Work items sorted by measured end, for :meth:`Items.infer`."""

    def __init__(self, items: Items, ids: list[int]) -> None:
        self.items = items
        ids = sorted(ids, key=items.end)
        self.ids, self.ends = ids, [items.end(i) for i in ids]

    def latest_before(self, t: int, after: int, exclude_stream: int) -> int:
        """The item with the latest end in (after, t] on another stream than ``exclude_stream``; -1 if none."""
        k = bisect_right(self.ends, t) - 1
        while k >= 0 and self.ends[k] > after:
            i = self.ids[k]
            if self.items.stream[i] != exclude_stream:
                return i
            k -= 1
        return -1


def _add_gaps(items: Items) -> None:
    """Before every item that started after its dependencies' measured end, a gap of the difference. A delay that
    followed the item's own stream (queueing) sits on that stream; one that followed a launch or another stream's
    work (a launch or event latency, a thread waking up) sits on the stream's latency lane, after that dependency
    only, so it runs beside the stream's previous item when a what-if makes that item longer."""
    lane_last: dict[int, int] = {}
    for i in range(len(items.names)):  # creation order: each stream's items in their measured order
        if items.role[i] == GAP:
            continue
        preds = items.preds[i]
        gap = items.start[i] - items.ready(i)
        if gap <= 0:
            continue
        s = items.stream[i]
        binding = max(preds, key=items.end) if preds else -1
        on_lane = binding >= 0 and items.stream[binding] != s
        if on_lane:
            lane = items.stream_id(("lane", s), f"{items.stream_names[s]} latency", False)
            gap_preds = [binding] + ([lane_last[lane]] if lane in lane_last else [])
        else:
            lane, gap_preds = s, preds
        g = len(items.names)
        items.names.append("gap")
        items.role.append(GAP)
        items.stream.append(lane)
        items.start.append(items.start[i] - gap)
        items.dur.append(gap)
        items.preds.append(gap_preds)
        items.labels.append("")
        if on_lane:
            lane_last[lane] = g
            items.preds[i] = [*preds, g]
        else:
            items.preds[i] = [g]


def trace_rank(path: Path, info: dict) -> int | None:
    """The rank a trace's ``distributedInfo`` (``info``) names, or None where it names none; ValueError naming the
    file when it is not an integer >= 0. Every trace reader passes it to :func:`finish`."""
    rank = info.get("rank")
    if rank is not None and (isinstance(rank, bool) or not isinstance(rank, int) or rank < 0):
        raise ValueError(f"{path}: distributedInfo.rank: expected an integer >= 0, got {rank!r}")
    return rank


def finish(items: Items, path: Path, rank: int | None, mode: str, **extra) -> ReplayTrace:
    """Add the residual gaps (:func:`_add_gaps`) and sort the items topologically, earliest measured start first.
    ValueError naming the file on a dependency cycle (a trace whose timestamps contradict its links)."""
    _add_gaps(items)
    order = _topological(items, path)
    new = np.empty(len(order), np.int64)
    new[order] = np.arange(len(order))
    src = [new[p] for i in order for p in items.preds[i]]
    dst = [new[i] for i in order for _ in items.preds[i]]
    edges = np.stack([np.asarray(src, np.int64), np.asarray(dst, np.int64)], axis=1).reshape(-1, 2)
    pick = np.asarray(order, np.int64)
    colls = {int(new[i]): c for i, c in extra.pop("collectives", {}).items()}
    return ReplayTrace(
        path=path, rank=rank, mode=mode,
        names=[items.names[i] for i in order],
        role=np.asarray(items.role, np.int8)[pick],
        stream=np.asarray(items.stream, np.int32)[pick],
        streams=list(items.stream_names),
        device=np.asarray(items.device, bool),
        start_ns=np.asarray(items.start, np.int64)[pick],
        dur_ns=np.asarray(items.dur, np.int64)[pick],
        edges=edges,
        labels=[items.labels[i] for i in order],
        collectives=colls,
        **extra,
    )  # fmt: skip


def _topological(items: Items, path: Path) -> list[int]:
    """Kahn's algorithm, the earliest measured start first (ties: creation order). O((N + E) log N)."""
    n = len(items.names)
    indeg = [len(set(p)) for p in items.preds]
    succs: list[list[int]] = [[] for _ in range(n)]
    for i, ps in enumerate(items.preds):
        for p in set(ps):
            succs[p].append(i)
    heap = [(items.start[i], i) for i in range(n) if indeg[i] == 0]
    heapq.heapify(heap)
    order: list[int] = []
    while heap:
        _, i = heapq.heappop(heap)
        order.append(i)
        for j in succs[i]:
            indeg[j] -= 1
            if indeg[j] == 0:
                heapq.heappush(heap, (items.start[j], j))
    if len(order) != n:
        stuck = next(i for i in range(n) if indeg[i] > 0)
        raise ValueError(f"{path}: item {items.names[stuck]!r} depends on itself through the trace's links "
                         "(correlation ids or events): expected links that go forward in time")  # fmt: skip
    for i in range(n):
        items.preds[i] = sorted(set(items.preds[i]))
    return order

"""The HEFT core of the ``multi_stream`` pass: upward ranks and earliest-finish-time stream choice.

Time inside is int64 nanoseconds. The planning model is the stream model (:mod:`commsched.sim.model`) without link
sharing, evaluated once per node as it is placed:

* a kernel starts when its stream is free and its predecessors are available (one on another stream, other than a
  graph input, later by the model's sync); with interference it is stretched while communication is in flight (the
  model's rate) and by ``compute_interference`` times its overlap with kernels already placed on the other compute
  streams (concurrent kernels share the SMs; see :func:`_stretched`);
* a collective is issued from its stream, starts on its group's FIFO comm stream when the model says, and frees its
  issuing stream at once (a synchronous one when the model releases it);
* a wait unblocks when the model releases it; a hybrid kernel also waits until no collective runs and keeps every
  comm stream busy while it runs.

Nodes are placed in priority order (a topological order: by decreasing upward rank, or the input order), each on
the allowed stream where it finishes first (non-insertion HEFT). The result is a stream per node and the model's
times, from which the pass derives a global order sorted by start time.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from commsched.ir import Graph, OpKind
from commsched.ir.graph import csr
from commsched.ir.order import collective_chains
from commsched.passes.multi_stream_policy import ROLE_COMM, ROLE_HYBRID, StreamMap
from commsched.sim.model import StreamModel

_KERNEL = (int(OpKind.COMPUTE), int(OpKind.OTHER))
_INPUT, _WAIT, _COLL = int(OpKind.INPUT), int(OpKind.WAIT), int(OpKind.COLLECTIVE)


@dataclass
class Plan:
    """Per-graph arrays shared by every placement run (lists for fast scalar access)."""

    n: int
    kinds: list[int]
    roles: list[int]
    dur_ns: list[int]
    wait_of: list[int]
    group: list[int]
    is_sync: list[bool]
    pred_ptr: list[int]
    pred_idx: list[int]
    succ_ptr: list[int]
    succ_idx: list[int]
    chain_next: list[int]  # the next collective of the same group in issue order, -1 if none
    pos: list[int]  # position in the input order
    num_groups: int


def make_plan(
    g: Graph,
    order: np.ndarray,
    dur_ns: np.ndarray,
    roles: np.ndarray,
    extra_src: np.ndarray,
    extra_dst: np.ndarray,
) -> Plan:
    """Arrays of ``g`` for placement; the per-group collective (FIFO) order is the one of ``order``. O(N + E)."""
    n = len(g)
    ptr, idx = g.predecessors_csr()
    dst = np.repeat(np.arange(n), np.diff(ptr))
    if len(extra_src):
        src = np.concatenate([idx.astype(np.int64), extra_src.astype(np.int64)])
        dst = np.concatenate([dst, extra_dst.astype(np.int64)])
        pred_ptr, pred_idx = csr(n, src, dst)
    else:
        src, pred_ptr, pred_idx = idx.astype(np.int64), ptr, idx
    succ_ptr, succ_idx = csr(n, dst, src)
    chain_next = np.full(n, -1, np.int64)
    for chain in collective_chains(g, order).values():
        chain_next[chain[:-1]] = chain[1:]
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    return Plan(
        n=n,
        kinds=g.kinds.tolist(),
        roles=roles.tolist(),
        dur_ns=dur_ns.tolist(),
        wait_of=g.wait_of.tolist(),
        group=g.coll_group.tolist(),
        is_sync=g.coll_sync.tolist(),
        pred_ptr=pred_ptr.tolist(),
        pred_idx=pred_idx.tolist(),
        succ_ptr=succ_ptr.tolist(),
        succ_idx=succ_idx.tolist(),
        chain_next=chain_next.tolist(),
        pos=pos.tolist(),
        num_groups=len(g.groups),
    )


def upward_ranks(p: Plan, order: np.ndarray, streams: StreamMap, sync_ns: int) -> list[int]:
    """HEFT upward rank: a node's own time plus the longest path from it to the end of the step, where an edge
    between nodes that may land on different streams costs ``sync_ns``, a collective's time counts on the edges to
    its waits (issue, transfer, then the wait's sync) and to the next collective of its group (FIFO). O(N + E)."""
    multi = [len(ids) > 1 for ids in streams.by_role]
    same = [[set(a) == set(b) for b in streams.by_role] for a in streams.by_role]
    kinds, roles, dur, sp, si, wait_of, nxt = (
        p.kinds,
        p.roles,
        p.dur_ns,
        p.succ_ptr,
        p.succ_idx,
        p.wait_of,
        p.chain_next,
    )
    rank = [0] * p.n
    for i in reversed(order.tolist()):
        ri, ki = roles[i], kinds[i]
        best = 0
        is_coll = ki == _COLL
        for s in si[sp[i] : sp[i + 1]]:
            if is_coll and wait_of[s] == i:
                edge = dur[i] + 2 * sync_ns
            elif ki == _INPUT or (same[ri][roles[s]] and not multi[ri]):
                edge = 0
            else:
                edge = sync_ns
            if edge + rank[s] > best:
                best = edge + rank[s]
        own = 0 if is_coll and not p.is_sync[i] else dur[i]  # an asynchronous issue costs its stream nothing
        if is_coll and nxt[i] >= 0 and dur[i] - own + rank[nxt[i]] > best:
            best = dur[i] - own + rank[nxt[i]]
        rank[i] = own + best
    return rank


def rank_priority(p: Plan, rank: list[int]) -> np.ndarray:
    """Nodes by decreasing upward rank, ties by input position: topological, since an edge never increases rank."""
    return np.lexsort((np.asarray(p.pos), -np.asarray(rank, np.int64))).astype(np.int64)


class _Intervals:
    """Disjoint intervals appended in time order (one stream's busy periods), with overlap queries."""

    __slots__ = ("ends", "starts")

    def __init__(self) -> None:
        self.starts: list[int] = []
        self.ends: list[int] = []

    def add(self, a: int, b: int) -> None:
        if b > a:
            self.starts.append(a)
            self.ends.append(b)

    def pieces(self, a: int, b: int) -> list[tuple[int, int]]:
        out = []
        k = bisect.bisect_right(self.ends, a)
        starts, ends = self.starts, self.ends
        while k < len(starts) and starts[k] < b:
            out.append((max(a, starts[k]), min(b, ends[k])))
            k += 1
        return out

    def overlap(self, a: int, b: int) -> int:
        return sum(y - x for x, y in self.pieces(a, b))


@dataclass
class Placement:
    """The result of one placement run: stream and model times per node (a collective's ``start`` is its issue)."""

    stream: np.ndarray
    start_ns: np.ndarray
    end_ns: np.ndarray
    makespan_ns: int


class _Placer:
    """The state of one placement run: per stream when it is free, per group when its comm stream is free, busy
    intervals (comm per group, kernels per stream), and per node its stream and model times."""

    def __init__(self, p: Plan, streams: StreamMap, model: StreamModel, compute_interference: float) -> None:
        self.p, self.model, self.alpha = p, model, compute_interference
        self.allowed = [list(ids) for ids in streams.by_role]
        self.compute_ids = streams.compute_streams
        self.stream_free = [0] * streams.num_streams
        self.group_free = [0] * max(1, p.num_groups)
        self.comm_busy = [_Intervals() for _ in range(max(1, p.num_groups))]
        self.kernel_busy = [_Intervals() for _ in range(streams.num_streams)]
        self.stream_of = [0] * p.n
        self.avail = [0] * p.n  # when successors may use the node (a collective: its issue)
        self.start = [0] * p.n
        self.end = [0] * p.n  # a collective: the end of its transfer
        self.comm_share = 1.0 - model.kernel_work_ns(1.0, True)  # wall time lost per unit of overlap with comm

    def last_pred_stream(self, i: int) -> int:
        """The stream of the predecessor available last (ties on finish time go to it: no sync needed)."""
        p, last_t, last_s = self.p, -1, -1
        for q in p.pred_idx[p.pred_ptr[i] : p.pred_ptr[i + 1]]:
            if p.kinds[q] != _INPUT and self.avail[q] > last_t:
                last_t, last_s = self.avail[q], self.stream_of[q]
        return last_s

    def candidate(self, i: int, s: int) -> tuple[int, int, int]:
        """(finish, start, end) of node ``i`` on stream ``s``; finish is when the stream is free again."""
        p, model = self.p, self.model
        k = p.kinds[i]
        ready = self.stream_free[s]
        for q in p.pred_idx[p.pred_ptr[i] : p.pred_ptr[i + 1]]:
            a = model.available_ns(self.avail[q], self.stream_of[q] != s and p.kinds[q] != _INPUT)
            if a > ready:
                ready = a
        if k == _COLL:
            c_end = model.comm_start_ns(ready, self.group_free[p.group[i]]) + p.dur_ns[i]
            return (model.wait_release_ns(c_end) if p.is_sync[i] else ready), ready, c_end
        if k == _WAIT:
            t = max(ready, model.wait_release_ns(self.end[p.wait_of[i]]))
            return t, t, t
        if k in _KERNEL and p.dur_ns[i]:
            t0 = max(ready, max(self.group_free)) if p.roles[i] == ROLE_HYBRID else ready
            d = p.dur_ns[i]
            if self.comm_share > 0 or self.alpha > 0:
                others = [self.kernel_busy[o] for o in self.compute_ids if o != s]
                d = _stretched(d, t0, self.comm_busy, self.comm_share, others, self.alpha)
            return t0 + d, t0, t0 + d
        return ready, ready, ready

    def place(self, i: int) -> None:
        """Put node ``i`` on the allowed stream where it finishes first (ties: the last predecessor's, then the
        lowest stream) and record its times."""
        p = self.p
        tie_stream = self.last_pred_stream(i)
        best = None  # (finish, tie, stream, start, end)
        for s in self.allowed[p.roles[i]]:
            finish, t0, t1 = self.candidate(i, s)
            cand = (finish, s != tie_stream, s, t0, t1)
            if best is None or cand[:3] < best[:3]:
                best = cand
        free_after, _, s, t0, t1 = best
        self.stream_of[i], self.start[i], self.end[i] = s, t0, t1
        self.stream_free[s] = free_after
        k = p.kinds[i]
        if k == _COLL:
            self.avail[i] = t1 if p.is_sync[i] else t0  # successors use a synchronous collective when it ends
            grp = p.group[i]
            self.group_free[grp] = t1
            self.comm_busy[grp].add(t1 - p.dur_ns[i], t1)
            return
        self.avail[i] = t1
        if k in _KERNEL and t1 > t0:
            self.kernel_busy[s].add(t0, t1)
            if p.roles[i] == ROLE_HYBRID:
                self.group_free = [max(f, t1) for f in self.group_free]


def place(
    p: Plan, priority: np.ndarray, streams: StreamMap, model: StreamModel, compute_interference: float
) -> Placement:
    """Place every node, in ``priority`` order, on its allowed stream with the earliest finish time (see the module
    docstring for the model). A model without compute slowdown and ``compute_interference`` 0 turn interference
    off. O((N + E) * S + N * (log N + k)), S allowed streams per node, k intervals overlapping a kernel."""
    if not streams.by_role[ROLE_COMM]:
        raise ValueError("no stream for collectives")
    placer = _Placer(p, streams, model, compute_interference)
    for i in priority.tolist():
        placer.place(i)
    return Placement(
        stream=np.asarray(placer.stream_of, np.int32),
        start_ns=np.asarray(placer.start, np.int64),
        end_ns=np.asarray(placer.end, np.int64),
        makespan_ns=max(max(placer.end, default=0), max(placer.stream_free, default=0)),
    )


def _stretched(
    work: int, t0: int, comm_busy: list[_Intervals], comm_share: float, others: list[_Intervals], alpha: float
) -> int:
    """Wall time of a kernel of ``work`` ns started at ``t0``: the fixed point of ``w = work + comm_share *
    overlap_comm(w) + alpha * overlap_kernels(w)``, overlaps over ``[t0, t0 + w)``. With slowdown s, comm_share
    = 1 - 1/s is exactly the simulator's rule; kernels already placed keep their times, so the newcomer absorbs the
    whole contention (the work both lose)."""
    w = work
    for _ in range(16):
        t1 = t0 + w
        extra = comm_share * _union_overlap(comm_busy, t0, t1) if comm_share > 0 else 0.0
        if alpha > 0:
            extra += alpha * sum(iv.overlap(t0, t1) for iv in others)
        nxt = work + round(extra)
        if nxt <= w:
            return w
        w = nxt
    return w


def _union_overlap(busy: list[_Intervals], a: int, b: int) -> int:
    """Length of [a, b) covered by at least one of the interval sets."""
    pieces: list[tuple[int, int]] = []
    for iv in busy:
        if iv.starts:
            pieces.extend(iv.pieces(a, b))
    if len(pieces) <= 1:
        return sum(y - x for x, y in pieces)
    pieces.sort()
    total, cur_a, cur_b = 0, pieces[0][0], pieces[0][1]
    for x, y in pieces[1:]:
        if x > cur_b:
            total += cur_b - cur_a
            cur_a, cur_b = x, y
        elif y > cur_b:
            cur_b = y
    return total + cur_b - cur_a


def follow_consumers(p: Plan, placed: Placement, priority: np.ndarray) -> None:
    """Move each view (free, it only aliases) onto the stream of its earliest consumer, just before it: placed by
    finish time alone, a view lands on whichever stream is idle and costs its consumers a cross-stream sync. In
    place; views are visited consumers first, so chains of views follow their final consumer. O(N + E)."""
    view = int(OpKind.VIEW)
    rank = np.empty(p.n, np.int64)
    rank[priority] = np.arange(p.n)
    stream, start, end = placed.stream, placed.start_ns, placed.end_ns
    sp, si = p.succ_ptr, p.succ_idx
    for v in priority[::-1].tolist():
        if p.kinds[v] != view or sp[v] == sp[v + 1]:
            continue
        first = min(si[sp[v] : sp[v + 1]], key=lambda u: (start[u], rank[u]))
        if p.kinds[first] == int(OpKind.OUTPUT):
            continue
        stream[v] = stream[first]
        start[v] = end[v] = start[first]


def order_by_start(start_ns: np.ndarray, priority: np.ndarray) -> np.ndarray:
    """All nodes sorted by start time, ties by place in ``priority``: a topological order (a successor never
    starts before its predecessor) that keeps every stream's program order (a stream runs its nodes one after
    another)."""
    rank = np.empty(len(priority), np.int64)
    rank[priority] = np.arange(len(priority))
    return np.lexsort((rank, start_ns)).astype(np.int32)

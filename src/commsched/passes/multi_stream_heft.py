"""The HEFT core of the ``multi_stream`` pass: upward ranks and earliest-finish-time stream choice.

Time inside is int64 nanoseconds. The planning model is the simulator's stream model (:mod:`commsched.sim.engine`)
without link sharing, evaluated once per node as it is placed:

* a kernel starts when its stream is free and its predecessors are available, a predecessor on another stream
  (other than a graph input) ``sync_ns`` later; with interference it is stretched while communication is in
  flight (the simulator's slowdown rule) and by ``compute_interference`` times its overlap with kernels already
  placed on the other compute streams (concurrent kernels share the SMs; see :func:`_stretched`);
* a collective is issued from its stream, starts on its group's FIFO comm stream ``sync_ns`` after the issue (and
  after the group's previous collective), and frees its issuing stream at once (a synchronous one at its end);
* a wait unblocks ``sync_ns`` after its collective ends; a hybrid kernel also waits until no collective runs and
  keeps every comm stream busy while it runs.

Nodes are placed in priority order (a topological order: by decreasing upward rank, or the input order), each on
the allowed stream where it finishes first (non-insertion HEFT). The result is a stream per node and the model's
times, from which the pass derives a global order sorted by start time.
"""

from __future__ import annotations

import bisect
from dataclasses import dataclass

import numpy as np

from commsched.ir import Graph, OpKind
from commsched.ir.graph import _csr
from commsched.passes.multi_stream_policy import ROLE_COMM, ROLE_HYBRID, StreamMap

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
        pred_ptr, pred_idx = _csr(n, src, dst)
    else:
        src, pred_ptr, pred_idx = idx.astype(np.int64), ptr, idx
    succ_ptr, succ_idx = _csr(n, dst, src)
    chain_next = np.full(n, -1, np.int64)
    colls = order[g.coll_type[order] >= 0]
    for grp in np.unique(g.coll_group[colls]).tolist():
        seq = colls[g.coll_group[colls] == grp]
        chain_next[seq[:-1]] = seq[1:]
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


def place(
    p: Plan,
    priority: np.ndarray,
    streams: StreamMap,
    sync_ns: int,
    slowdown: float,
    compute_interference: float,
) -> Placement:
    """Place every node, in ``priority`` order, on its allowed stream with the earliest finish time (see the module
    docstring for the model). ``slowdown`` 1 and ``compute_interference`` 0 turn interference off.
    O((N + E) * S + N * (log N + k)), S allowed streams per node, k intervals overlapping a kernel."""
    n, kinds, roles, dur, wait_of, group, is_sync = p.n, p.kinds, p.roles, p.dur_ns, p.wait_of, p.group, p.is_sync
    pp, pi = p.pred_ptr, p.pred_idx
    allowed = [list(ids) for ids in streams.by_role]
    num_streams = streams.num_streams
    stream_free = [0] * num_streams
    group_free = [0] * max(1, p.num_groups)
    comm_busy = [_Intervals() for _ in range(max(1, p.num_groups))]
    kernel_busy = [_Intervals() for _ in range(num_streams)]
    compute_ids = streams.compute_streams
    stream_of = [0] * n
    avail = [0] * n  # when successors may use the node (a collective: its issue)
    start = [0] * n
    end = [0] * n  # a collective: the end of its transfer
    comm_share = 1.0 - 1.0 / slowdown  # wall time lost per unit of overlap with communication
    for i in priority.tolist():
        k = kinds[i]
        role = roles[i]
        best = None  # (finish, tie, stream, start, end, stream_free_after)
        last_pred_stream = -1
        last_pred_t = -1
        for e in range(pp[i], pp[i + 1]):
            q = pi[e]
            if kinds[q] != _INPUT and avail[q] > last_pred_t:
                last_pred_t, last_pred_stream = avail[q], stream_of[q]
        for s in allowed[role]:
            ready = stream_free[s]
            for e in range(pp[i], pp[i + 1]):
                q = pi[e]
                a = avail[q]
                if stream_of[q] != s and kinds[q] != _INPUT:
                    a += sync_ns
                if a > ready:
                    ready = a
            if k == _COLL:
                c_start = max(ready + sync_ns, group_free[group[i]])
                c_end = c_start + dur[i]
                free_after = c_end + sync_ns if is_sync[i] else ready
                cand = (free_after, s != last_pred_stream, s, ready, c_end, free_after)
            elif k == _WAIT:
                t = max(ready, end[wait_of[i]] + sync_ns)
                cand = (t, s != last_pred_stream, s, t, t, t)
            elif k in _KERNEL and dur[i]:
                t0 = ready
                if role == ROLE_HYBRID:
                    t0 = max(t0, max(group_free))
                d = dur[i]
                if comm_share > 0 or compute_interference > 0:
                    others = [kernel_busy[o] for o in compute_ids if o != s]
                    d = _stretched(d, t0, comm_busy, comm_share, others, compute_interference)
                cand = (t0 + d, s != last_pred_stream, s, t0, t0 + d, t0 + d)
            else:
                cand = (ready, s != last_pred_stream, s, ready, ready, ready)
            if best is None or cand[:3] < best[:3]:
                best = cand
        _, _, s, t0, t1, free_after = best
        stream_of[i], start[i], end[i] = s, t0, t1
        stream_free[s] = free_after
        if k == _COLL:
            avail[i] = t1 if is_sync[i] else t0  # successors use a synchronous collective when it ends
            grp = group[i]
            c_start = t1 - dur[i]
            group_free[grp] = t1
            comm_busy[grp].add(c_start, t1)
        else:
            avail[i] = t1
            if k in _KERNEL and t1 > t0:
                kernel_busy[s].add(t0, t1)
                if role == ROLE_HYBRID:
                    for grp in range(len(group_free)):
                        group_free[grp] = max(group_free[grp], t1)
    if not allowed[ROLE_COMM]:
        raise ValueError("no stream for collectives")
    return Placement(
        stream=np.asarray(stream_of, np.int32),
        start_ns=np.asarray(start, np.int64),
        end_ns=np.asarray(end, np.int64),
        makespan_ns=max(max(end, default=0), max(stream_free, default=0)),
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

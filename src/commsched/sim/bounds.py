"""Lower bounds on the makespan of any schedule of a graph on a stream assignment.

``lower_bound = max(busiest compute stream's work, each group's comm work, critical path, interference term)``,
all at standalone speed (interference and link sharing only slow things down, and sync overheads only add time, so
each term bounds every schedule the simulator can produce).

The interference term: while any collective that takes SMs is in flight (every one but a copy-engine transfer:
``commsched.sim.model.takes_sms``), a compute stream either idles or runs ``slowdown`` times slower, so each
wall-clock unit of such communication costs it at least ``1 - 1/slowdown`` units of its work's progress. That
communication of the busiest group lasts at least its standalone comm time ``C``, hence every schedule takes
at least ``W + (1 - 1/slowdown) * C`` for the work ``W`` of any compute stream.

The heads-and-tails term: on one compute stream, kernel ``j`` cannot start before its head ``r_j`` (the longest
path reaching it, communication included) and the step cannot end before ``q_j`` after it ends (the longest path
after it). Every schedule is then at least the optimum of the single-machine relaxation with release times and
delivery times and preemption, which Jackson's preemptive rule (always run the released kernel with the longest tail)
computes in O(N log N): it charges the exposed head (e.g. the first all_gather) and tail (the last reduce_scatter)
that the other terms miss. With several compute streams it bounds the busiest one's kernels only, so it is used for
one stream. The same relaxation on each process group's comm stream (its collectives run one at a time, from their
heads on, and the step cannot end before the collective's wait's tail after it ends) charges what the group sum
misses: communication that cannot start before the forward is done (DDP's gradient all_reduces), or whose results
are needed early. On one compute stream a collective is also released no earlier than the work of all its
ancestors (they run one at a time) and delivered no earlier than the work of everything after its end.

The exposed-communication term: on one compute stream, a collective ``c`` can only run beside the work that is
neither an ancestor of it nor after its end (its wait's descendants): ``free(c) = W - bound(c)``. Each group's
collectives run one at a time, so the step lasts at least ``W + sum over the group of max(0, dur(c) - free(c))``:
a TP collective between the two matmuls that need it adds its whole duration.

Interference and exposed ends together: write ``T = B + I`` for the compute stream's busy and idle time. Progress
during busy time is ``W = |B \\ F| + |B & F| / slowdown`` with ``F`` the time any collective runs, and
``|B & F| >= |F| - |I| >= C - |I|``, so ``T >= W + (1 - 1/slowdown) * C + |I| / slowdown``. Idle time is forced at
both ends: in ``[0, a]`` only kernels with head ``< a`` can run, each for at most ``slowdown`` x its time, so at least
``a - slowdown * (their work)`` of it is idle; the same holds in ``[T - b, T]`` for kernels with tail ``< b``. Both
windows are disjoint when ``a + b`` is at most another bound on ``T``, and their idle times then add up.

The critical path follows the simulator's rules: an asynchronous
collective is available to its successors when issued, its wait only after its standalone duration.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import numpy as np

from commsched.ir.graph import Graph, OpKind
from commsched.sim.bounds_jit import heads_ns, tails_ns
from commsched.sim.jit import ENABLED as JIT_ENABLED


@dataclass(frozen=True)
class LowerBound:
    compute_s: float  # work of the busiest compute stream
    comm_s: dict[str, float]  # per process group: its collectives back to back
    critical_path_s: float
    interference_s: float = 0.0  # compute work plus the least progress lost while communication is in flight
    heads_tails_s: float = 0.0  # preemptive single-stream relaxation with release and delivery times
    comm_heads_tails_s: dict[str, float] | None = None  # the same relaxation on each group's comm stream
    exposed_comm_s: dict[str, float] | None = None  # per group: work plus what no schedule can hide (one stream)

    @property
    def value_s(self) -> float:
        return max(
            self.compute_s,
            max(self.comm_s.values(), default=0.0),
            self.critical_path_s,
            self.interference_s,
            self.heads_tails_s,
            max((self.comm_heads_tails_s or {}).values(), default=0.0),
            max((self.exposed_comm_s or {}).values(), default=0.0),
        )

    @property
    def binding(self) -> str:
        """Which term sets the bound: 'compute', 'comm:<group>' or 'critical path'."""
        terms = {
            "compute": self.compute_s,
            "critical path": self.critical_path_s,
            "compute + interference": self.interference_s,
            "heads and tails": self.heads_tails_s,
        }
        terms.update({f"comm:{k}": v for k, v in self.comm_s.items()})
        terms.update({f"comm heads and tails:{k}": v for k, v in (self.comm_heads_tails_s or {}).items()})
        terms.update({f"exposed comm:{k}": v for k, v in (self.exposed_comm_s or {}).items()})
        return max(terms, key=terms.__getitem__)


def _node_arrays(g: Graph, dur_ns: np.ndarray) -> tuple[np.ndarray, ...]:
    """What the head / tail loops read per node: durations, kind, the collective a wait waits for, whether successors
    may use the node from its issue on (an asynchronous collective); then the wait kind."""
    issue_only = (g.kinds == OpKind.COLLECTIVE) & ~g.coll_sync
    dur = np.asarray(dur_ns, np.int64)
    return dur, g.kinds.astype(np.int64), g.wait_of.astype(np.int64), issue_only, int(OpKind.WAIT)


def _loop(fn: Any) -> Any:
    """``fn`` compiled, or its Python source when the compiled loops are off (:mod:`commsched.sim.jit`)."""
    return fn if JIT_ENABLED else getattr(fn, "py_func", fn)


def heads(g: Graph, dur_ns: np.ndarray) -> list[int]:
    """Per node: its earliest start under the simulator's availability rules (successors may use an async
    collective from its issue on, its wait only after its duration; everything else from its end). O(N + E)."""
    ptr, idx = g.predecessors_csr()
    return _loop(heads_ns)(ptr, idx, *_node_arrays(g, dur_ns)).tolist()


def critical_path_ns(g: Graph, dur_ns: np.ndarray) -> int:
    """Longest path in ns under the simulator's availability rules (see :func:`heads`). O(N + E)."""
    head = heads(g, dur_ns)
    dur = dur_ns.tolist()
    return max((h + d for h, d in zip(head, dur)), default=0)


def heads_and_tails(g: Graph, dur_ns: np.ndarray) -> tuple[list[int], list[int]]:
    """Per node: its head (:func:`heads`) and tail (least time from its end to the end of the step; for an async
    collective, from its issue). O(N + E)."""
    sptr, sidx = g.successors_csr()
    return heads(g, dur_ns), _loop(tails_ns)(sptr, sidx, *_node_arrays(g, dur_ns)).tolist()


def preemptive_jackson_ns(release: list[int], work: list[int], delivery: list[int]) -> int:
    """Optimum of one machine with release and delivery times and preemption (Jackson's preemptive rule: always
    run the released job with the longest delivery time). O(N log N)."""
    import heapq

    order = np.argsort(np.asarray(release, np.int64), kind="stable").tolist()
    n = len(order)
    t = best = 0
    k = 0
    heap: list[tuple[int, int]] = []  # (-delivery, job) of released jobs waiting for the machine
    rem = list(work)
    cur = -1  # the job on the machine
    while k < n or heap or cur >= 0:
        if cur < 0:
            if heap:
                cur = heapq.heappop(heap)[1]
            else:
                t = max(t, release[order[k]])
                while k < n and release[order[k]] <= t:
                    heapq.heappush(heap, (-delivery[order[k]], order[k]))
                    k += 1
                continue
        nxt = release[order[k]] if k < n else None
        if nxt is None or t + rem[cur] <= nxt:
            t += rem[cur]
            rem[cur] = 0
            best = max(best, t + delivery[cur])
            cur = -1
            continue
        rem[cur] -= nxt - t
        t = nxt
        while k < n and release[order[k]] <= t:
            j = order[k]
            k += 1
            if delivery[j] > delivery[cur]:
                heapq.heappush(heap, (-delivery[cur], cur))  # preempted: the new job is more urgent
                cur = j
            else:
                heapq.heappush(heap, (-delivery[j], j))
    return best


def forced_idle_ns(times: list[int], work: list[int], slowdown: float) -> list[tuple[int, float]]:
    """``(a, idle)`` pairs with ``idle > 0``: at least ``idle`` ns of ``[0, a]`` pass with no kernel running when kernel
    ``j`` cannot run before ``times[j]`` and runs at most ``slowdown`` x ``work[j]`` (one candidate ``a`` per distinct
    time: just when the next kernels become available). O(N log N)."""
    if not times:
        return []
    t = np.asarray(times, np.int64)
    w = np.asarray(work, np.float64)
    order = np.argsort(t, kind="stable")
    t, w = t[order], w[order]
    before = np.concatenate([[0.0], np.cumsum(w)[:-1]])  # work of the kernels strictly ahead in the sorted order
    first = np.concatenate([[True], t[1:] != t[:-1]])  # first kernel of each distinct time: all earlier ones are < t
    idle = t[first] - slowdown * before[first]
    keep = idle > 0
    return list(zip(t[first][keep].tolist(), idle[keep].tolist()))


def interference_with_idle_ns(
    work_ns: float, comm_ns: float, slowdown: float, head_idle, tail_idle, other_bound_ns: float
) -> float:
    """The interference term plus the idle time forced at both ends of the step (module docstring), for the best
    pair of windows that fit in ``other_bound_ns``. Pairs: ``forced_idle_ns`` outputs; O(64^2)."""
    base = work_ns + (1.0 - 1.0 / slowdown) * comm_ns
    heads = [*sorted(head_idle, key=lambda x: -x[1])[:64], (0, 0.0)]
    tails = [*sorted(tail_idle, key=lambda x: -x[1])[:64], (0, 0.0)]
    best = 0.0
    for a, ia in heads:
        for b, ib in tails:
            if a + b <= other_bound_ns and ia + ib > best:
                best = ia + ib
    return base + best / slowdown


def comm_heads_tails_ns(
    g: Graph, dur_ns: np.ndarray, head: list[int], tail: list[int], tied: np.ndarray | None = None
) -> dict[str, int]:
    """Per process group: the preemptive single-machine optimum of its collectives on its comm stream, each released
    at its head and delivered after its end by its wait's tail (a synchronous collective's own tail). ``tied``
    (one compute stream, :func:`tied_work_ns`): a collective is also released no earlier than the work before it
    and delivered no earlier than the work after it, each run one kernel at a time."""
    dur = dur_ns.tolist()
    colls = np.flatnonzero(g.coll_type >= 0).tolist()
    delivery = {c: tail[c] if g.coll_sync[c] else 0 for c in colls}
    for w in np.flatnonzero(g.wait_of >= 0).tolist():
        c = int(g.wait_of[w])
        delivery[c] = max(delivery[c], dur[w] + tail[w])
    release = {c: head[c] for c in colls}
    if tied is not None:
        for k, c in enumerate(colls):
            release[c] = max(release[c], int(tied[0, k]))
            delivery[c] = max(delivery[c], int(tied[1, k]))
    by_group: dict[int, list[int]] = {}
    for c in colls:
        if dur[c] > 0:
            by_group.setdefault(int(g.coll_group[c]), []).append(c)
    out = {}
    for k, grp in enumerate(g.groups):
        mine = by_group.get(k, [])
        rel, work, dlv = [release[c] for c in mine], [dur[c] for c in mine], [delivery[c] for c in mine]
        out[grp.name] = preemptive_jackson_ns(rel, work, dlv) if mine else 0
    return out


EXPOSED_TERM_MAX_WORDS = 1 << 22
"""above this many bit words (nodes x collectives / 64 x 2) the terms that need each collective's ancestry (the
exposed communication, the comm streams' releases and deliveries by work) are left out"""


def tied_work_ns(g: Graph, dur_ns: np.ndarray, kernel: np.ndarray) -> np.ndarray | None:
    """``(2, collectives)``, collectives in node order: the work of the ``kernel`` nodes that must end before each
    starts, and of those that cannot start before it ends. None when the graph is too large for the bit sets
    (:data:`EXPOSED_TERM_MAX_WORDS`)."""
    from commsched.sim.bounds_jit import bound_compute_ns

    colls = np.flatnonzero(g.coll_type >= 0)
    if not len(colls) or len(g) * ((len(colls) + 63) // 64) * 2 > EXPOSED_TERM_MAX_WORDS:
        return None
    coll_index = np.full(len(g), -1, np.int64)
    coll_index[colls] = np.arange(len(colls))
    done = np.full(len(g), -1, np.int64)
    waits = np.flatnonzero(g.wait_of >= 0)
    done[waits] = coll_index[g.wait_of[waits]]
    sync = colls[g.coll_sync[colls]]
    done[sync] = coll_index[sync]
    work = np.where(kernel, dur_ns, 0).astype(np.int64)
    csr = (*g.predecessors_csr(), *g.successors_csr())
    return bound_compute_ns(*(np.ascontiguousarray(a, np.int64) for a in csr), coll_index, done, work, len(colls))


def exposed_comm_ns(g: Graph, dur_ns: np.ndarray, kernel: np.ndarray, tied: np.ndarray) -> dict[str, int]:
    """Per process group: the exposed-communication term (module docstring) for one compute stream running the
    ``kernel`` nodes, from their :func:`tied_work_ns`."""
    colls = np.flatnonzero(g.coll_type >= 0)
    total = int(dur_ns[kernel].sum())
    exposed = np.maximum(0, dur_ns[colls].astype(np.int64) - (total - tied[0] - tied[1]))
    per_group = np.bincount(g.coll_group[colls], weights=exposed, minlength=len(g.groups))
    return {grp.name: total + int(per_group[k]) for k, grp in enumerate(g.groups) if per_group[k] > 0}


def lower_bound(g: Graph, dur_ns: np.ndarray, compute_stream: np.ndarray, slowdown: float = 1.0,
                sms: np.ndarray | None = None) -> LowerBound:  # fmt: skip
    """The bound for per-node standalone durations ``dur_ns``, the compute stream of each non-collective node and
    the compute slowdown while communication is in flight; ``sms``: the collectives that slow compute
    (:func:`commsched.sim.model.takes_sms`; default every one): the interference term counts only theirs."""
    is_coll = g.coll_type >= 0
    slows = is_coll if sms is None else is_coll & sms
    sm_comm = np.bincount(g.coll_group[slows], weights=dur_ns[slows], minlength=len(g.groups))
    busiest_sm_comm = float(sm_comm.max(initial=0.0))
    work = np.bincount(compute_stream[~is_coll], weights=dur_ns[~is_coll]) if (~is_coll).any() else np.zeros(1)
    comm = np.bincount(g.coll_group[is_coll], weights=dur_ns[is_coll], minlength=len(g.groups))
    busiest_work = float(work.max(initial=0.0))
    heads_tails = 0
    head = tail = kernels = None
    if not len(work) or len(work) == 1 or np.count_nonzero(work) <= 1:
        head, tail = heads_and_tails(g, dur_ns)
        kernels = np.flatnonzero(~is_coll & (dur_ns > 0)).tolist()
        heads_tails = preemptive_jackson_ns(
            [head[j] for j in kernels], [int(dur_ns[j]) for j in kernels], [tail[j] for j in kernels]
        )
    busiest_comm = float(comm.max(initial=0.0))
    comm_ht: dict[str, int] = {}
    exposed: dict[str, int] = {}
    if is_coll.any():
        if head is None:
            head, tail = heads_and_tails(g, dur_ns)
        tied = None
        if kernels is not None:  # one compute stream
            kernel = ~is_coll & (dur_ns > 0)
            tied = tied_work_ns(g, dur_ns, kernel)
            if tied is not None:
                exposed = exposed_comm_ns(g, dur_ns, kernel, tied)
        comm_ht = comm_heads_tails_ns(g, dur_ns, head, tail, tied)
    slowdown = max(1.0, slowdown)
    critical = (
        critical_path_ns(g, dur_ns) if head is None else max((h + d for h, d in zip(head, dur_ns.tolist())), default=0)
    )
    interference = busiest_work + (1.0 - 1.0 / slowdown) * busiest_sm_comm
    if kernels:
        others = max(busiest_work, busiest_comm, critical, heads_tails, interference, *comm_ht.values(),
                     *exposed.values())  # fmt: skip
        kwork = [int(dur_ns[j]) for j in kernels]
        interference = interference_with_idle_ns(
            busiest_work,
            busiest_sm_comm,
            slowdown,
            forced_idle_ns([head[j] for j in kernels], kwork, slowdown),
            forced_idle_ns([tail[j] for j in kernels], kwork, slowdown),
            others,
        )
    return LowerBound(
        compute_s=busiest_work * 1e-9,
        comm_s={grp.name: float(comm[k]) * 1e-9 for k, grp in enumerate(g.groups)},
        critical_path_s=critical * 1e-9,
        interference_s=interference * 1e-9,
        heads_tails_s=heads_tails * 1e-9,
        comm_heads_tails_s={k: v * 1e-9 for k, v in comm_ht.items()},
        exposed_comm_s={k: v * 1e-9 for k, v in exposed.items()},
    )

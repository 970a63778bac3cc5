"""One list-scheduling attempt of the ``overlap`` pass: a short loop that, at the compute stream's current time,
runs the waits that cost nothing, issues what it can, then runs the best ready kernel, else waits for the collective
that ends first. The timing rules are the stream model's (:class:`commsched.sim.model.StreamModel`): FIFO comm stream
per group, waits released when their collective ends, kernels slowed while communication is in flight.

Heaps hold plain tuples (fast to compare); their layouts are named where they are declared.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Literal, get_args

import numpy as np

from commsched.passes.overlap_prep import Prep, range_max
from commsched.sim.jit import ENABLED as JIT_ENABLED

Priority = Literal["feeds", "feeders", "input", "nearest"]
PRIORITIES: tuple[str, ...] = get_args(Priority)
"""how ready compute is ranked: "feeds" (what feeds the earliest collective, then the longest path to the end),
"input" (the input order), "feeders" (the input order, except that what is about to release a collective of the
busiest group goes first), "nearest" (what issues a collective soonest, i.e. the least kernel time from its end to a
collective's issue, then the longest path to the end: a chunk's norm between its reduce_scatter and its
all_gather ahead of the other chunk's matmuls)"""

_PEEK = 8  # ready kernels looked at for one that fits the budget before waiting for a collective instead


@dataclass
class Attempt:
    """One list-scheduling result with the model's timing."""

    order: list[int]
    at: list[int]  # per node: compute-stream time when it runs (issue time for a collective)
    comm_start: dict[int, int]
    comm_end: dict[int, int]
    arrays: tuple | None = None  # (order, at, comm_start, comm_end) as int64 arrays, from the compiled loop


def _rank_keys(p: Prep, priority: str) -> tuple[list[int], list[int]]:
    """(first key, second key) of ready compute for ``priority``; smaller runs first (the second is negated)."""
    if priority == "feeds":
        return p.feeds, [-b for b in p.bottom]
    if priority == "input":
        return p.pos, [0] * p.n
    if priority == "feeders":
        return [0 if f else 1 for f in p.feeder], [0] * p.n
    if priority == "nearest":
        return p.nearest, [-b for b in p.bottom]
    raise ValueError(f"priority={priority!r}: expected one of {', '.join(PRIORITIES)}")


def rank_arrays(p: Prep, priority: str) -> tuple[np.ndarray, np.ndarray]:
    """The ready-compute keys of ``priority`` (:func:`_rank_keys`) as int64 arrays, for the compiled loop (cached on
    ``p``)."""
    key = ("rank", priority)
    if key not in p.cache:
        k1, k2 = _rank_keys(p, priority)
        p.cache[key] = (np.asarray(k1, np.int64), np.asarray(k2, np.int64))
    return p.cache[key]


class ListScheduler:
    """The state of one attempt; :meth:`run` is the loop, the other methods are its handlers."""

    def __init__(self, p: Prep, budget: int, not_before: dict[int, int], priority: str, guard: bool) -> None:
        self.p, self.budget, self.not_before, self.guard = p, budget, not_before, guard
        self.key1, self.key2 = _rank_keys(p, priority)
        self.indeg = list(p.indeg)
        self.users_left = list(p.storage_users)  # per storage: users not yet run (the last one frees it)
        self.live_bytes = p.persistent_bytes
        self.done = [False] * p.n
        self.front = 0  # first position of the input order not yet run (the memory guard's reference)
        self.t = 0  # the compute stream's clock
        self.comm_busy_until = 0  # the latest end of any collective issued so far
        self.group_free: dict[int, int] = {}
        self.attempt = Attempt([], [0] * p.n, {}, {})
        self.ready: list[tuple[int, int, int, int]] = []  # compute: (key1, key2, input position, node)
        self.deferred: list[tuple[int, int, int, int, int]] = []  # compute held back: (not_before, *ready entry)
        self.issuable: list[tuple[int, int]] = []  # collectives: (input position, node)
        self.waits: list[tuple[int, int, int]] = []  # waits: (release time, input position, node)

    # ------------------------------------------------------------------ the loop
    def run(self) -> Attempt:
        for node in range(self.p.n):
            if self.indeg[node] == 0:
                self.make_ready(node)
        order, n = self.attempt.order, self.p.n
        while len(order) < n:
            if self.deferred:
                self.release_deferred()
            # free waits first: a collective they unlock competes for the budget with those issuable already
            freed = self.run_free_waits() if self.waits and self.waits[0][0] <= self.t else False
            if (self.issue_what_fits() if self.issuable else False) or freed:
                continue
            if self.ready and self.run_compute():
                continue
            if self.waits:
                self.wait_first()
            elif self.issuable:
                self.issue(heapq.heappop(self.issuable)[1])  # nothing else can run: issue regardless
            else:
                raise RuntimeError("overlap scheduler made no progress: the ordering constraints have a cycle")
        return self.attempt

    # ------------------------------------------------------------------ handlers
    def issue_what_fits(self) -> bool:
        """Issue collectives in input order while the next one's not_before time has come and it fits the budget
        (or nothing else could run). Whether any was issued."""
        issued = False
        while self.issuable:
            c = self.issuable[0][1]
            if (self.not_before.get(c, 0) > self.t or not self.fits(c)) and (self.ready or self.waits):
                break
            heapq.heappop(self.issuable)
            self.issue(c)
            issued = True
        return issued

    def issue(self, c: int) -> None:
        """Issue collective ``c`` now: it queues on its group's FIFO comm stream (a synchronous one holds the
        compute stream until it ends)."""
        p, a = self.p, self.attempt
        grp = p.group[c]
        free = self.group_free.get(grp, 0)
        start = p.model.comm_start_ns(self.t, free)
        end = start + p.dur_ns[c]
        a.comm_start[c], a.comm_end[c] = start, end
        self.group_free[grp] = end
        if end > self.comm_busy_until:
            self.comm_busy_until = end
        if p.is_sync[c]:
            self.t = p.model.wait_release_ns(end)
        self.commit(c)

    def run_free_waits(self) -> bool:
        """Run every wait whose collective is already over (it costs nothing). Whether any ran."""
        ran = False
        while self.waits and self.waits[0][0] <= self.t:
            self.commit(heapq.heappop(self.waits)[2])
            ran = True
        return ran

    def wait_first(self) -> None:
        """Nothing else can run: block the compute stream on the wait released first."""
        release, _, w = heapq.heappop(self.waits)
        if release > self.t:
            self.t = release
        self.commit(w)

    def run_compute(self) -> bool:
        """Run the best of the first few ready kernels that fits the budget (any, if no wait is pending), advancing
        the clock by its time under interference. Whether one ran."""
        ready = self.ready
        entry = heapq.heappop(ready)
        if self.waits and not self.fits(entry[3]):
            picked, skipped = -1, [entry]
            while ready and len(skipped) < _PEEK:
                entry = heapq.heappop(ready)
                if self.fits(entry[3]):
                    picked = entry[3]
                    break
                skipped.append(entry)
            for skip in skipped:
                heapq.heappush(ready, skip)
            if picked < 0:
                return False
        else:
            picked = entry[3]
        self.commit(picked)  # at its start time; then the stream advances by its (slowed) duration
        self.t = self.kernel_end(self.t, self.p.dur_ns[picked])
        return True

    def kernel_end(self, t: int, work: int) -> int:
        """End of ``work`` ns of kernel work from ``t``: slowed (the model's rate) while any issued collective may
        still run, i.e. up to the latest planned end (planning ignores the gaps between collectives)."""
        model, busy_until = self.p.model, self.comm_busy_until
        if not work or busy_until <= t:
            return t + work
        work_in_overlap = model.kernel_work_ns(busy_until - t, True)
        if work <= work_in_overlap:
            return t + int(model.kernel_wall_ns(work, True))
        return busy_until + int(model.kernel_wall_ns(work - work_in_overlap, False))

    def release_deferred(self) -> None:
        """Compute held back by not_before becomes ready when its time has come or nothing else could run."""
        deferred = self.deferred
        while deferred and (deferred[0][0] <= self.t or not (self.ready or self.waits or self.issuable)):
            heapq.heappush(self.ready, heapq.heappop(deferred)[1:])

    # ------------------------------------------------------------------ bookkeeping
    def make_ready(self, node: int) -> None:
        """``node``'s predecessors have all run: queue it by kind."""
        p = self.p
        if p.is_coll[node]:
            heapq.heappush(self.issuable, (p.pos[node], node))
        elif p.is_wait[node]:
            release = p.model.wait_release_ns(self.attempt.comm_end[p.wait_of[node]])
            heapq.heappush(self.waits, (release, p.pos[node], node))
        else:
            entry = (self.key1[node], self.key2[node], p.pos[node], node)
            nb = self.not_before.get(node, 0)
            if nb > self.t:
                heapq.heappush(self.deferred, (nb, *entry))
            else:
                heapq.heappush(self.ready, entry)

    def commit(self, node: int) -> None:
        """Append ``node`` to the order at the current time: allocate, free what it used last, release successors."""
        p = self.p
        self.done[node] = True
        self.attempt.at[node] = self.t
        self.live_bytes += p.alloc[node]
        left, storage_bytes = self.users_left, p.storage_bytes
        for s in p.node_storages[node]:
            left[s] -= 1
            if left[s] == 0:
                self.live_bytes -= storage_bytes[s]
        self.attempt.order.append(node)
        indeg = self.indeg
        for s in p.succ_idx[p.succ_ptr[node] : p.succ_ptr[node + 1]]:
            indeg[s] -= 1
            if indeg[s] == 0:
                self.make_ready(s)

    def fits(self, node: int) -> bool:
        """Whether running ``node`` now keeps memory within the budget. With the guard, running it ahead of the
        input order's frontier must also fit later: its bytes stay allocated until the input order would free them,
        on top of what the input order needs meanwhile (range maximum of its curve) and what this schedule already
        holds in excess of it."""
        p = self.p
        if not self.guard:
            return self.live_bytes + p.alloc[node] <= self.budget
        io, done = p.input_order, self.done
        while self.front < p.n and done[io[self.front]]:
            self.front += 1
        front, k = self.front, p.pos[node]
        if k <= front:
            return self.live_bytes + p.alloc[node] <= self.budget
        excess = self.live_bytes - (p.input_after[front - 1] if front else p.persistent_bytes)
        ahead = range_max(p.input_max, front, k - 1) + p.alloc[node]
        hi = p.release_pos[node]
        if hi >= k:
            held = range_max(p.input_max, k, hi)
            ahead = ahead if ahead > held else held
        return excess + ahead <= self.budget


def schedule_once(
    p: Prep, budget: int, not_before: dict[int, int] | None = None, priority: str = "feeds", guard: bool = True
) -> Attempt:
    """List scheduling with the stream model (see the ``overlap`` module docstring).

    A collective is issued as soon as it is next in its group's order and its inputs are done, unless its
    ``not_before`` time has not come or it does not fit the budget while something else can run meanwhile; a kernel
    runs only if its allocation fits ``budget`` and its ``not_before`` time has come (unless nothing else can make
    progress). Ready compute is taken by ``priority`` (:data:`PRIORITIES`); ``guard``: see
    :meth:`ListScheduler.fits`. O((N + E) log N). Runs compiled (:mod:`commsched.passes.overlap_jit`, identical
    results) when numba is available."""
    if JIT_ENABLED:
        return _schedule_once_compiled(p, budget, not_before or {}, priority, guard)
    return ListScheduler(p, budget, not_before or {}, priority, guard).run()


def _schedule_once_compiled(p: Prep, budget: int, not_before: dict[int, int], priority: str, guard: bool) -> Attempt:
    from commsched.passes.overlap_jit import prep_arrays, schedule_once_jit

    ar = prep_arrays(p)
    key1, key2 = rank_arrays(p, priority)
    nb = np.zeros(p.n, np.int64)
    for node, t in not_before.items():
        nb[node] = t
    order, at, start, end, complete = schedule_once_jit(ar, key1, key2, int(budget), nb, bool(guard))
    if not complete:
        raise RuntimeError("overlap scheduler made no progress: the ordering constraints have a cycle")
    order_l = order.tolist()
    is_coll = ar.is_coll
    colls = order[is_coll[order]].tolist()  # in issue order, as the Python loop fills its dicts
    start_l, end_l = start.tolist(), end.tolist()
    comms = ({c: start_l[c] for c in colls}, {c: end_l[c] for c in colls})
    return Attempt(order_l, at.tolist(), *comms, (order, at, start, end))

"""The ``overlap`` pass's list-scheduling attempt and its tightening, compiled (:mod:`commsched.sim.jit`).

:func:`schedule_once_jit` is :class:`commsched.passes.overlap_list.ListScheduler` statement for statement, on
arrays: the same handlers (issue what fits, free waits, best ready kernel, wait for the first collective), the same
heap keys (all unique, so any binary heap pops them in the same order), the same memory guard; the timing rules are
:mod:`commsched.sim.model`'s scalar functions, compiled. :func:`tighten_jit` is
:func:`commsched.passes.overlap_orders.tighten`, and :func:`kahn_jit` the keyed topological sort it ends with
(:func:`commsched.ir.transform.kahn_order`). The pure-Python forms stay as the readable specification and run
where numba is missing; ``tests/passes/test_overlap_jit.py`` checks both give identical attempts and orders.
This module takes a ``Prep`` by its attributes and imports no other ``overlap_*`` module: they import it.
"""

from __future__ import annotations

import heapq
from typing import NamedTuple

import numpy as np

from commsched.sim import model as _model
from commsched.sim.jit import njit, njit_inline

_PEEK = 8  # as overlap_list._PEEK: ready kernels looked at for one that fits before waiting for a collective

_comm_start = njit(_model.comm_start_rule)
_wait_release = njit(_model.wait_release_rule)
_latest_issue = njit(_model.latest_issue_rule)
_kernel_wall = njit(_model.kernel_wall_rule)
_kernel_work = njit(_model.kernel_work_rule)


class PrepArrays(NamedTuple):
    """A :class:`~commsched.passes.overlap_prep.Prep` as arrays (int64 unless noted) for the compiled loops."""

    n: int
    num_groups: int
    sync_ns: int
    compute_slowdown: float
    persistent_bytes: int
    dur_ns: np.ndarray
    is_coll: np.ndarray  # bool
    is_wait: np.ndarray  # bool
    is_sync: np.ndarray  # bool
    group: np.ndarray
    wait_of: np.ndarray
    pos: np.ndarray
    alloc: np.ndarray
    ns_ptr: np.ndarray  # CSR node -> freeable storages it uses
    ns_idx: np.ndarray
    storage_users: np.ndarray
    storage_bytes: np.ndarray
    input_order: np.ndarray
    input_after: np.ndarray
    input_max: np.ndarray  # 2-D: row k is the sparse table's row k, padded
    log2: np.ndarray  # floor(log2(i)) for i in 0..n (0 for 0)
    release_pos: np.ndarray
    succ_ptr: np.ndarray
    succ_idx: np.ndarray
    indeg: np.ndarray


def _shared_arrays(p) -> dict:
    """The chain-independent arrays of ``p``, built once per :class:`GraphPrep` (shared by its Preps)."""
    sh = p.shared
    if "dur_ns" in sh:
        return sh
    n = p.n
    i64 = np.int64
    sh["dur_ns"] = np.asarray(p.dur_ns, i64)
    sh["is_coll"] = np.asarray(p.is_coll, np.bool_)
    sh["is_wait"] = np.asarray(p.is_wait, np.bool_)
    sh["is_sync"] = np.asarray(p.is_sync, np.bool_)
    sh["group"] = np.asarray(p.group, i64)
    sh["wait_of"] = np.asarray(p.wait_of, i64)
    sh["pos"] = np.asarray(p.pos, i64)
    sh["alloc"] = np.asarray(p.alloc, i64)
    lens = [len(x) for x in p.node_storages]
    sh["ns_ptr"] = np.concatenate([[0], np.cumsum(lens)]).astype(i64)
    sh["ns_idx"] = np.asarray([s for x in p.node_storages for s in x], i64)
    sh["storage_users"] = np.asarray(p.storage_users, i64)
    sh["storage_bytes"] = np.asarray(p.storage_bytes, i64)
    sh["input_order"] = np.asarray(p.input_order, i64)
    sh["input_after"] = np.asarray(p.input_after, i64)
    table = np.zeros((max(len(p.input_max), 1), max(n, 1)), i64)
    for k, row in enumerate(p.input_max):
        table[k, : len(row)] = row
    sh["input_max"] = table
    log2 = np.zeros(n + 2, i64)
    for i in range(2, n + 2):
        log2[i] = log2[i // 2] + 1
    sh["log2"] = log2
    sh["release_pos"] = np.asarray(p.release_pos, i64)
    sh["num_groups"] = max(p.group, default=-1) + 1
    return sh


def prep_arrays(p) -> PrepArrays:
    """``p`` as :class:`PrepArrays` (cached on ``p``)."""
    if "arrays" in p.cache:
        return p.cache["arrays"]
    sh = _shared_arrays(p)
    model = p.model
    ar = PrepArrays(
        n=p.n, num_groups=sh["num_groups"], sync_ns=int(model.sync_ns), compute_slowdown=float(model.compute_slowdown),
        persistent_bytes=int(p.persistent_bytes),
        **{k: sh[k] for k in ("dur_ns", "is_coll", "is_wait", "is_sync", "group", "wait_of", "pos", "alloc", "ns_ptr",
                              "ns_idx", "storage_users", "storage_bytes", "input_order", "input_after", "input_max",
                              "log2", "release_pos")},
        **dict(zip(("succ_ptr", "succ_idx", "indeg"), p.cache.get("csr") or _csr_arrays(p), strict=True)),
    )  # fmt: skip
    p.cache["arrays"] = ar
    return ar


def _csr_arrays(p) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    return tuple(np.asarray(x, np.int64) for x in (p.succ_ptr, p.succ_idx, p.indeg))


def chain_arrays(p) -> tuple[np.ndarray, np.ndarray]:
    """``p.chains`` as CSR (ptr, collectives), groups in the dict's order (cached on ``p``)."""
    if "chains" not in p.cache:
        lens = [len(chain) for chain in p.chains.values()]
        ptr = np.concatenate([[0], np.cumsum(lens)]).astype(np.int64)
        idx = np.asarray([c for chain in p.chains.values() for c in chain], np.int64)
        p.cache["chains"] = (ptr, idx)
    return p.cache["chains"]


# state slots of one attempt (an int64 array, so the handlers can update them)
_T, _LIVE, _FRONT, _BUSY, _COUNT = 0, 1, 2, 3, 4


@njit_inline
def _range_max(table, log2, lo, hi):
    k = log2[hi - lo + 1]
    a = table[k, lo]
    b = table[k, hi - (1 << k) + 1]
    return a if a > b else b


@njit_inline
def _fits(ar, st, done, node, budget, guard):
    """ListScheduler.fits."""
    alloc = ar.alloc[node]
    if not guard:
        return st[_LIVE] + alloc <= budget
    io, n = ar.input_order, ar.n
    front = st[_FRONT]
    while front < n and done[io[front]]:
        front += 1
    st[_FRONT] = front
    k = ar.pos[node]
    if k <= front:
        return st[_LIVE] + alloc <= budget
    excess = st[_LIVE] - (ar.input_after[front - 1] if front else ar.persistent_bytes)
    ahead = _range_max(ar.input_max, ar.log2, front, k - 1) + alloc
    hi = ar.release_pos[node]
    if hi >= k:
        held = _range_max(ar.input_max, ar.log2, k, hi)
        ahead = ahead if ahead > held else held
    return excess + ahead <= budget


@njit_inline
def _make_ready(ar, st, node, key1, key2, not_before, comm_end, ready, deferred, issuable, waits):
    if ar.is_coll[node]:
        heapq.heappush(issuable, (ar.pos[node], node))
    elif ar.is_wait[node]:
        release = _wait_release(comm_end[ar.wait_of[node]], ar.sync_ns)
        heapq.heappush(waits, (release, ar.pos[node], node))
    else:
        nb = not_before[node]
        if nb > st[_T]:
            heapq.heappush(deferred, (nb, key1[node], key2[node], ar.pos[node], node))
        else:
            heapq.heappush(ready, (key1[node], key2[node], ar.pos[node], node))


@njit_inline
def _commit(ar, st, node, done, at, order, indeg, users_left, key1, key2, not_before, comm_end, ready, deferred,
            issuable, waits):  # fmt: skip
    done[node] = True
    at[node] = st[_T]
    live = st[_LIVE] + ar.alloc[node]
    for e in range(ar.ns_ptr[node], ar.ns_ptr[node + 1]):
        s = ar.ns_idx[e]
        users_left[s] -= 1
        if users_left[s] == 0:
            live -= ar.storage_bytes[s]
    st[_LIVE] = live
    order[st[_COUNT]] = node
    st[_COUNT] += 1
    for e in range(ar.succ_ptr[node], ar.succ_ptr[node + 1]):
        s = ar.succ_idx[e]
        indeg[s] -= 1
        if indeg[s] == 0:
            _make_ready(ar, st, s, key1, key2, not_before, comm_end, ready, deferred, issuable, waits)


@njit_inline
def _kernel_end(ar, st, t, work):
    busy_until = st[_BUSY]
    if not work or busy_until <= t:
        return t + work
    work_in_overlap = _kernel_work(busy_until - t, True, ar.compute_slowdown)
    if work <= work_in_overlap:
        return t + int(_kernel_wall(work, True, ar.compute_slowdown))
    return busy_until + int(_kernel_wall(work - work_in_overlap, False, ar.compute_slowdown))


@njit_inline
def _release_deferred(st, ready, deferred, issuable, waits):
    """ListScheduler.release_deferred."""
    while deferred and (deferred[0][0] <= st[_T] or not (ready or waits or issuable)):
        e = heapq.heappop(deferred)
        heapq.heappush(ready, (e[1], e[2], e[3], e[4]))


@njit_inline
def _pick_compute(ar, st, done, budget, guard, ready, waits, skipped):
    """The kernel ListScheduler.run_compute runs (taken off the ready heap), or -1 when none fits."""
    entry = heapq.heappop(ready)
    if not waits or _fits(ar, st, done, entry[3], budget, guard):
        return entry[3]
    picked = -1
    skipped.clear()
    skipped.append(entry)
    while ready and len(skipped) < _PEEK:
        entry = heapq.heappop(ready)
        if _fits(ar, st, done, entry[3], budget, guard):
            picked = entry[3]
            break
        skipped.append(entry)
    for skip in skipped:
        heapq.heappush(ready, skip)
    return picked


@njit
def schedule_once_jit(ar, key1, key2, budget, not_before, guard):
    """One attempt (see :func:`commsched.passes.overlap_list.schedule_once`); ``ar``: the Prep's arrays
    (:func:`prep_arrays`), ``not_before``: per node (0: none). Returns (order, at, comm_start, comm_end, complete):
    comm times -1 for non-collectives; ``complete`` False when the constraints have a cycle."""
    n = ar.n
    st = np.zeros(5, np.int64)
    done = np.zeros(n, np.bool_)
    at = np.zeros(n, np.int64)
    order = np.empty(n, np.int64)
    indeg = ar.indeg.copy()
    users_left = ar.storage_users.copy()
    st[_LIVE] = ar.persistent_bytes
    group_free = np.zeros(ar.num_groups, np.int64)
    comm_start = np.full(n, -1, np.int64)
    comm_end = np.full(n, -1, np.int64)
    z = np.int64(0)
    ready = [(z, z, z, z)]
    deferred = [(z, z, z, z, z)]
    issuable = [(z, z)]
    waits = [(z, z, z)]
    ready.pop()
    deferred.pop()
    issuable.pop()
    waits.pop()
    for node in range(n):
        if indeg[node] == 0:
            _make_ready(ar, st, node, key1, key2, not_before, comm_end, ready, deferred, issuable, waits)
    skipped = [(z, z, z, z)]
    while st[_COUNT] < n:
        if deferred:
            _release_deferred(st, ready, deferred, issuable, waits)
        progressed = False
        while waits and waits[0][0] <= st[_T]:  # run_free_waits (first: see ListScheduler.run)
            w = heapq.heappop(waits)[2]
            _commit(ar, st, w, done, at, order, indeg, users_left, key1, key2, not_before, comm_end, ready,
                    deferred, issuable, waits)  # fmt: skip
            progressed = True
        while issuable:  # issue_what_fits
            c = issuable[0][1]
            if (not_before[c] > st[_T] or not _fits(ar, st, done, c, budget, guard)) and (ready or waits):
                break
            heapq.heappop(issuable)
            _issue(ar, st, c, group_free, comm_start, comm_end, done, at, order, indeg, users_left, key1, key2,
                   not_before, ready, deferred, issuable, waits)  # fmt: skip
            progressed = True
        if progressed:
            continue
        if ready:  # run_compute
            picked = _pick_compute(ar, st, done, budget, guard, ready, waits, skipped)
            if picked >= 0:
                _commit(ar, st, picked, done, at, order, indeg, users_left, key1, key2, not_before, comm_end, ready,
                        deferred, issuable, waits)  # fmt: skip
                st[_T] = _kernel_end(ar, st, st[_T], ar.dur_ns[picked])
                continue
        if waits:  # wait_first
            release, _, w = heapq.heappop(waits)
            if release > st[_T]:
                st[_T] = release
            _commit(ar, st, w, done, at, order, indeg, users_left, key1, key2, not_before, comm_end, ready,
                    deferred, issuable, waits)  # fmt: skip
        elif issuable:
            c = heapq.heappop(issuable)[1]
            _issue(ar, st, c, group_free, comm_start, comm_end, done, at, order, indeg, users_left, key1, key2,
                   not_before, ready, deferred, issuable, waits)  # fmt: skip
        else:
            return order, at, comm_start, comm_end, False
    return order, at, comm_start, comm_end, True


@njit_inline
def _issue(ar, st, c, group_free, comm_start, comm_end, done, at, order, indeg, users_left, key1, key2, not_before,
           ready, deferred, issuable, waits):  # fmt: skip
    grp = ar.group[c]
    start = _comm_start(st[_T], group_free[grp], ar.sync_ns)
    end = start + ar.dur_ns[c]
    comm_start[c] = start
    comm_end[c] = end
    group_free[grp] = end
    if end > st[_BUSY]:
        st[_BUSY] = end
    if ar.is_sync[c]:
        st[_T] = _wait_release(end, ar.sync_ns)
    _commit(ar, st, c, done, at, order, indeg, users_left, key1, key2, not_before, comm_end, ready, deferred,
            issuable, waits)  # fmt: skip


@njit
def kahn_jit(succ_ptr, succ_idx, indeg, key):
    """:func:`commsched.ir.transform.kahn_order` with float keys: the ready node with the smallest (key, node)
    first; nodes on a cycle are left out. Returns the order (int64)."""
    n = len(indeg)
    deg = indeg.copy()
    heap = [(0.0, np.int64(0))]
    heap.pop()
    for i in range(n):
        if deg[i] == 0:
            heap.append((key[i], np.int64(i)))
    heapq.heapify(heap)
    out = np.empty(n, np.int64)
    m = 0
    while heap:
        v = heapq.heappop(heap)[1]
        out[m] = v
        m += 1
        for e in range(succ_ptr[v], succ_ptr[v + 1]):
            s = succ_idx[e]
            deg[s] -= 1
            if deg[s] == 0:
                heapq.heappush(heap, (key[s], s))
    return out[:m]


@njit
def _bisect_left(a, x, lo):
    hi = len(a)
    while lo < hi:
        mid = (lo + hi) // 2
        if a[mid] < x:
            lo = mid + 1
        else:
            hi = mid
    return lo


@njit
def _bisect_right(a, x, lo):
    hi = len(a)
    while lo < hi:
        mid = (lo + hi) // 2
        if x < a[mid]:
            hi = mid
        else:
            lo = mid + 1
    return lo


@njit
def tighten_keys_jit(ar, chain_ptr, chain_idx, order, at, comm_start, comm_end):
    """The position keys of :func:`commsched.passes.overlap_orders.tighten`, per node (its ``by_key``)."""
    n = len(order)
    times = np.empty(n, np.int64)
    for k in range(n):
        times[k] = at[order[k]]
        if k and times[k] < times[k - 1]:
            times[k] = times[k - 1]
    key = np.arange(n).astype(np.float64)
    place = np.empty(n, np.int64)
    for k in range(n):
        place[order[k]] = k
    for g in range(len(chain_ptr) - 1):
        prev_key = -1.0
        for e in range(chain_ptr[g], chain_ptr[g + 1]):
            c = chain_idx[e]
            if ar.is_sync[c]:
                prev_key = key[place[c]]
                continue
            k0 = place[c]
            k = _bisect_right(times, _latest_issue(comm_start[c], ar.sync_ns), k0) - 1
            new_key = max(float(k0), k - 0.5 if k > k0 else float(k0))
            new_key = max(new_key, prev_key + 1e-6)
            key[k0] = new_key
            prev_key = new_key
    for w_pos in range(n):
        w = order[w_pos]
        if not ar.is_wait[w]:
            continue
        c = ar.wait_of[w]
        end = comm_end[c] if comm_end[c] >= 0 else 0
        k = _bisect_left(times, _wait_release(end, ar.sync_ns), 0)
        lo = key[place[c]]  # the collective's (possibly moved) issue key
        if k < w_pos:
            key[w_pos] = max(k - 0.5, lo + 1e-6)
    by_key = np.empty(n, np.float64)
    for k in range(n):
        by_key[order[k]] = key[k]
    return by_key


@njit
def levels_jit(succ_ptr, succ_idx, topo, dur, feeds):
    """Bottom levels and feeds of :func:`commsched.passes.overlap_prep.prepare` over ``topo`` reversed; ``feeds``
    holds each collective's rank (n + 1 elsewhere) and is completed in place. Returns the bottom levels."""
    bottom = np.zeros(len(dur), np.int64)
    for k in range(len(topo) - 1, -1, -1):
        node = topo[k]
        best = 0
        first = feeds[node]
        for e in range(succ_ptr[node], succ_ptr[node + 1]):
            s = succ_idx[e]
            if bottom[s] > best:
                best = bottom[s]
            if feeds[s] < first:
                first = feeds[s]
        bottom[node] = dur[node] + best
        feeds[node] = first
    return bottom

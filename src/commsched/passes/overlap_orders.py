"""Orders derived from one list-scheduling attempt of the ``overlap`` pass without changing its timing: tightened
(each collective issued as late as its start allows, each wait as soon as its collective is done), waits moved late
(just before first use), and the constraints that move what was produced early across a memory peak past it.
"""

from __future__ import annotations

import bisect

import numpy as np

from commsched.ir import Graph, OpKind
from commsched.ir.transform import kahn_order
from commsched.memory import liveness
from commsched.passes.overlap_list import Attempt
from commsched.passes.overlap_prep import Prep
from commsched.sim.jit import ENABLED as JIT_ENABLED


def tighten(p: Prep, a: Attempt) -> list[int]:
    """The same timing with less memory: issue each collective at the last point before its communication starts
    (the FIFO stream could not start it earlier anyway), and run each wait at the first point after its collective
    ends (no stall, and the collective's inputs are released sooner). O(N log N)."""
    if JIT_ENABLED:
        return _tighten_compiled(p, a)
    return tighten_reference(p, a)


def tighten_reference(p: Prep, a: Attempt) -> list[int]:
    """:func:`tighten` in pure Python (the specification of the compiled form)."""
    order = a.order
    n = len(order)
    # time at which the compute stream reaches each position (non-decreasing)
    times = [a.at[v] for v in order]
    for k in range(1, n):
        if times[k] < times[k - 1]:
            times[k] = times[k - 1]
    key = [float(k) for k in range(n)]  # position keys; moved nodes get fractional keys
    place = {v: k for k, v in enumerate(order)}
    last_issue_key = {}
    for chain in p.chains.values():
        prev_key = -1.0
        for c in chain:
            if p.is_sync[c]:
                prev_key = key[place[c]]
                continue
            k0 = place[c]
            # latest position from which the collective still starts in time, not before the node's own slot
            k = bisect.bisect_right(times, p.model.latest_issue_ns(a.comm_start[c]), lo=k0) - 1
            new_key = max(float(k0), k - 0.5 if k > k0 else float(k0))
            new_key = max(new_key, prev_key + 1e-6)
            key[k0] = new_key
            prev_key = new_key
            last_issue_key[c] = new_key
    for w_pos, w in enumerate(order):
        if not p.is_wait[w]:
            continue
        c = p.wait_of[w]
        # first position at which the wait costs nothing, after its issue
        k = bisect.bisect_left(times, p.model.wait_release_ns(a.comm_end.get(c, 0)))
        lo = last_issue_key.get(c, key[place[c]])
        if k < w_pos:
            key[w_pos] = max(k - 0.5, lo + 1e-6)
    # a stable topological sort by the new keys keeps every dependency (views of a moved collective follow it)
    by_key = [0.0] * n
    for k, v in enumerate(order):
        by_key[v] = key[k]
    return kahn_order(p.succ_ptr, p.succ_idx, p.indeg, by_key)


def _tighten_compiled(p: Prep, a: Attempt) -> list[int]:
    """:func:`tighten` by the compiled loops (:mod:`commsched.passes.overlap_jit`; identical orders)."""
    from commsched.passes.overlap_jit import chain_arrays, kahn_jit, prep_arrays, tighten_keys_jit

    ar = prep_arrays(p)
    if a.arrays is not None:
        order, at, start, end = a.arrays
    else:
        order, at = np.asarray(a.order, np.int64), np.asarray(a.at, np.int64)
        start, end = np.full(p.n, -1, np.int64), np.full(p.n, -1, np.int64)
        start[list(a.comm_start)] = list(a.comm_start.values())
        end[list(a.comm_end)] = list(a.comm_end.values())
    by_key = tighten_keys_jit(ar, *chain_arrays(p), order, at, start, end)
    return kahn_jit(ar.succ_ptr, ar.succ_idx, ar.indeg, by_key).tolist()


def delay_past_peak(
    g: Graph,
    p: Prep,
    a: Attempt,
    cand: list[int],
    peak_position: int,
    not_before: dict[int, int],
    include_compute: bool = True,
    excess_bytes: int | None = None,
) -> dict[int, int] | None:
    """Constraints that move what was produced early across a memory peak to after it: owners (collectives
    prefetched, and with ``include_compute`` compute run ahead) of storages live at the peak whose first real use
    comes after it — the ones used latest first, just enough of them to cover ``excess_bytes`` (all of them when
    None). None when there is no such storage (the peak is needed as it is). O(N + E) array operations."""
    lv = liveness(g)
    n = len(cand)
    pos = np.empty(n, np.int64)
    pos[np.asarray(cand, np.int64)] = np.arange(n)
    peak_node = cand[peak_position]
    after = a.at[peak_node] + p.dur_ns[peak_node]
    kinds = g.kinds
    owner = lv.owner.astype(np.int64)
    # a storage's first real use: its earliest user that is neither its owner nor an alias (view, wait)
    ptr = lv.users_ptr.astype(np.int64)
    users = lv.users_idx.astype(np.int64)
    row = np.repeat(np.arange(len(owner)), np.diff(ptr))
    real = (users != owner[row]) & (kinds[users] != OpKind.VIEW) & (kinds[users] != OpKind.WAIT)
    first_use = np.full(len(owner), n, np.int64)  # n: no real use
    np.minimum.at(first_use, row[real], pos[users[real]])
    o_kind = kinds[owner]
    early = (~lv.persistent & (lv.storage_bytes > 0) & (pos[owner] <= peak_position) & (owner != peak_node)
             & (o_kind != OpKind.INPUT) & (first_use < n) & (first_use > peak_position))  # fmt: skip
    if not include_compute:
        early &= o_kind == OpKind.COLLECTIVE
    s = np.flatnonzero(early)
    if not len(s):
        return None
    owners, at_owner = np.unique(owner[s], return_inverse=True)
    held = np.zeros(len(owners), np.int64)  # per owner: bytes held across the peak, and its first use
    np.add.at(held, at_owner, lv.storage_bytes[s])
    use = np.full(len(owners), n, np.int64)
    np.minimum.at(use, at_owner, first_use[s])
    out = dict(not_before)
    moved = False
    covered = 0
    for k in np.lexsort((owners, -use)).tolist():  # the latest-used first (ties: the lower owner id)
        if excess_bytes is not None and covered >= excess_bytes:
            break
        o = int(owners[k])
        if out.get(o, 0) < after:
            out[o] = after
            moved = True
            covered += int(held[k])
    return out if moved else None


def late_waits(p: Prep, order: list[int]) -> list[int]:
    """``order`` with every wait moved down to just before the first node that uses it (no earlier than before).
    In the model nothing changes when the collective is done by then; in reality a collective that runs longer
    than predicted then stalls the stream only when its result is needed, not wherever its predicted end fell."""
    n = len(order)
    place = [0] * n
    for k, v in enumerate(order):
        place[v] = k
    key = [float(place[v]) for v in range(n)]
    sp, si = p.succ_ptr, p.succ_idx
    for v in order:
        if p.is_wait[v]:
            first = min((place[u] for u in si[sp[v] : sp[v + 1]]), default=place[v])
            if first > place[v]:
                key[v] = first - 0.5
    return kahn_order(sp, si, p.indeg, key)

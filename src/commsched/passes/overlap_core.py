"""The machinery of the ``overlap`` pass: per-graph preparation, one list-scheduling attempt that runs the stream
model as it goes, the tightening that issues collectives as late as their start allows and waits as soon as their
collective is done, and the Jackson-rule collective order used when reordering within a group is allowed.

Time inside is int64 nanoseconds; the model is the simulator's (compute stream, FIFO comm stream per group,
interference) without link sharing, which the final simulation accounts for.
"""

from __future__ import annotations

import bisect
import heapq
from dataclasses import dataclass, field

import numpy as np

from commsched.cost.model import CostEstimate
from commsched.ir import Graph, OpKind
from commsched.ir.graph import _csr
from commsched.ir.transform import kahn_order
from commsched.memory import liveness, memory_profile
from commsched.sim.bounds import heads_and_tails


@dataclass
class Prep:
    """Per-graph arrays (lists, for fast scalar access) shared by every attempt with the same collective order."""

    n: int
    dur_ns: list[int]
    is_coll: list[bool]
    is_wait: list[bool]
    is_sync: list[bool]
    group: list[int]
    wait_of: list[int]
    succ_ptr: list[int]
    succ_idx: list[int]
    indeg: list[int]
    bottom: list[int]
    feeds: list[int]
    pos: list[int]
    alloc: list[int]  # bytes allocated when the node runs (the non-persistent storages it owns)
    node_storages: list[list[int]]  # freeable storages each node uses (their last user frees them)
    storage_users: list[int]
    storage_bytes: list[int]
    persistent_bytes: int
    input_order: list[int]  # the pass's input order (the memory reference)
    input_after: list[int]  # memory after each position of the input order
    input_max: list[list[int]]  # sparse table of the input order's curve (range maximum in O(1))
    release_pos: list[int]  # per node: input position after which the storages it allocates are freed
    chains: dict[int, list[int]]  # per group: its collectives in issue (FIFO) order
    slowdown: float
    data_preds: list[list[int]] = field(default_factory=list)  # preds without the FIFO chain edges
    feeder: list[bool] = field(default_factory=list)  # a short path leads from the node to a busiest-group collective
    tail: list[int] = field(default_factory=list)  # least time from the node's end to the end of the step


def base_arrays(g: Graph, costs: CostEstimate) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """(duration ns, data+dep edge src, dst) of ``g``; zero-time kinds get duration 0."""
    dur = np.rint(costs.node_s * 1e9).astype(np.int64)
    dur[np.isin(g.kinds, (OpKind.WAIT, OpKind.VIEW, OpKind.INPUT, OpKind.OUTPUT))] = 0
    ptr, idx = g.predecessors_csr()
    return dur, idx.astype(np.int64), np.repeat(np.arange(len(g)), np.diff(ptr))


def input_chains(g: Graph, order: np.ndarray) -> dict[int, list[int]]:
    colls = order[g.coll_type[order] >= 0]
    chains: dict[int, list[int]] = {}
    for c, grp in zip(colls.tolist(), g.coll_group[colls].tolist()):
        chains.setdefault(grp, []).append(c)
    return chains


@dataclass
class GraphPrep:
    """The chain-independent part of a :class:`Prep`, computed once per pass invocation."""

    fields: dict
    dur_ns: np.ndarray
    src: np.ndarray
    dst: np.ndarray
    pos: np.ndarray


def prepare_graph(
    g: Graph, order: np.ndarray, costs: CostEstimate, extra_src: np.ndarray, extra_dst: np.ndarray
) -> GraphPrep:
    n = len(g)
    dur_ns, src, dst = base_arrays(g, costs)
    if costs.comm_slowdown != 1.0:
        # the list scheduler's model has no kernel-driven comm rate: plan with collectives as slow as when they overlap
        # compute, which is what a good schedule makes them do (the candidates are still judged by the simulator)
        coll = g.coll_type >= 0
        dur_ns = np.where(coll, np.rint(dur_ns * float(costs.comm_slowdown)).astype(np.int64), dur_ns)
    src = np.concatenate([src, extra_src.astype(np.int64)])
    dst = np.concatenate([dst, extra_dst.astype(np.int64)])
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    lv = liveness(g)
    nsp, nsi = lv.node_storage_ptr.tolist(), lv.node_storage_idx.tolist()
    prof = memory_profile(g, order)
    free_pos = np.where(prof.free_position < 0, n - 1, prof.free_position)
    release = np.zeros(n, np.int64)
    transient = ~lv.persistent
    np.maximum.at(release, lv.owner[transient], free_pos[transient])
    # sparse table of the input order's memory curve: row k holds maxima over windows of 2**k positions
    rows = [prof.curve_bytes]
    span = 1
    while span * 2 <= n:
        rows.append(np.maximum(rows[-1][: len(rows[-1]) - span], rows[-1][span:]))
        span *= 2
    pp, pi = _csr(n, src, dst)
    pp_l, pi_l = pp.tolist(), pi.tolist()
    fields = dict(
        n=n,
        dur_ns=dur_ns.tolist(),
        is_coll=(g.coll_type >= 0).tolist(),
        is_wait=(g.kinds == OpKind.WAIT).tolist(),
        is_sync=g.coll_sync.tolist(),
        group=g.coll_group.tolist(),
        wait_of=g.wait_of.tolist(),
        pos=pos.tolist(),
        alloc=lv.alloc_bytes.tolist(),
        node_storages=[nsi[nsp[i] : nsp[i + 1]] for i in range(n)],
        storage_users=np.diff(lv.users_ptr).tolist(),
        storage_bytes=lv.storage_bytes.tolist(),
        persistent_bytes=lv.persistent_bytes,
        input_order=order.tolist(),
        input_after=prof.after_bytes.tolist(),
        input_max=[r.tolist() for r in rows],
        release_pos=release.tolist(),
        slowdown=float(costs.compute_slowdown),
        data_preds=[pi_l[pp_l[i] : pp_l[i + 1]] for i in range(n)],
        feeder=feeders(g, dur_ns, order),
        tail=heads_and_tails(g, dur_ns)[1],
    )
    return GraphPrep(fields, dur_ns, src, dst, pos)


def feeders(g: Graph, dur_ns: np.ndarray, order: np.ndarray, reach: float = 0.1) -> list[bool]:
    """Per node: whether a collective of the busiest process group can be issued within ``reach`` x that group's
    median collective time of the node's end (through its successors' durations). Running such nodes first keeps
    the bottleneck stream fed (e.g. a gradient's cast before its reduce_scatter, ahead of the next layer's work)."""
    n = len(g)
    is_coll = g.coll_type >= 0
    if not is_coll.any():
        return [False] * n
    comm = np.bincount(g.coll_group[is_coll], weights=dur_ns[is_coll], minlength=len(g.groups)).astype(np.float64)
    comm[np.bincount(g.coll_group[is_coll], minlength=len(g.groups)) == 0] = -1.0  # groups with no collective
    busiest = int(np.argmax(comm))
    target = (is_coll & (g.coll_group == busiest)).tolist()
    limit = int(reach * float(np.median(dur_ns[is_coll & (g.coll_group == busiest)])))
    sp, si = (a.tolist() for a in g.successors_csr())
    dur = dur_ns.tolist()
    never = 1 << 62
    to_coll = [never] * n
    for v in reversed(order.tolist()):
        best = never
        for u in si[sp[v] : sp[v + 1]]:
            d = 0 if target[u] else dur[u] + to_coll[u]
            if d < best:
                best = d
        to_coll[v] = best
    return [t <= limit for t in to_coll]


def prepare(gp: GraphPrep, chains: dict[int, list[int]]) -> Prep:
    """A :class:`Prep` for one issue order per group: constraints, in-degrees, bottom levels and feeds."""
    n = gp.fields["n"]
    pos = gp.pos
    chain_src = [a for chain in chains.values() for a in chain[:-1]]
    chain_dst = [b for chain in chains.values() for b in chain[1:]]
    all_src = np.concatenate([gp.src, np.asarray(chain_src, np.int64)])
    all_dst = np.concatenate([gp.dst, np.asarray(chain_dst, np.int64)])
    succ_ptr, succ_idx = _csr(n, all_dst, all_src)
    indeg = np.bincount(succ_idx, minlength=n) if len(succ_idx) else np.zeros(n, np.int64)
    # the collectives' global issue rank: by input position
    colls = sorted((c for chain in chains.values() for c in chain), key=lambda c: pos[c])
    # bottom level (longest remaining duration path; a collective's time counts towards its wait and the next
    # collective of its group) and feeds (the earliest-ranked collective a node leads to)
    sp, si = succ_ptr.tolist(), succ_idx.tolist()
    d = gp.fields["dur_ns"]
    bottom = [0] * n
    feeds = [n + 1] * n
    for r, c in enumerate(colls):
        feeds[c] = r
    topo = kahn_order(sp, si, indeg, gp.fields["pos"])
    if len(topo) != n:
        raise RuntimeError("the ordering constraints have a cycle (collective order vs data dependencies)")
    for node in reversed(topo):
        best = 0
        first = feeds[node]
        for s in si[sp[node] : sp[node + 1]]:
            if bottom[s] > best:
                best = bottom[s]
            if feeds[s] < first:
                first = feeds[s]
        bottom[node] = d[node] + best
        feeds[node] = first
    return Prep(**gp.fields, succ_ptr=sp, succ_idx=si, indeg=indeg.tolist(), bottom=bottom, feeds=feeds, chains=chains)


def range_max(table: list[list[int]], lo: int, hi: int) -> int:
    """Maximum of the base row over positions lo..hi (inclusive) of a sparse table. O(1)."""
    k = (hi - lo + 1).bit_length() - 1
    row = table[k]
    a, b = row[lo], row[hi - (1 << k) + 1]
    return a if a > b else b


@dataclass
class Attempt:
    """One list-scheduling result with the model's timing."""

    order: list[int]
    at: list[int]  # per node: compute-stream time when it runs (issue time for a collective)
    comm_start: dict[int, int]
    comm_end: dict[int, int]


def schedule_once(
    p: Prep,
    budget: int,
    inflight_cap: int,
    not_before: dict[int, int] | None = None,
    priority: str = "feeds",
    guard: bool = True,
) -> Attempt:
    """List scheduling with the stream model (see the ``overlap`` module docstring).

    A collective is issued as soon as it is next in its group's order and its inputs are done, unless the bytes of
    issued-but-not-waited collective outputs would pass ``inflight_cap``, or the compute stream has not reached its
    ``not_before`` time yet, while something else can run meanwhile; a compute node runs only if its allocation fits
    ``budget`` and its ``not_before`` time has come (unless nothing else can make progress). Ready compute is taken by
    ``priority``: "feeds" (what feeds the earliest collective, then the longest path) or "input" (input order).

    With ``guard``, running a node (or issuing a collective) ahead of the input order's frontier must also fit the
    budget in the future: its bytes stay allocated until the input order would release them, on top of what the
    input order needs meanwhile (its memory curve, by range maximum) plus what this schedule already holds in excess.
    """
    nb = not_before or {}
    n = p.n
    indeg = list(p.indeg)
    left = list(p.storage_users)
    live = p.persistent_bytes
    alloc, dur, bottom, pos, feeds = p.alloc, p.dur_ns, p.bottom, p.pos, p.feeds
    if priority == "input":
        # the input order for compute (memory-friendly when the program already interleaves compute and comm well)
        feeds, bottom = pos, [0] * n
    elif priority == "feeders":
        # the input order, except that what is about to release a collective of the busiest group goes first
        feeds, bottom = [0 if f else 1 for f in p.feeder], [0] * n
    elif priority != "feeds":
        raise ValueError(f"priority={priority!r}: expected 'feeds', 'input' or 'feeders'")
    is_coll, is_wait, is_sync, wait_of = p.is_coll, p.is_wait, p.is_sync, p.wait_of
    sp, si, node_storages, storage_bytes = p.succ_ptr, p.succ_idx, p.node_storages, p.storage_bytes
    slow = p.slowdown
    ready: list[tuple[int, int, int, int]] = []  # (feeds, -bottom, pos, node)
    issuable: list[tuple[int, int]] = []  # (pos, node)
    pending_waits: list[tuple[int, int, int]] = []  # (collective end, pos, wait)
    comm_free: dict[int, int] = {}
    comm_start: dict[int, int] = {}
    comm_end: dict[int, int] = {}
    at = [0] * n
    busy_until = 0
    inflight = 0
    waited: set[int] = set()
    t = 0
    out: list[int] = []

    done = [False] * n
    io, after_in, table, release = p.input_order, p.input_after, p.input_max, p.release_pos
    front = 0

    def fits(node: int) -> bool:
        nonlocal front
        if not guard:
            return live + alloc[node] <= budget
        while front < n and done[io[front]]:
            front += 1
        k = pos[node]
        if k <= front:
            return live + alloc[node] <= budget
        excess = live - (after_in[front - 1] if front else p.persistent_bytes)
        ahead = range_max(table, front, k - 1) + alloc[node]
        hi = release[node]
        if hi >= k:
            held = range_max(table, k, hi)
            ahead = ahead if ahead > held else held
        return excess + ahead <= budget

    def commit(node: int) -> None:
        nonlocal live
        done[node] = True
        at[node] = t
        live += alloc[node]
        for s in node_storages[node]:
            left[s] -= 1
            if left[s] == 0:
                live -= storage_bytes[s]
        out.append(node)
        for s in si[sp[node] : sp[node + 1]]:
            indeg[s] -= 1
            if indeg[s] == 0:
                if is_coll[s]:
                    heapq.heappush(issuable, (pos[s], s))
                elif is_wait[s]:
                    heapq.heappush(pending_waits, (comm_end[wait_of[s]], pos[s], s))
                elif nb.get(s, 0) > t:
                    heapq.heappush(deferred, (nb[s], feeds[s], -bottom[s], pos[s], s))
                else:
                    heapq.heappush(ready, (feeds[s], -bottom[s], pos[s], s))

    deferred: list[tuple[int, int, int, int, int]] = []  # compute held back by not_before: (time, *ready key)
    for node in range(n):
        if indeg[node] == 0:
            if is_coll[node]:
                heapq.heappush(issuable, (pos[node], node))
            elif nb.get(node, 0) > 0:
                heapq.heappush(deferred, (nb[node], feeds[node], -bottom[node], pos[node], node))
            else:
                heapq.heappush(ready, (feeds[node], -bottom[node], pos[node], node))

    while len(out) < n:
        while deferred and (deferred[0][0] <= t or not (ready or pending_waits or issuable)):
            heapq.heappush(ready, heapq.heappop(deferred)[1:])
        progressed = False
        while issuable:
            c = issuable[0][1]
            if (inflight + alloc[c] > inflight_cap or nb.get(c, 0) > t or not fits(c)) and (ready or pending_waits):
                break
            heapq.heappop(issuable)
            grp = p.group[c]
            start = max(t, comm_free.get(grp, 0))
            end = start + dur[c]
            comm_free[grp] = end
            comm_start[c], comm_end[c] = start, end
            if end > busy_until:
                busy_until = end
            inflight += alloc[c]
            if is_sync[c]:
                t = end
            commit(c)
            progressed = True
        while pending_waits and pending_waits[0][0] <= t:
            w = heapq.heappop(pending_waits)[2]
            c = wait_of[w]
            if c not in waited:
                waited.add(c)
                inflight -= alloc[c]
            commit(w)
            progressed = True
        if progressed:
            continue
        if ready:
            picked = -1
            skipped = []
            while ready and len(skipped) < 8:
                item = heapq.heappop(ready)
                if fits(item[3]) or not pending_waits:
                    picked = item[3]
                    break
                skipped.append(item)
            for item in skipped:
                heapq.heappush(ready, item)
            if picked >= 0:
                commit(picked)  # at its start time; the stream then advances by its (slowed) duration
                d = dur[picked]
                if d and busy_until > t and slow > 1.0:
                    overlap_work = (busy_until - t) / slow
                    t += int(d * slow) if d <= overlap_work else (busy_until - t) + int(d - overlap_work)
                else:
                    t += d
                continue
        if pending_waits:
            end, _, w = heapq.heappop(pending_waits)
            if end > t:
                t = end
            c = wait_of[w]
            if c not in waited:
                waited.add(c)
                inflight -= alloc[c]
            commit(w)
            continue
        if issuable:
            c = heapq.heappop(issuable)[1]
            grp = p.group[c]
            start = max(t, comm_free.get(grp, 0))
            comm_free[grp] = comm_start[c] = start
            comm_end[c] = comm_free[grp] = start + dur[c]
            busy_until = max(busy_until, comm_end[c])
            inflight += alloc[c]
            if is_sync[c]:
                t = comm_end[c]
            commit(c)
            continue
        raise RuntimeError("overlap scheduler made no progress: the ordering constraints have a cycle")
    return Attempt(out, at, comm_start, comm_end)


def tighten(p: Prep, a: Attempt) -> list[int]:
    """The same timing with less memory: issue each collective at the last point before its communication starts
    (the FIFO stream could not start it earlier anyway), and run each wait at the first point after its collective
    ends (no stall, and the collective's inputs are released sooner). O(N log N)."""
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
            # latest position whose time is <= the start of communication, not before the node's own slot
            k = bisect.bisect_right(times, a.comm_start[c], lo=k0) - 1
            new_key = max(float(k0), k - 0.5 if k > k0 else float(k0))
            new_key = max(new_key, prev_key + 1e-6)
            key[k0] = new_key
            prev_key = new_key
            last_issue_key[c] = new_key
    for w_pos, w in enumerate(order):
        if not p.is_wait[w]:
            continue
        c = p.wait_of[w]
        # first position whose time is >= the collective's end, after its issue
        k = bisect.bisect_left(times, a.comm_end.get(c, 0))
        lo = last_issue_key.get(c, key[place[c]])
        if k < w_pos:
            key[w_pos] = max(k - 0.5, lo + 1e-6)
    # a stable topological sort by the new keys keeps every dependency (views of a moved collective follow it)
    by_key = [0.0] * n
    for k, v in enumerate(order):
        by_key[v] = key[k]
    return kahn_order(p.succ_ptr, p.succ_idx, p.indeg, by_key)


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
    None). None when there is no such storage (the peak is needed as it is)."""
    lv = liveness(g)
    pos = [0] * len(cand)
    for k, v in enumerate(cand):
        pos[v] = k
    peak_node = cand[peak_position]
    after = a.at[peak_node] + p.dur_ns[peak_node]
    kinds = g.kinds
    users_ptr, users_idx = lv.users_ptr, lv.users_idx
    early: dict[int, list[int]] = {}  # owner -> [bytes held across the peak, first use position]
    for s in np.flatnonzero(~lv.persistent & (lv.storage_bytes > 0)).tolist():
        owner = int(lv.owner[s])
        if pos[owner] > peak_position or owner == peak_node or kinds[owner] == OpKind.INPUT:
            continue
        if not include_compute and kinds[owner] != OpKind.COLLECTIVE:
            continue
        first_use = None
        for u in users_idx[users_ptr[s] : users_ptr[s + 1]].tolist():
            if u == owner or kinds[u] in (OpKind.VIEW, OpKind.WAIT):
                continue
            if first_use is None or pos[u] < first_use:
                first_use = pos[u]
        if first_use is None or first_use <= peak_position:
            continue
        entry = early.setdefault(owner, [0, first_use])
        entry[0] += int(lv.storage_bytes[s])
        entry[1] = min(entry[1], first_use)
    out = dict(not_before)
    moved = False
    covered = 0
    for owner, (nbytes, _) in sorted(early.items(), key=lambda kv: (-kv[1][1], kv[0])):
        if excess_bytes is not None and covered >= excess_bytes:
            break
        if out.get(owner, 0) < after:
            out[owner] = after
            moved = True
            covered += nbytes
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

"""``overlap``: commsched's memory-budgeted latency-hiding scheduler (the default pass).

A list scheduler that runs the stream model while it schedules: one compute stream, one FIFO comm stream per process
group, interference while collectives are in flight. At every step it
  1. issues each collective that is next in its group's order and whose inputs are done, as long as the memory
     budget allows its output now (prefetch), so communication starts as early as memory permits;
  2. runs every wait whose collective has already finished (free), unlocking its users;
  3. runs the ready compute node with the longest path to the end of the step ("bottom level", where each group's
     FIFO chain of collectives counts as a path), if its allocation fits the budget;
  4. otherwise waits for the in-flight collective that finishes first (the only way to make progress).
Waits therefore land just before their first use and collectives as early as memory allows. Every group keeps its
input collective order (SPMD-safe), and ties break on the input position, so the result is deterministic.

The hard budget is enforced on the finished order by a full memory recompute; the scheduler tries a few prefetch
reserves, keeps the best order that the budget admits and that simulates no worse than the input, and falls back to
the input order otherwise. Cost: O((N + E) log N) per attempt.
"""

from __future__ import annotations

import heapq
from dataclasses import dataclass

import numpy as np

from commsched.ir import Graph, OpKind
from commsched.memory import liveness
from commsched.passes.registry import PassConfig, PassContext, PassResult, PassStats, register_pass
from commsched.sim import simulate_costs


@dataclass(frozen=True, kw_only=True)
class OverlapConfig(PassConfig):
    """Knobs of the ``overlap`` pass."""

    memory_budget_ratio: float | None = 1.05
    """hard peak-memory budget as a multiple of the input order's peak (None: no ratio limit)"""
    memory_budget_bytes: int | None = None
    """hard peak-memory budget in bytes; with both set, the smaller one applies"""
    prefetch_reserves: tuple[float, ...] = (0.0, 0.25, 0.5, 1.0)
    """fractions of the budget's headroom (budget - input peak) kept free when prefetching; one attempt each"""


@dataclass
class _Prep:
    """Per-graph arrays shared by every attempt."""

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
    storage_users: list[int]  # how many nodes use each storage
    storage_bytes: list[int]
    persistent_bytes: int
    group_chain: dict[int, list[int]]
    slowdown: float


def _prepare(g: Graph, order: np.ndarray, ctx: PassContext) -> _Prep:
    n = len(g)
    costs = ctx.costs
    dur_ns = np.rint(costs.node_s * 1e9).astype(np.int64)
    dur_ns[(g.kinds == OpKind.WAIT) | (g.kinds == OpKind.VIEW) | (g.kinds == OpKind.INPUT)] = 0
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    is_coll = g.coll_type >= 0
    colls = order[is_coll[order]]
    group_chain: dict[int, list[int]] = {}
    for c, grp in zip(colls.tolist(), g.coll_group[colls].tolist()):
        group_chain.setdefault(grp, []).append(c)
    ptr, idx = g.predecessors_csr()
    src = [idx]
    dst = [np.repeat(np.arange(n), np.diff(ptr))]
    chain_src = [a for chain in group_chain.values() for a in chain[:-1]]
    chain_dst = [b for chain in group_chain.values() for b in chain[1:]]
    src.append(np.asarray(chain_src, np.int64))
    dst.append(np.asarray(chain_dst, np.int64))
    src.append(ctx.extra_src.astype(np.int64))
    dst.append(ctx.extra_dst.astype(np.int64))
    from commsched.ir.graph import _csr

    succ_ptr, succ_idx = _csr(n, np.concatenate(dst), np.concatenate(src))
    indeg = np.bincount(succ_idx, minlength=n) if len(succ_idx) else np.zeros(n, np.int64)
    # bottom level: longest duration path to the end; collective time counts on the edge to its wait and to the
    # next collective of its group (the FIFO stream serialises them)
    sp, si = succ_ptr.tolist(), succ_idx.tolist()
    d = dur_ns.tolist()
    bottom = [0] * n
    # feeds[i]: the earliest collective (by issue index) that node i is an ancestor of; n + 1 when none
    feeds = [n + 1] * n
    for k, c in enumerate(colls.tolist()):
        feeds[c] = k
    for node in order[::-1].tolist():
        best = 0
        first = feeds[node]
        for s in si[sp[node] : sp[node + 1]]:
            if bottom[s] > best:
                best = bottom[s]
            if feeds[s] < first:
                first = feeds[s]
        bottom[node] = d[node] + best
        feeds[node] = first
    lv = liveness(g)
    nsp, nsi = lv.node_storage_ptr.tolist(), lv.node_storage_idx.tolist()
    return _Prep(
        n=n,
        dur_ns=d,
        is_coll=is_coll.tolist(),
        is_wait=(g.kinds == OpKind.WAIT).tolist(),
        is_sync=g.coll_sync.tolist(),
        group=g.coll_group.tolist(),
        wait_of=g.wait_of.tolist(),
        succ_ptr=sp,
        succ_idx=si,
        indeg=indeg.tolist(),
        bottom=bottom,
        feeds=feeds,
        pos=pos.tolist(),
        alloc=lv.alloc_bytes.tolist(),
        node_storages=[nsi[nsp[i] : nsp[i + 1]] for i in range(n)],
        storage_users=np.diff(lv.users_ptr).tolist(),
        storage_bytes=lv.storage_bytes.tolist(),
        persistent_bytes=lv.persistent_bytes,
        group_chain=group_chain,
        slowdown=float(costs.compute_slowdown),
    )


def _schedule_once(p: _Prep, budget: int, prefetch_limit: int) -> list[int]:
    """One list-scheduling attempt. ``prefetch_limit``: a collective may be issued early only while live memory plus
    its output stays at or under this many bytes (collectives that are needed right away ignore it)."""
    n = p.n
    indeg = list(p.indeg)
    left = list(p.storage_users)
    live = p.persistent_bytes
    alloc = p.alloc
    dur, bottom, pos, feeds = p.dur_ns, p.bottom, p.pos, p.feeds
    is_coll, is_wait, is_sync = p.is_coll, p.is_wait, p.is_sync
    sp, si = p.succ_ptr, p.succ_idx
    slow = p.slowdown

    ready: list[tuple[int, int, int, int]] = []  # compute-like nodes: (feeds, -bottom, pos, node)
    issuable: list[tuple[int, int]] = []  # collectives whose inputs are scheduled: (pos, node)
    coll_end: dict[int, int] = {}
    comm_free: dict[int, int] = {}
    busy_until = 0  # latest end among issued collectives (for interference)
    t = 0
    out: list[int] = []
    pending_waits: list[tuple[int, int, int]] = []  # (collective end, pos, wait)

    def commit(node: int) -> None:
        nonlocal live
        live += alloc[node]
        for s in p.node_storages[node]:
            left[s] -= 1
            if left[s] == 0:
                live -= p.storage_bytes[s]
        out.append(node)
        for s in si[sp[node] : sp[node + 1]]:
            indeg[s] -= 1
            if indeg[s] == 0:
                push(s)

    def push(node: int) -> None:
        if is_coll[node]:
            heapq.heappush(issuable, (pos[node], node))
        elif is_wait[node]:
            heapq.heappush(pending_waits, (coll_end[p.wait_of[node]], pos[node], node))
        else:
            heapq.heappush(ready, (feeds[node], -bottom[node], pos[node], node))

    def run_compute(node: int) -> None:
        nonlocal t
        d = dur[node]
        if d and busy_until > t and slow > 1.0:
            overlap_work = (busy_until - t) / slow
            t += int(d * slow) if d <= overlap_work else (busy_until - t) + int(d - overlap_work)
        else:
            t += d
        commit(node)

    def issue(node: int) -> None:
        nonlocal t, busy_until
        g_ = p.group[node]
        start = max(t, comm_free.get(g_, 0))
        end = start + dur[node]
        comm_free[g_] = end
        coll_end[node] = end
        if end > busy_until:
            busy_until = end
        if is_sync[node]:
            t = end  # a synchronous collective blocks the compute stream
        commit(node)

    for node in range(n):
        if indeg[node] == 0:
            push(node)

    while len(out) < n:
        # 1. issue collectives as early as memory permits
        progressed = False
        while issuable:
            _, c = issuable[0]
            need = alloc[c]
            if live + need > prefetch_limit and (ready or pending_waits):
                break
            heapq.heappop(issuable)
            issue(c)
            progressed = True
        # 2. waits whose collective is done cost nothing: run them now
        while pending_waits and pending_waits[0][0] <= t:
            _, _, w = heapq.heappop(pending_waits)
            commit(w)
            progressed = True
        if progressed:
            continue
        # 3. the ready compute node with the longest path that fits the budget
        if ready:
            picked = None
            skipped = []
            while ready and len(skipped) < 8:
                item = heapq.heappop(ready)
                if live + alloc[item[3]] <= budget or not pending_waits:
                    picked = item
                    break
                skipped.append(item)
            for item in skipped:
                heapq.heappush(ready, item)
            if picked is not None:
                run_compute(picked[3])
                continue
        # 4. wait for the collective that finishes first
        if pending_waits:
            end, _, w = heapq.heappop(pending_waits)
            t = max(t, end)
            commit(w)
            continue
        if issuable:
            _, c = heapq.heappop(issuable)
            issue(c)
            continue
        raise RuntimeError("overlap scheduler made no progress: the ordering constraints have a cycle")
    return out


@register_pass("overlap", OverlapConfig)
def overlap(g: Graph, order: np.ndarray, ctx: PassContext) -> PassResult:
    """Memory-budgeted latency hiding: collectives as early as the budget allows, waits just before first use,
    compute by longest path; per-group collective order kept; never worse than the input. O((N+E) log N)."""
    cfg: OverlapConfig = ctx.config  # type: ignore[assignment]
    stats = PassStats("overlap")
    p = _prepare(g, order, ctx)
    base_sim = simulate_costs(g, ctx.costs, order)
    base_peak = base_sim.peak_memory_bytes
    budget = _budget(cfg, base_peak)
    base_ns = int(base_sim.end_ns.max(initial=0))
    best, best_ns, best_peak, best_label = order.tolist(), base_ns, base_peak, "input order"
    headroom = max(0, budget - base_peak)
    tried: set[tuple[int, ...]] = set()
    for reserve in cfg.prefetch_reserves:
        limit = budget - int(reserve * headroom)
        cand = _schedule_once(p, budget, limit)
        key = tuple(cand)
        if key in tried:
            continue
        tried.add(key)
        # judge every candidate with the full simulator (link sharing, interference) and the full memory model
        res = simulate_costs(g, ctx.costs, np.asarray(cand, np.int32))
        peak, ns = res.peak_memory_bytes, int(res.end_ns.max(initial=0))
        stats.rows.append(
            {"attempt": f"reserve {reserve:.2f}", "makespan_s": ns / 1e9, "peak_bytes": peak, "fits": peak <= budget}
        )
        if peak > budget:
            stats.refuse("memory budget")
            continue
        if ns < best_ns or (ns == best_ns and peak < best_peak):
            best, best_ns, best_peak, best_label = cand, ns, peak, f"reserve {reserve:.2f}"
    if best_peak > budget:
        from commsched.passes.check import ScheduleError

        raise ScheduleError(
            f"overlap: no order found within the memory budget of {budget} bytes; the input order peaks at "
            f"{base_peak} bytes (raise memory_budget_bytes / memory_budget_ratio)"
        )
    stats.notes.append(
        f"budget {budget} B (input peak {base_peak} B); chose {best_label}: "
        f"{best_ns / 1e9:.6f} s vs input {base_ns / 1e9:.6f} s, peak {best_peak} B"
    )
    return PassResult(np.asarray(best, np.int32), stats)


def _budget(cfg: OverlapConfig, base_peak: int) -> int:
    limits = []
    if cfg.memory_budget_ratio is not None:
        if cfg.memory_budget_ratio < 1.0:
            raise ValueError(f"memory_budget_ratio={cfg.memory_budget_ratio} must be >= 1 (the input order's peak)")
        limits.append(int(base_peak * cfg.memory_budget_ratio))
    if cfg.memory_budget_bytes is not None:
        limits.append(int(cfg.memory_budget_bytes))
    return min(limits) if limits else 1 << 62

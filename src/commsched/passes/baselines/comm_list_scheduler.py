"""The list scheduler behind ``sink_waits``, ``raise_comms`` and ``reorder_compute_for_overlap``.

Every node gets a score tuple, lower first, and a ready node with the lowest score runs next:
  0. with ``raise_comms``: the smallest issue index among the collectives the node (transitively) feeds, so a
     collective and everything it needs run as early as possible; nodes that feed none score +inf;
  1. with ``sink_waits``: 1 for waits, 0 otherwise, so waits run only when nothing else is ready;
  2. the node's position in the input order (stability).
With ``reorder_for_overlap``, after issuing a collective the scheduler runs ready compute nodes (neither collectives
nor waits), best score first, until their estimated time covers the collective's.
Collectives keep their per-group order: consecutive collectives of a group are chained as ordering constraints.
Cost: O((N + E) log N).
"""

from __future__ import annotations

import heapq

import numpy as np

from commsched.ir import Graph, OpKind
from commsched.ir.graph import csr
from commsched.passes.registry import PassContext

_INF = np.iinfo(np.int64).max


def _group_chain(g: Graph, order: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    colls = order[g.coll_type[order] >= 0]
    src, dst = [], []
    last: dict[int, int] = {}
    for c, grp in zip(colls.tolist(), g.coll_group[colls].tolist()):
        if grp in last:
            src.append(last[grp])
            dst.append(c)
        last[grp] = c
    return np.asarray(src, np.int32), np.asarray(dst, np.int32)


def comm_list_schedule(
    g: Graph,
    order: np.ndarray,
    ctx: PassContext,
    *,
    raise_comms: bool,
    sink_waits: bool,
    reorder_for_overlap: bool,
) -> np.ndarray:
    n = len(g)
    pos = np.empty(n, np.int64)
    pos[order] = np.arange(n)
    ptr, idx = g.predecessors_csr()
    chain_src, chain_dst = _group_chain(g, order)
    # ordering constraints: data/control preds, the per-group collective chain, and earlier passes' constraints
    src = np.concatenate([idx, chain_src, ctx.extra_src]).astype(np.int64)
    dst = np.concatenate([np.repeat(np.arange(n), np.diff(ptr)), chain_dst, ctx.extra_dst]).astype(np.int64)
    succ_ptr, succ_idx = csr(n, dst, src)
    # dedupe: csr dropped duplicate edges, so recount in-degree from the successor lists
    indeg = np.bincount(succ_idx, minlength=n) if len(succ_idx) else np.zeros(n, np.int64)

    score0 = np.full(n, _INF, np.int64)
    is_coll = g.coll_type >= 0
    if raise_comms:
        # a collective's score is its issue index; everything it depends on inherits the smallest one it feeds
        coll_in_order = order[is_coll[order]]
        score0[coll_in_order] = np.arange(len(coll_in_order))
        sp, si = succ_ptr.tolist(), succ_idx.tolist()
        s0 = score0.tolist()
        for node in order[::-1].tolist():
            best = s0[node]
            for s in si[sp[node] : sp[node + 1]]:
                if s0[s] < best:
                    best = s0[s]
            s0[node] = best
        score0 = np.asarray(s0, np.int64)
    score1 = (g.kinds == OpKind.WAIT).astype(np.int64) if sink_waits else np.zeros(n, np.int64)
    keys = list(zip(score0.tolist(), score1.tolist(), pos.tolist()))
    cost = ctx.costs.node_s.tolist()
    # overlap candidates are "compute" in the seed's sense: neither a collective nor a wait
    is_overlap_candidate = ~is_coll & (g.kinds != OpKind.WAIT)
    cand = is_overlap_candidate.tolist()

    ready_cand: list[tuple] = []  # overlap candidates
    ready_rest: list[tuple] = []  # collectives and waits
    indeg_l = indeg.tolist()
    sp, si = succ_ptr.tolist(), succ_idx.tolist()
    for node in range(n):
        if indeg_l[node] == 0:
            heapq.heappush(ready_cand if cand[node] else ready_rest, (keys[node], node))
    out: list[int] = []

    def run(node: int) -> None:
        out.append(node)
        for s in si[sp[node] : sp[node + 1]]:
            indeg_l[s] -= 1
            if indeg_l[s] == 0:
                heapq.heappush(ready_cand if cand[s] else ready_rest, (keys[s], s))

    while ready_cand or ready_rest:
        if ready_rest and (not ready_cand or ready_rest[0] < ready_cand[0]):
            _, node = heapq.heappop(ready_rest)
        else:
            _, node = heapq.heappop(ready_cand)
        run(node)
        if reorder_for_overlap and is_coll[node]:
            remaining = cost[node]
            while remaining > 0 and ready_cand:
                _, c = heapq.heappop(ready_cand)
                run(c)
                remaining -= cost[c]
    if len(out) != n:
        stuck = sorted(set(range(n)) - set(out))[:5]
        raise RuntimeError(f"list scheduling left nodes unscheduled (a cycle in the constraints?): {stuck}")
    return np.asarray(out, np.int32)

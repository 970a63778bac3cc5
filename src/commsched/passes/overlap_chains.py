"""Each process group's collective order for the ``overlap`` pass when reordering is allowed: due dates from an
attempt's timing, Jackson's rule, and two local moves (collectives nobody waits for promoted past prefetches, the
most exposed collective tried a few places earlier). Every function is deterministic in (graph, costs), so every
rank that has the same costs builds the same order.
"""

from __future__ import annotations

import heapq

import numpy as np

from commsched.ir import Graph
from commsched.ir.graph import csr
from commsched.passes.overlap_list import Attempt
from commsched.passes.overlap_prep import GraphPrep, Prep


def first_uses(g: Graph, p: Prep, a: Attempt) -> dict[int, int | None]:
    """Per collective: when the attempt first used its result — the earliest start of a node that takes time
    (kernel or collective) reached from one of its waits through zero-time nodes (views, getitems, waits, which
    the list scheduler runs as soon as they are ready and so say nothing about when the data is needed); None when
    no such node exists (only the step's output takes it)."""
    sptr, sidx = g.successors_csr()
    sp, si = sptr.tolist(), sidx.tolist()
    dur, is_coll = p.dur_ns, p.is_coll
    never = 1 << 62
    need_at = [never] * p.n
    for v in reversed(a.order):
        if dur[v] > 0 or is_coll[v]:
            need_at[v] = a.at[v]
            continue
        first = never
        for u in si[sp[v] : sp[v + 1]]:
            if need_at[u] < first:
                first = need_at[u]
        need_at[v] = first
    out: dict[int, int | None] = {}
    for c_list in p.chains.values():
        for c in c_list:
            first_use = min((need_at[w] for w in g.waits_of(c).tolist()), default=never)
            out[c] = first_use if first_use < never else None
    return out


def need_times(g: Graph, p: Prep, a: Attempt, uses: dict[int, int | None] | None = None) -> dict[int, int]:
    """Per collective: its first use in the attempt (:func:`first_uses`) or, if earlier, the latest end that does
    not delay the attempt's end given what must follow the collective (a gradient's reduce_scatter that nothing
    waits for is still due before the step can end)."""
    uses = first_uses(g, p, a) if uses is None else uses
    dur = p.dur_ns
    end = max(max(a.comm_end.values(), default=0), max(t + d for t, d in zip(a.at, dur)))
    return {c: min(end - (p.tail[c] - dur[c]), end if u is None else u) for c, u in uses.items()}


def jackson_chains(g: Graph, p: Prep, a: Attempt) -> dict[int, list[int]]:
    """A new issue order per group from one attempt's timing: when the group's stream frees up, start the released
    collective (inputs done) whose result is needed first (Jackson's rule). Deterministic in (graph, costs)."""
    order_pos = {v: k for k, v in enumerate(a.order)}
    need = need_times(g, p, a)
    out: dict[int, list[int]] = {}
    for grp, chain in p.chains.items():
        release = {c: max([a.at[q] + p.dur_ns[q] for q in p.data_preds[c]] + [0]) for c in chain}
        pending = sorted(chain, key=lambda c: (release[c], order_pos[c]))
        heap: list[tuple[int, int, int]] = []
        t = 0
        i = 0
        new: list[int] = []
        while len(new) < len(chain):
            while i < len(pending) and release[pending[i]] <= t:
                c = pending[i]
                heapq.heappush(heap, (need[c], order_pos[c], c))
                i += 1
            if not heap:
                t = release[pending[i]]
                continue
            _, _, c = heapq.heappop(heap)
            new.append(c)
            t += p.dur_ns[c]
        out[grp] = new
    return out


def promote_unwaited(g: Graph, p: Prep, a: Attempt) -> dict[int, list[int]] | None:
    """Each group's order with every collective whose result nothing waits for (a gradient's reduce_scatter)
    moved ahead of the collectives that started after its inputs were ready in attempt ``a``, as far as their
    slack (need time minus end) covers its duration — so it does not queue behind prefetches it need not wait for
    and end up exposed at the end of the step. None when nothing moves."""
    uses = first_uses(g, p, a)
    need = need_times(g, p, a, uses)
    moved = False
    out: dict[int, list[int]] = {}
    for grp, chain in p.chains.items():
        new = list(chain)
        slack = {}
        for c in chain:
            slack[c] = None if uses[c] is None else need[c] - a.comm_end[c]
        for u in chain:
            if slack[u] is not None or p.is_sync[u]:
                continue
            release = max([a.at[q] + p.dur_ns[q] for q in p.data_preds[u]] + [0])
            k = new.index(u)
            j = k
            d = p.dur_ns[u]
            while j > 0:
                x = new[j - 1]
                if a.comm_start[x] <= release or p.is_sync[x] or (slack[x] is not None and slack[x] < d):
                    break
                j -= 1
            if j < k:
                for x in new[j:k]:
                    if slack[x] is not None:
                        slack[x] -= d
                new[j + 1 : k + 1] = new[j:k]
                new[j] = u
                moved = True
        out[grp] = new
    return out if moved else None


def earlier_placements(g: Graph, p: Prep, res, distances: tuple[int, ...] = (1, 2, 4, 8, 16)):
    """(label, chains) with the collective whose waits stalled the compute stream longest in simulation ``res``
    moved ``d`` places earlier in its group's order, for each distance ``d`` that fits in the order."""
    exposed = res.exposed_ns_per_collective
    c = int(np.argmax(exposed))
    if exposed[c] <= 0:
        return
    grp = int(g.coll_group[c])
    chain = p.chains[grp]
    k = chain.index(c)
    for d in distances:
        if d > k:
            break
        new = [*chain[: k - d], c, *chain[k - d : k], *chain[k + 1 :]]
        yield f"{g.names[c]} {d} earlier", {**p.chains, grp: new}


def consistent_chains(gp: GraphPrep, chains: dict[int, list[int]]) -> dict[int, list[int]]:
    """``chains`` made acyclic with the graph's own ordering constraints, changing as little as it can.

    Each group's order is rebuilt while walking the constraint graph (data, control and extra edges) in topological
    order: a group's next collective in ``chains`` is issued as soon as its inputs are done; when every group's next
    one waits on something that is itself blocked (two groups' orders cross a dependency, or a group's order puts a
    collective before one it depends on), the ready collective ranked earliest in its own chain goes ahead of its
    turn. Orders that were already consistent come back unchanged. Deterministic. O((N + E) log N)."""
    n = gp.fields["n"]
    succ_ptr, succ_idx = csr(n, gp.dst, gp.src)
    sp, si = succ_ptr.tolist(), succ_idx.tolist()
    indeg = np.bincount(succ_idx, minlength=n).tolist() if len(succ_idx) else [0] * n
    group_of = {c: grp for grp, chain in chains.items() for c in chain}
    rank = {c: r for chain in chains.values() for r, c in enumerate(chain)}
    nxt = dict.fromkeys(chains, 0)  # per group: index of its next collective in `chains` not yet issued
    issued: set[int] = set()
    held: dict[int, list[tuple[int, int]]] = {grp: [] for grp in chains}  # ready collectives: (rank, node)
    free = [v for v in range(n) if indeg[v] == 0]
    out: dict[int, list[int]] = {grp: [] for grp in chains}

    def release(v: int) -> None:
        for s in si[sp[v] : sp[v + 1]]:
            indeg[s] -= 1
            if indeg[s] == 0:
                if s in group_of:
                    heapq.heappush(held[group_of[s]], (rank[s], s))
                else:
                    free.append(s)

    def issue(grp: int, c: int) -> None:
        held[grp].remove((rank[c], c))
        heapq.heapify(held[grp])
        issued.add(c)
        out[grp].append(c)
        while nxt[grp] < len(chains[grp]) and chains[grp][nxt[grp]] in issued:
            nxt[grp] += 1
        release(c)

    for v in free[:]:
        if v in group_of:
            free.remove(v)
            heapq.heappush(held[group_of[v]], (rank[v], v))
    while free or any(held.values()):
        while free:
            release(free.pop())
        turn = [(grp, chains[grp][nxt[grp]]) for grp in chains if nxt[grp] < len(chains[grp])]
        turn = [(grp, c) for grp, c in turn if (rank[c], c) in held[grp]]
        if turn:
            for grp, c in turn:
                issue(grp, c)
            continue
        waiting = [(held[grp][0][0], grp) for grp in chains if held[grp]]
        if not waiting:
            break
        _, grp = min(waiting)
        issue(grp, held[grp][0][1])
    return out

"""Fusion regions: which unfused post-grad nodes Inductor would run as one kernel.

Rules, after the seed scheduler (``Scheduler.can_fuse`` / ``will_fusion_create_cycle`` /
``can_fusion_increase_peak_memory``):

* only fusible nodes fuse (pointwise / reduction ops Inductor lowers to loops: :mod:`commsched.cost.opclass`);
* vertically along a data edge, or horizontally between two consumers of the same tensor, and only between nodes of
  the same iteration size (``key``: the larger of a node's output and input element counts, so a reduction fuses
  with the pointwise ops on its input and a norm's broadcast back, as Inductor's (numel, rnumel) groups do); a
  pointwise producer with a smaller iteration size (a broadcast operand, a fill) also fuses into its consumer,
  which Inductor inlines;
* never into a cycle: nodes get a *fusion level*, the longest path from the sources counting 1 for each edge that
  cannot fuse (a non-fusible end, another key, a control dependency) and 0 otherwise; only nodes of equal level
  fuse. Any path between two nodes of one level consists of fusible edges of that level, so every node on it is
  in the same region: a region never has a path that leaves it and comes back;
* horizontal fusion only between consumers at most 64 nodes apart in program order (Inductor's proximity rule
  against raising peak memory), and at most 64 nodes per region (Inductor's ``max_fusion_size``), splitting larger
  components into runs of consecutive ids (a run of ids keeps every path inside the run, so still no cycle).

Views are transparent: an edge through a chain of views is an edge from the view's base node, and a view belongs to
its base's region (it costs nothing, and keeping it with the region keeps the region contiguous in an order). Inputs
and non-fusible nodes have region -1. Cost: O(N + E) Python over the edge arrays.

What a region moves (:func:`region_boundary_bytes`) follows Inductor's realization rule: a pointwise value read by
another kernel is recomputed there from the buffers it reads, not written and read back, unless its body reads more
than ``REALIZE_READS_THRESHOLD`` buffers (``StorageBox.should_realize_on_reuse``); a value an extern kernel (a
matmul, a collective) or the graph output uses is always written.
"""

from __future__ import annotations

import numpy as np

from commsched.ir import Graph, OpKind

MAX_FUSION_SIZE = 64  # torch._inductor.config.max_fusion_size
PROXIMITY = 64  # Scheduler.can_fusion_increase_peak_memory: no horizontal fusion of nodes further apart
REALIZE_READS_THRESHOLD = 4  # torch._inductor.config.realize_reads_threshold (reads a recomputed value may have)


def view_sources(g: Graph) -> np.ndarray:
    """For each node, the non-view node whose data it shows (itself for non-views)."""
    src = np.arange(len(g), dtype=np.int64)
    views = np.flatnonzero(g.kinds == OpKind.VIEW)
    in_ptr, in_idx, dep_ptr = g.in_ptr, g.in_idx, g.dep_ptr
    src_list = src.tolist()
    for v in views.tolist():
        if in_ptr[v + 1] > in_ptr[v] and dep_ptr[v + 1] == dep_ptr[v]:
            src_list[v] = src_list[int(in_idx[in_ptr[v]])]
    return np.asarray(src_list, dtype=np.int64)


def resolved_edges(g: Graph, src: np.ndarray) -> tuple[np.ndarray, np.ndarray, np.ndarray, np.ndarray]:
    """Edges between non-view nodes: (producer, consumer, actual input node, is_data), views resolved to bases."""
    n = len(g)
    is_view = (g.kinds == OpKind.VIEW) & (src != np.arange(n))
    dst = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.in_ptr))
    p = g.in_idx.astype(np.int64)
    cdst = np.repeat(np.arange(n, dtype=np.int64), np.diff(g.dep_ptr))
    cp = g.dep_idx.astype(np.int64)
    prod = np.concatenate([src[p], src[cp]])
    cons = np.concatenate([dst, cdst])
    actual = np.concatenate([p, cp])
    data = np.concatenate([np.ones(len(p), bool), np.zeros(len(cp), bool)])
    keep = ~is_view[cons] & (prod != cons)
    return prod[keep], cons[keep], actual[keep], data[keep]


def _find(parent: list[int], x: int) -> int:
    root = x
    while parent[root] != root:
        root = parent[root]
    while parent[x] != root:
        parent[x], x = root, parent[x]
    return root


def fusion_regions(
    g: Graph, fusible: np.ndarray, key: np.ndarray, pointwise: np.ndarray, src: np.ndarray | None = None
) -> np.ndarray:
    """Region id per node (-1: not fused with anything). ``fusible``: bool per node; ``key``: iteration size;
    ``pointwise``: bool per node, may be inlined into a consumer of a larger iteration size."""
    n = len(g)
    src = view_sources(g) if src is None else src
    prod, cons, _actual, data = resolved_edges(g, src)
    fus = np.asarray(fusible, bool) & (g.kinds != OpKind.VIEW)
    inline = np.asarray(pointwise, bool)[prod] & (key[prod] < key[cons])
    same = data & fus[prod] & fus[cons] & ((key[prod] == key[cons]) | inline)
    inc = np.where(same, 0, 1)

    # longest path with 0/1 edge weights, consumers in id order (ids are a topological order)
    order = np.argsort(cons, kind="stable")
    prod_s, cons_s, inc_s = prod[order].tolist(), cons[order].tolist(), inc[order].tolist()
    level = [0] * n
    for q, c, w in zip(prod_s, cons_s, inc_s, strict=True):
        lv = level[q] + w
        if lv > level[c]:
            level[c] = lv
    level_arr = np.asarray(level, dtype=np.int64)

    parent = list(range(n))
    joinable = same & (level_arr[prod] == level_arr[cons])
    for q, c in zip(prod[joinable].tolist(), cons[joinable].tolist(), strict=True):
        rq, rc = _find(parent, q), _find(parent, c)
        if rq != rc:
            parent[max(rq, rc)] = min(rq, rc)
    # horizontal: fusible consumers of one tensor at the same level and key, close in program order
    sib = data & fus[cons]
    by_prod = np.lexsort((cons[sib], prod[sib]))
    sp, sc = prod[sib][by_prod].tolist(), cons[sib][by_prod].tolist()
    for j in range(1, len(sp)):
        a, b = sc[j - 1], sc[j]
        if sp[j] == sp[j - 1] and a != b and b - a <= PROXIMITY and level[a] == level[b] and key[a] == key[b]:
            ra, rb = _find(parent, a), _find(parent, b)
            if ra != rb:
                parent[max(ra, rb)] = min(ra, rb)

    roots = np.asarray([_find(parent, i) for i in range(n)], dtype=np.int64)
    roots = np.where(fus, roots, -1)
    members = np.flatnonzero(roots >= 0)
    region = np.full(n, -1, dtype=np.int64)
    if len(members) == 0:
        return region
    # split each component into runs of MAX_FUSION_SIZE consecutive members; drop singletons
    order = members[np.lexsort((members, roots[members]))]
    comp = roots[order]
    start = np.r_[True, comp[1:] != comp[:-1]]
    comp_start = np.maximum.accumulate(np.where(start, np.arange(len(order)), 0))
    rank_in_comp = np.arange(len(order)) - comp_start
    chunk_id = np.cumsum(start | (rank_in_comp % MAX_FUSION_SIZE == 0)) - 1
    sizes = np.bincount(chunk_id)
    keep = sizes[chunk_id] >= 2
    _, dense = np.unique(chunk_id[keep], return_inverse=True)
    region[order[keep]] = dense
    views = np.flatnonzero((g.kinds == OpKind.VIEW) & (src != np.arange(n)))
    region[views] = region[src[views]]
    return region


def _recompute_leaves(
    g: Graph, region: np.ndarray, src: np.ndarray, realized: np.ndarray
) -> dict[int, tuple[int, ...] | None]:
    """For each unrealized region member, the realized inputs (actual input nodes, views kept) a kernel that
    recomputes it reads: its data inputs, through unrealized members of its own region; None where that body
    reads more than REALIZE_READS_THRESHOLD buffers (Inductor then writes the value once)."""
    leaves: dict[int, tuple[int, ...] | None] = {}
    in_ptr, in_idx = g.in_ptr, g.in_idx
    for p in np.flatnonzero((region >= 0) & ~realized).tolist():  # ids are a topological order: inputs first
        acc: set[int] = set()
        for a in in_idx[in_ptr[p] : in_ptr[p + 1]].tolist():
            q = int(src[a])
            sub = leaves.get(q) if region[q] == region[p] and not realized[q] else (a,)
            if sub is None:
                acc = set(range(REALIZE_READS_THRESHOLD + 1))  # a too-large body: too large here too
                break
            acc.update(sub)
        leaves[p] = tuple(sorted(acc)) if len(acc) <= REALIZE_READS_THRESHOLD else None
    return leaves


def region_boundary_bytes(
    g: Graph,
    region: np.ndarray,
    src: np.ndarray,
    read_cap: np.ndarray | None = None,
    pointwise: np.ndarray | None = None,
) -> tuple[np.ndarray, np.ndarray]:
    """(bytes read from outside, bytes written for outside) per region: what a fused kernel moves.

    A tensor read by several members is read once, as much of it as the member reading most reads (all of it, or
    at most ``read_cap[member]`` bytes: a gather reads the rows it writes); a member's output is written when a
    node outside the region (the output node included) uses it, or when nothing uses it (side effects, in-place
    writes). ``pointwise`` (bool per node): such a member whose value another region reads is recomputed there
    from the buffers it reads (the module docstring's realization rule), so it is not written for that region;
    a gather (finite ``read_cap``) is not recomputed.
    """
    num_regions = int(region.max()) + 1 if len(region) and region.max() >= 0 else 0
    if num_regions == 0:
        return np.zeros(0), np.zeros(0)
    n = len(g)
    prod, cons, actual, data = resolved_edges(g, src)
    rc, rp = region[cons], region[prod]
    is_view = (g.kinds == OpKind.VIEW) & (src != np.arange(n))
    has_user = np.zeros(n, bool)
    has_user[prod] = True
    extern_user = np.zeros(n, bool)  # a user no kernel of ours recomputes it in: an extern kernel or the output
    extern_user[prod[rc < 0]] = True
    inline = np.zeros(n, bool)
    if pointwise is not None:
        inline = np.asarray(pointwise, bool) & (region >= 0) & ~is_view
        if read_cap is not None:
            inline &= ~np.isfinite(read_cap)
    realized = ~inline | extern_user | ~has_user
    leaves = _recompute_leaves(g, region, src, realized) if inline.any() else {}
    cross = data & (rc >= 0) & (rp != rc)
    recompute = cross & np.asarray([leaves.get(q) is not None for q in prod.tolist()], bool)
    # what each region reads: the actual inputs of its cross edges, or a recomputed value's leaves instead
    pair_region = [rc[cross & ~recompute]]
    pair_node = [actual[cross & ~recompute]]
    pair_cap = [cons[cross & ~recompute]]
    for r, q, c in zip(rc[recompute].tolist(), prod[recompute].tolist(), cons[recompute].tolist(), strict=True):
        for leaf in leaves[q]:
            if region[src[leaf]] != r:  # a leaf the consumer's own region computes is not read
                pair_region.append(np.array([r]))
                pair_node.append(np.array([leaf]))
                pair_cap.append(np.array([c]))
    pr, pn, pc = (np.concatenate(x).astype(np.int64) for x in (pair_region, pair_node, pair_cap))
    # a view of its whole base (a detach, an alias, a reshape) is the base's buffer: read once with the base
    pn = np.where(g.out_bytes[pn] == g.out_bytes[src[pn]], src[pn], pn)
    pairs, inverse = np.unique(pr * n + pn, return_inverse=True)
    edge_bytes = g.out_bytes[pn].astype(np.float64)
    if read_cap is not None:
        edge_bytes = np.minimum(edge_bytes, read_cap[pc])
    pair_bytes = np.zeros(len(pairs))
    np.maximum.at(pair_bytes, inverse.reshape(-1), edge_bytes)
    read = np.bincount(pairs // n, weights=pair_bytes, minlength=num_regions)
    used_outside = np.zeros(n, bool)
    used_outside[prod[(rp >= 0) & (rc != rp) & ~recompute]] = True
    writes = (region >= 0) & ~is_view & (used_outside | ~has_user)
    written = np.bincount(region[writes], weights=g.out_bytes[writes], minlength=num_regions)
    return read, written

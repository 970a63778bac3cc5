"""Emitting a rewritten :class:`Graph` directly on the IR: the graph ``from_fx`` would import from an FX rewrite that
removed some nodes and added others (:class:`NewNode`), placed by the rewrite's stable topological sort
(:func:`commsched.rewrites.fxutil.stable_toposort`, replayed). Shared by the IR forms of the bucket rewrite
(:mod:`commsched.rewrites.bucket_graph`) and of the decomposed TP collectives
(:mod:`commsched.rewrites.decompose_graph`), whose tests check them field by field against ``from_fx``.
"""

from __future__ import annotations

import numpy as np

from commsched.ir import Graph, GraphError, OpKind
from commsched.ir.graph import csr
from commsched.ir.inplace import inplace_deps
from commsched.ir.transform import kahn_order
from commsched.sim.jit import ENABLED as JIT_ENABLED


class NewNode:
    """A node a rewrite adds, for :func:`emit_graph`: its ``name``, ``target`` and ``kind``; ``inputs`` by name (an
    old node's or an earlier new node's); ``buffers`` as (shape, dtype, nbytes, storage), the storage None (a new
    one), a node's name (its first buffer's storage) or (name, k) (its k-th buffer's); ``priority``: its sort key
    among the old nodes' positions (the FX rewrite's stable topological sort); ``coll``: (CollType, group, reduce op
    or None, in bytes, out bytes) for a collective; ``wait_of``: the collective a wait waits for, by name."""

    __slots__ = ("buffers", "coll", "flops", "inputs", "kind", "name", "priority", "side_effect", "target", "wait_of")

    def __init__(self, name, target, kind, inputs, buffers, priority, *, side_effect=False, coll=None, wait_of=None,
                 flops=0.0):  # fmt: skip
        self.name, self.target, self.kind, self.inputs, self.buffers = name, target, kind, inputs, buffers
        self.priority, self.side_effect, self.coll, self.wait_of = priority, side_effect, coll, wait_of
        self.flops = flops


class _Facts:
    """Per-node facts of a source graph as plain lists (built once per graph: the search buckets one graph many
    times, and numpy scalar access per node is the slow part of a rewrite)."""

    def __init__(self, g: Graph) -> None:
        n = len(g)
        self.names = g.names
        self.placeholder = np.asarray([t == "placeholder" for t in g.targets], bool)
        kinds = g.kinds.tolist()
        self.out_id = next((v for v in range(n - 1, -1, -1) if kinds[v] == OpKind.OUTPUT), None)


def _facts(g: Graph) -> _Facts:
    cache = g.__dict__.setdefault("_commsched_emit_facts", [])
    if not cache:
        cache.append(_Facts(g))
    return cache[0]


def _fx_order(g: Graph, pos: np.ndarray, removed: set[int], rename: dict[str, str], added: list[NewNode]) -> list:
    """The node sequence :func:`commsched.rewrites.fxutil.stable_toposort` leaves: old node ids and new nodes.

    The FX list at sort time is the surviving old nodes, then the new ones in creation order (inserted before the
    output), then the output; placeholders first by position, the output last, the rest by (priority, position)."""
    from commsched.passes.overlap_jit import kahn_jit  # the keyed topological sort, compiled

    f = _facts(g)
    n, out_id, names = len(g), f.out_id, f.names
    keep = np.ones(n, bool)
    keep[list(removed)] = False
    if out_id is not None:
        keep[out_id] = False
    kept = np.flatnonzero(keep)
    num_kept = len(kept)
    items: list = kept.tolist() + added + ([] if out_id is None else [out_id])
    m = len(items)
    at_old = np.full(n, -1, np.int64)  # old node -> its item index (-1: removed)
    at_old[kept] = np.arange(num_kept)
    if out_id is not None:
        at_old[out_id] = m - 1
    name_at = {it.name: num_kept + k for k, it in enumerate(added)}
    index = g.index

    def ref(name: str, data: bool) -> int:
        name = rename.get(name + "\0data", name) if data else rename.get(name, name)
        i = name_at.get(name)
        if i is None:
            v = index.get(name)
            i = -1 if v is None else int(at_old[v])
        return i

    # what an old node stands for, as data and as an ordering dependency (only removed nodes are renamed)
    data_ref, dep_ref = at_old.copy(), at_old.copy()
    for v in removed:
        data_ref[v], dep_ref[v] = ref(names[v], True), ref(names[v], False)
    new_src = [ref(name, True) for it in added for name in it.inputs]
    new_dst = [num_kept + k for k, it in enumerate(added) for _ in it.inputs]
    a, b = _fx_edges(g, at_old, data_ref, dep_ref)
    a, b = np.concatenate([a, np.asarray(new_src, np.int64)]), np.concatenate([b, np.asarray(new_dst, np.int64)])
    keep = (a >= 0) & (a != b)
    pairs = np.unique(a[keep] * m + b[keep])  # each edge once
    a, b = pairs // m, pairs % m
    succ_ptr, succ_idx = csr(m, b, a)
    indeg = np.bincount(b, minlength=m).astype(np.int64)
    # the sort key (class, value, item): placeholders by item, the rest by priority / position, the output last;
    # as ranks, so that the keyed sort's (key, item) order is the tuple order
    cls = np.ones(m, np.int64)
    val = np.empty(m, np.float64)
    val[:num_kept] = pos[kept]
    placeholder = np.flatnonzero(f.placeholder[kept])
    cls[placeholder], val[placeholder] = 0, placeholder
    val[num_kept : num_kept + len(added)] = [it.priority for it in added]
    if out_id is not None:
        cls[m - 1], val[m - 1] = 2, 0.0
    rank = np.empty(m, np.float64)
    rank[np.lexsort((np.arange(m), val, cls))] = np.arange(m)
    if JIT_ENABLED:
        order = kahn_jit(succ_ptr.astype(np.int64), succ_idx.astype(np.int64), indeg, rank)
    else:
        order = np.asarray(kahn_order(succ_ptr, succ_idx, indeg, rank), np.int64)
    if len(order) != m:
        raise GraphError("the bucketed graph has a cycle: the plan does not fit this order")
    return [items[i] for i in order.tolist()]


def _fx_edges(g: Graph, at_old: np.ndarray, data_ref: np.ndarray, dep_ref: np.ndarray):
    """(src, dst) item indices of the old nodes' data edges (the kept ones and the output's) and of every
    ordering edge; -1 for a removed node nothing stands for."""
    dst_v = _row_of(g.in_ptr)
    data = at_old[dst_v] >= 0
    dep_dst = dep_ref[_row_of(g.dep_ptr)]  # ordering edges (in-place hazards), remapped like ir_control_edges
    deps = dep_dst >= 0
    src = np.concatenate([data_ref[g.in_idx[data]], dep_ref[g.dep_idx[deps]]])
    return src, np.concatenate([at_old[dst_v[data]], dep_dst[deps]])


def emit_graph(g: Graph, pos, removed: set[int], rename: dict[str, str], smap_late: dict[int, str], added) -> Graph:
    """The rewritten graph: ``g`` without the ``removed`` node ids, plus the ``added`` :class:`NewNode` s, in the order
    the FX rewrite's stable topological sort leaves its module (``pos``: each old node's position, a float array;
    a new node's is its priority), with storages created where their owner runs, as ``from_fx`` (through
    :class:`GraphBuilder`) builds it from the rewritten module: the kept nodes' columns by array indexing, the few
    new nodes one by one. ``rename``: a removed node's name -> the new node that stands for it (``name + "\\0data"``:
    as data; ``name + "\\0reader"``: as a reader of its input's storage; ``name``: otherwise); ``smap_late``: a removed
    node's storage -> the new node whose storage replaces it. GraphError when a node reads a removed node nothing
    stands for, or the result has a cycle."""
    e = _Emit(g, _fx_order(g, pos, removed, rename, added), removed, rename)
    in_ptr, in_idx = _dedup(*e.rows(g.in_ptr, g.in_idx, e.data_map, {p: [e.ref(x, "\0data") for x in e.items[p].inputs]
                                                                       for p in e.new_pos}))  # fmt: skip
    buf_ptr, bufs = _buffers(e, smap_late)
    storage = bufs["storage"]
    coll, wait_of = _collectives(e)
    old, old_pos = e.old_v, e.old_pos
    kinds = np.empty(e.m, np.int8)
    kinds[old_pos] = g.kinds[old]
    flops = np.zeros(e.m, np.float64)
    flops[old_pos] = g.flops[old]
    side_effect = np.zeros(e.m, bool)
    side_effect[old_pos] = g.side_effect[old]
    for p in e.new_pos:
        it = e.items[p]
        kinds[p], side_effect[p], flops[p] = int(it.kind), bool(it.side_effect), it.flops
    # in-place ordering edges: from_fx's rule over the emitted sequence, plus the kept nodes' own edges remapped
    # (they stand for writes the IR does not show: an op that returns nothing of what it writes)
    dep_ptr, dep_idx = _sorted_unique(*e.rows(g.dep_ptr, g.dep_idx, e.reader_map, {}))
    inplace = inplace_deps(kinds, in_ptr, in_idx, buf_ptr, storage, bufs["storage_owner"], wait_of, coll["coll_sync"])
    dep_ptr, dep_idx = _merge_rows(dep_ptr, dep_idx, inplace)
    dep_ptr, dep_idx = _wait_deps(wait_of, in_ptr, in_idx, dep_ptr, dep_idx)
    return Graph(
        names=[g.names[it] if type(it) is int else it.name for it in e.items],
        targets=[g.targets[it] if type(it) is int else it.target for it in e.items],
        kinds=kinds, in_ptr=in_ptr.astype(np.int32), in_idx=in_idx.astype(np.int32),
        dep_ptr=dep_ptr.astype(np.int32), dep_idx=dep_idx.astype(np.int32), flops=flops,
        buf_ptr=buf_ptr.astype(np.int32), buf_shape=bufs["shape"], buf_dtype=bufs["dtype"],
        buf_nbytes=bufs["nbytes"], buf_storage=storage.astype(np.int32), storage_nbytes=bufs["storage_nbytes"],
        storage_owner=bufs["storage_owner"].astype(np.int32), side_effect=side_effect, **coll,
        wait_of=wait_of.astype(np.int32), groups=g.groups, meta=dict(g.meta),
    )  # fmt: skip


class _Emit:
    """The emitted sequence (``items``: old node ids and new nodes, in FX order) and what old nodes become in it."""

    def __init__(self, g: Graph, items: list, removed: set[int], rename: dict[str, str]) -> None:
        self.g, self.items, self.rename, self.m = g, items, rename, len(items)
        self.new_pos = [p for p, it in enumerate(items) if type(it) is not int]
        self.at_new = {items[p].name: p for p in self.new_pos}
        old_at = np.asarray([it if type(it) is int else -1 for it in items], np.int64)
        self.old_at = old_at  # position -> old node id (-1: a new node)
        self.old_pos = np.flatnonzero(old_at >= 0)
        self.old_v = old_at[self.old_pos]
        self.new_id = np.full(len(g), -1, np.int64)  # old node -> its position (kept nodes)
        self.new_id[self.old_v] = self.old_pos
        # what a removed node stands for: as data, as a reader (ordering dependency), plainly (a wait's collective)
        self.data_map, self.reader_map, self.plain_map = self.new_id.copy(), self.new_id.copy(), self.new_id.copy()
        for v in removed:
            name = g.names[v]
            for mapping, suffix in ((self.data_map, "\0data"), (self.reader_map, "\0reader"), (self.plain_map, "")):
                mapping[v] = self.ref(name, suffix, strict=False)

    def ref(self, name: str, suffix: str = "", strict: bool = True) -> int:
        """The position of what ``name`` stands for (a rename with ``suffix`` first); -1 if nothing (strict: raise)."""
        name = self.rename.get(name + suffix, name)
        p = self.at_new.get(name)
        if p is None:
            v = self.g.index.get(name)
            p = -1 if v is None else int(self.new_id[v])
        if p < 0 and strict:
            raise GraphError(f"bucketed graph: node {name!r} is used but not emitted")
        return p

    def rows(self, ptr: np.ndarray, idx: np.ndarray, mapping: np.ndarray, new_rows: dict[int, list[int]]):
        """CSR over the emitted items: each kept node's row of (``ptr``, ``idx``) through ``mapping``, each new
        node's row as given."""
        old_pos, old_v = self.old_pos, self.old_v
        lens = np.zeros(self.m, np.int64)
        lens[old_pos] = ptr[old_v + 1] - ptr[old_v]
        for p, row in new_rows.items():
            lens[p] = len(row)
        out_ptr = np.zeros(self.m + 1, np.int64)
        np.cumsum(lens, out=out_ptr[1:])
        vals = np.empty(int(out_ptr[-1]), np.int64)
        k = lens[old_pos]
        off = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
        vals[np.repeat(out_ptr[old_pos], k) + off] = mapping[idx[np.repeat(ptr[old_v].astype(np.int64), k) + off]]
        for p, row in new_rows.items():
            vals[out_ptr[p] : out_ptr[p + 1]] = row
        if len(vals) and vals.min() < 0:
            raise GraphError("bucketed graph: a node reads a removed node nothing stands for")
        return out_ptr, vals


def _row_of(ptr: np.ndarray) -> np.ndarray:
    """The row of every entry of a CSR with row pointers ``ptr``."""
    return np.repeat(np.arange(len(ptr) - 1, dtype=np.int64), np.diff(ptr))


def _dedup(ptr: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row without repeats, first occurrences in order (``GraphBuilder.add_node``'s rule)."""
    row = _row_of(ptr)
    _, first = np.unique(row * (len(ptr) + 1) + vals, return_index=True)
    if len(first) == len(vals):
        return ptr, vals
    keep = np.zeros(len(vals), bool)
    keep[first] = True
    return _ptr_of(row[keep], len(ptr) - 1), vals[keep]


def _sorted_unique(ptr: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row sorted, without repeats."""
    span = len(ptr) + 1
    key = np.unique(_row_of(ptr) * span + vals)
    return _ptr_of(key // span, len(ptr) - 1), key % span


def _ptr_of(row: np.ndarray, m: int) -> np.ndarray:
    ptr = np.zeros(m + 1, np.int64)
    np.cumsum(np.bincount(row, minlength=m), out=ptr[1:])
    return ptr


def _merge_rows(ptr: np.ndarray, vals: np.ndarray, rows: dict[int, list[int]]) -> tuple[np.ndarray, np.ndarray]:
    """CSR (``ptr``, ``vals``) with the entries in ``rows`` added to their rows (sorted, without repeats)."""
    if not any(rows.values()):
        return ptr, vals
    lists = np.split(vals, ptr[1:-1])
    for p, row in rows.items():
        if row:
            lists[p] = np.asarray(sorted({*lists[p].tolist(), *row}), np.int64)
    lens = np.asarray([len(x) for x in lists], np.int64)
    out = np.zeros(len(lists) + 1, np.int64)
    np.cumsum(lens, out=out[1:])
    return out, np.concatenate(lists) if lists else vals


def _buffers(e: _Emit, smap_late: dict[int, str]) -> tuple[np.ndarray, dict]:
    """Every emitted node's buffers and their storages: a storage is created where its owner (a kept node, or a new
    node's buffer without a storage) runs, numbered in that order; other buffers take the storage they alias."""
    g, m, old_pos, old_v = e.g, e.m, e.old_pos, e.old_v
    lens = np.zeros(m, np.int64)
    lens[old_pos] = g.buf_ptr[old_v + 1] - g.buf_ptr[old_v]
    for p in e.new_pos:
        lens[p] = len(e.items[p].buffers)
    ptr = _ptr_of(np.repeat(np.arange(m), lens), m)
    rows = int(ptr[-1])
    row_item = np.repeat(np.arange(m, dtype=np.int64), lens)
    src = np.full(rows, -1, np.int64)  # the kept node's buffer each row copies
    k = lens[old_pos]
    off = np.arange(int(k.sum())) - np.repeat(np.cumsum(k) - k, k)
    src[np.repeat(ptr[old_pos], k) + off] = np.repeat(g.buf_ptr[old_v].astype(np.int64), k) + off
    old_row = src >= 0
    src_storage = np.full(rows, -1, np.int64)
    src_storage[old_row] = g.buf_storage[src[old_row]]
    creator = np.zeros(rows, bool)
    creator[old_row] = g.storage_owner[src_storage[old_row]] == e.old_at[row_item[old_row]]
    nbytes = np.zeros(rows, np.int64)
    shapes, dtypes = g.buf_shape, g.buf_dtype
    shape = [shapes[b] if b >= 0 else None for b in src.tolist()]
    dtype = [dtypes[b] if b >= 0 else None for b in src.tolist()]
    nbytes[old_row] = g.buf_nbytes[src[old_row]]
    alias: dict[int, str | tuple[str, int]] = {}  # new node's row -> the name (and output) whose storage it takes
    for p in e.new_pos:
        for j, (shp, dt, nb, st) in enumerate(e.items[p].buffers):
            r = int(ptr[p]) + j
            shape[r], dtype[r], nbytes[r] = tuple(int(s) for s in shp), dt, int(nb)
            if st is None:
                creator[r] = True
            else:
                alias[r] = st
    created = np.cumsum(creator) - 1
    storage = np.where(creator, created, -1)
    smap = np.full(g.num_storages, -1, np.int64)  # old storage -> new (its kept owner's)
    old_creator = creator & old_row
    np.maximum.at(smap, src_storage[old_creator], created[old_creator])
    kept_alias = old_row & ~creator
    storage[kept_alias] = smap[src_storage[kept_alias]]
    late = np.flatnonzero(old_row & (storage < 0)).tolist()  # on a removed collective's storage: the new node's
    for r in sorted(late + list(alias)):
        st = alias[r] if r in alias else smap_late[int(src_storage[r])]
        name, j = (st, 0) if isinstance(st, str) else st
        storage[r] = storage[ptr[e.ref(name, "\0data")] + j]
    storage_nbytes = np.where(old_row, g.storage_nbytes[np.maximum(src_storage, 0)], nbytes)[creator]
    return ptr, {"shape": shape, "dtype": dtype, "nbytes": nbytes, "storage": storage,
                 "storage_nbytes": storage_nbytes.astype(np.int64), "storage_owner": row_item[creator]}  # fmt: skip


def _collectives(e: _Emit) -> tuple[dict, np.ndarray]:
    """The collective columns (as ``Graph`` takes them) and ``wait_of`` of the emitted nodes."""
    g, m, old_pos, old_v = e.g, e.m, e.old_pos, e.old_v
    coll = {"coll_type": np.full(m, -1, np.int8), "coll_group": np.full(m, -1, np.int16),
            "coll_in_bytes": np.zeros(m, np.int64), "coll_out_bytes": np.zeros(m, np.int64),
            "coll_sync": np.zeros(m, bool)}  # fmt: skip
    src = {"coll_type": g.coll_type, "coll_group": g.coll_group, "coll_in_bytes": g.coll_in_bytes,
           "coll_out_bytes": g.coll_out_bytes, "coll_sync": g.coll_sync}  # fmt: skip
    is_coll = g.coll_type[old_v] >= 0
    for key, col in coll.items():
        col[old_pos[is_coll]] = src[key][old_v[is_coll]]
    ops = {int(e.new_id[v]): op for v, op in g.coll_reduce_op.items() if e.new_id[v] >= 0}
    wait_of = np.full(m, -1, np.int64)
    waits = g.wait_of[old_v] >= 0
    wait_of[old_pos[waits]] = e.plain_map[g.wait_of[old_v[waits]]]
    for p in e.new_pos:
        it = e.items[p]
        if it.coll is not None:
            ct, grp, rop, ib, ob = it.coll
            coll["coll_type"][p], coll["coll_group"][p], coll["coll_in_bytes"][p] = int(ct), grp, ib
            coll["coll_out_bytes"][p] = ob
            if rop is not None:
                ops[p] = rop
        if it.wait_of is not None:
            wait_of[p] = e.ref(it.wait_of)
    coll["coll_reduce_op"] = dict(sorted(ops.items()))
    return coll, wait_of


def _wait_deps(wait_of, in_ptr, in_idx, dep_ptr, dep_idx) -> tuple[np.ndarray, np.ndarray]:
    """A wait depends on its collective (``GraphBuilder.set_wait``): appended where it is not already an input or
    a dependency."""
    extra: dict[int, int] = {}
    for w in np.flatnonzero(wait_of >= 0).tolist():
        c = int(wait_of[w])
        if c != w and c not in in_idx[in_ptr[w] : in_ptr[w + 1]] and c not in dep_idx[dep_ptr[w] : dep_ptr[w + 1]]:
            extra[w] = c
    if not extra:
        return dep_ptr, dep_idx
    lists = np.split(dep_idx, dep_ptr[1:-1])
    return _merge_rows(dep_ptr, dep_idx, {w: [*lists[w].tolist(), c] for w, c in extra.items()})

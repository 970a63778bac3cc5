"""A bucket plan applied to the IR: the graph ``from_fx`` would import from :func:`apply_bucket_plan`'s module.

The search in :mod:`commsched.optimize` tries many bucket plans; rewriting the FX module and re-importing it for each
costs about a second per plan on a 5k-node step (FakeTensor dispatch for every new node, recompilation). This
module builds the same :class:`Graph` directly: the same nodes, names, targets, kinds, edges, buffers and storages,
in the same order (the FX rewrite's stable topological sort, replayed). ``tests/rewrites/test_bucket_graph.py``
checks the two agree field by field on traced zoo steps, so a plan judged here is the program the FX rewrite runs.

New nodes are named ``{prefix}{k}_...`` (bucket ``k``) by both this module and the FX rewrite (:func:`new_names`),
so a schedule of the bucketed IR applies to the rewritten module by name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from commsched.ir import CollType, Graph, GraphError, OpKind
from commsched.ir.graph import Buffer, csr
from commsched.ir.transform import kahn_order
from commsched.rewrites.bucket_deps import inplace_ordering_deps, row_of
from commsched.rewrites.bucket_plan import Bucket, BucketPlan
from commsched.sim.jit import ENABLED as JIT_ENABLED

_COLL_TARGET = {
    "all_gather": "_c10d_functional.all_gather_into_tensor.default",
    "reduce_scatter": "_c10d_functional.reduce_scatter_tensor.default",
    "all_reduce": "_c10d_functional.all_reduce.default",
}
_COLL_TYPE = {"all_gather": CollType.ALL_GATHER, "reduce_scatter": CollType.REDUCE_SCATTER,
              "all_reduce": CollType.ALL_REDUCE}  # fmt: skip
WAIT_TARGET = "_c10d_functional.wait_tensor.default"


def name_prefix(names: Sequence[str]) -> str:
    """A prefix no existing node name starts with (``bkt``, ``bktx``, ...): a module bucketed twice keeps unique
    names."""
    prefix = "bkt"
    while any(n.startswith(prefix) for n in names):
        prefix += "x"
    return prefix


def new_names(prefix: str, k: int, members: int) -> dict[str, list[str] | str]:
    """The names of bucket ``k``'s nodes (no name ends in digits: FX would renumber it)."""
    b = f"{prefix}{k}"
    return {
        "clone": [f"{b}m{j}_clone" for j in range(members)],
        "flat": [f"{b}m{j}_flat" for j in range(members)],
        "cat": f"{b}_cat",
        "catflat": f"{b}_catflat",
        "coll": f"{b}_coll",
        "wait": f"{b}_wait",
        "rows": f"{b}_rows",
        "parts": f"{b}_parts",
        "piece": [f"{b}m{j}_piece" for j in range(members)],
        "out": [f"{b}m{j}_out" for j in range(members)],
    }


class _New:
    """A node the rewrite adds: inputs by name; buffers as (shape, dtype, nbytes, storage), the storage None (a new
    one), a node's name (its first buffer's storage) or (name, k) (its k-th buffer's)."""

    __slots__ = ("buffers", "coll", "flops", "inputs", "kind", "name", "priority", "side_effect", "target", "wait_of")

    def __init__(self, name, target, kind, inputs, buffers, priority, *, side_effect=False, coll=None, wait_of=None,
                 flops=0.0):  # fmt: skip
        self.name, self.target, self.kind, self.inputs, self.buffers = name, target, kind, inputs, buffers
        self.priority, self.side_effect, self.coll, self.wait_of = priority, side_effect, coll, wait_of
        self.flops = flops


def bucket_graph(
    g: Graph, plan: BucketPlan, order: Sequence[int] | np.ndarray | None = None, noncontiguous: frozenset = frozenset()
) -> Graph:
    """``g`` with every merged bucket of ``plan`` as one collective, in the order the FX rewrite leaves the module
    (``order``: the order ``plan`` assumed, as :func:`apply_bucket_plan` takes it). ``noncontiguous``: names of
    collective inputs whose FX value is not contiguous (the rewrite clones them). O(N log N)."""
    merged = plan.merged
    if not merged:
        return g
    index = g.index
    pos = np.arange(len(g), dtype=np.float64)
    if order is not None:
        pos[np.asarray(order, np.int64)] = np.arange(len(g))
    prefix = _facts(g).prefix
    removed: set[int] = set()
    rename: dict[str, str] = {}  # a removed node's name -> the node that stands for it (data and ordering)
    smap_late: dict[int, str] = {}  # a removed collective's storage -> the new node whose storage replaces it
    added: list[_New] = []
    for k, bucket in enumerate(merged):
        members = [index[m] for m in bucket.members]
        for m in members:
            if g.kinds[m] != OpKind.COLLECTIVE or len(g.inputs(m)) != 1:
                raise GraphError(f"bucket {k}: member {g.names[m]!r} is not a one-input {bucket.kind}")
        added += _bucket_nodes(g, bucket, k, prefix, members, pos, noncontiguous, removed, rename, smap_late)
    return _emit(g, pos, removed, rename, smap_late, added)


def _bucket_nodes(g, bucket: Bucket, k, prefix, members, pos, noncontiguous, removed, rename, smap_late) -> list:
    """The nodes of one merged bucket, as ``apply_bucket_plan`` creates them, in creation order."""
    names = new_names(prefix, k, len(members))
    kind, world = bucket.kind, int(g.groups[int(g.coll_group[members[0]])].size)
    waits = [int(w) for m in members for w in g.waits_of(m)]
    p_issue = float(max(pos[m] for m in members))
    p_wait = max(p_issue + 0.5, float(min(pos[w] for w in waits)))
    inputs = [int(g.inputs(m)[0]) for m in members]
    in_bufs = [_first_buffer(g, x) for x in inputs]
    dtype = in_bufs[0].dtype
    itemsize = in_bufs[0].nbytes // max(1, math.prod(in_bufs[0].shape)) if in_bufs[0].shape else in_bufs[0].nbytes
    numels = [math.prod(b.shape) for b in in_bufs]
    out: list[_New] = []
    flats = []
    for j, (x, buf, numel) in enumerate(zip(inputs, in_bufs, numels, strict=True)):
        src = g.names[x]
        if src in noncontiguous:  # the rewrite clones a non-contiguous input before viewing it flat
            out.append(_New(names["clone"][j], "aten.clone.default", OpKind.OTHER, [src],
                            [(buf.shape, dtype, buf.nbytes, None)], p_issue))  # fmt: skip
            src = names["clone"][j]
        shape = (world, numel // world) if kind == "reduce_scatter" else (numel,)
        out.append(_New(names["flat"][j], "aten.view.default", OpKind.VIEW, [src], [(shape, dtype, buf.nbytes, src)],
                        p_issue))  # fmt: skip
        flats.append(names["flat"][j])
    total = sum(numels)
    sizes = [n // world for n in numels] if kind == "reduce_scatter" else numels
    cat_shape = (world, total // world) if kind == "reduce_scatter" else (total,)
    out.append(_New(names["cat"], "aten.cat.default", OpKind.OTHER, flats, [(cat_shape, dtype, total * itemsize, None)],
                    p_issue))  # fmt: skip
    coll_in = names["cat"]
    if kind == "reduce_scatter":
        out.append(_New(names["catflat"], "aten.view.default", OpKind.VIEW, [coll_in],
                        [((total,), dtype, total * itemsize, coll_in)], p_issue))  # fmt: skip
        coll_in = names["catflat"]
    out_numel = {"all_gather": total * world, "reduce_scatter": total // world, "all_reduce": total}[kind]
    out_bytes = out_numel * itemsize
    coll = (_COLL_TYPE[kind], int(g.coll_group[members[0]]), g.coll_reduce_op.get(members[0]), total * itemsize,
            out_bytes)  # fmt: skip
    out.append(_New(names["coll"], _COLL_TARGET[kind], OpKind.COLLECTIVE, [coll_in],
                    [((out_numel,), dtype, out_bytes, None)], p_issue, side_effect=True, coll=coll))  # fmt: skip
    parts = _wait_side(out, names, kind, world, dtype, itemsize, total, out_bytes, sizes, p_wait)
    cloned = [g.names[x] in noncontiguous for x in inputs]
    _member_results(g, out, names, kind, members, parts, cloned, p_wait, (removed, rename, smap_late))
    return out


def _wait_side(out: list, names: dict, kind: str, world: int, dtype: str, itemsize: int, total: int,
               out_bytes: int, sizes: list[int], p_wait: float) -> list:  # fmt: skip
    """Append the merged wait and the split of its result; returns the split's buffers (one per member)."""
    out_numel = out_bytes // itemsize
    out.append(_New(names["wait"], WAIT_TARGET, OpKind.WAIT, [names["coll"]],
                    [((out_numel,), dtype, out_bytes, names["coll"])], p_wait, side_effect=True,
                    wait_of=names["coll"]))  # fmt: skip
    if kind == "all_gather":  # one row per rank; every row split, each member's pieces copied out contiguous
        out.append(_New(names["rows"], "aten.view.default", OpKind.VIEW, [names["wait"]],
                        [((world, total), dtype, out_bytes, names["wait"])], p_wait))  # fmt: skip
        parts = [((world, n), dtype, world * n * itemsize, None) for n in sizes]
        out.append(_New(names["parts"], "aten.split_with_sizes_copy.default", OpKind.OTHER, [names["rows"]], parts,
                        p_wait))  # fmt: skip
        return parts
    parts = [((n,), dtype, n * itemsize, names["wait"]) for n in sizes]
    out.append(_New(names["parts"], "aten.split_with_sizes.default", OpKind.VIEW, [names["wait"]], parts, p_wait))
    return parts


def _member_results(g: Graph, out: list, names: dict, kind: str, members: list[int], parts: list,
                    cloned: list[bool], p_wait: float, records: tuple) -> None:  # fmt: skip
    """Append each member's result (a piece of the split, viewed in its own shape) and record what the member's
    collective and waits become: removed, renamed (as a dependency, as a reader, as data) and their storage."""
    removed, rename, smap_late = records
    for j, m in enumerate(members):
        piece_buf, dtype = parts[j], parts[j][1]
        piece_storage = names["piece"][j] if kind == "all_gather" else names["wait"]
        out.append(_New(names["piece"][j], "getitem", OpKind.VIEW, [names["parts"]],
                        [(piece_buf[0], dtype, piece_buf[2], (names["parts"], j))], p_wait))  # fmt: skip
        result = _first_buffer(g, m)
        out.append(_New(names["out"][j], "aten.view.default", OpKind.VIEW, [names["piece"][j]],
                        [(result.shape, dtype, piece_buf[2], names["piece"][j])], p_wait))  # fmt: skip
        removed.add(m)
        rename[g.names[m]] = names["cat"]
        # as a reader of its input's storage (in-place writers after it depend on it) the member is now its clone
        # or the concatenation
        rename[g.names[m] + "\0reader"] = names["clone"][j] if cloned[j] else names["cat"]
        smap_late[int(result.storage)] = piece_storage
        for w in g.waits_of(m):
            removed.add(int(w))
            rename[g.names[int(w)]] = names["wait"]
            rename[g.names[int(w)] + "\0data"] = names["out"][j]  # data users of the wait read the member's result


def _first_buffer(g: Graph, v: int) -> Buffer:
    b = int(g.buf_ptr[v])  # (not g.buffers(v): a collective's input may be one of hundreds of split outputs)
    return Buffer(g.buf_shape[b], g.buf_dtype[b], int(g.buf_nbytes[b]), int(g.buf_storage[b]))


class _Facts:
    """Per-node facts of a source graph as plain lists (built once per graph: the search buckets one graph many
    times, and numpy scalar access per node is the slow part of a rewrite)."""

    def __init__(self, g: Graph) -> None:
        n = len(g)
        self.names = g.names
        self.placeholder = np.asarray([t == "placeholder" for t in g.targets], bool)
        kinds = g.kinds.tolist()
        self.out_id = next((v for v in range(n - 1, -1, -1) if kinds[v] == OpKind.OUTPUT), None)
        self.prefix = name_prefix(g.names)


def _facts(g: Graph) -> _Facts:
    cache = g.__dict__.setdefault("_commsched_bucket_facts", [])
    if not cache:
        cache.append(_Facts(g))
    return cache[0]


def _fx_order(g: Graph, pos: np.ndarray, removed: set[int], rename: dict[str, str], added: list[_New]) -> list:
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
    dst_v = row_of(g.in_ptr)
    data = at_old[dst_v] >= 0
    dep_dst = dep_ref[row_of(g.dep_ptr)]  # ordering edges (in-place hazards), remapped like ir_control_edges
    deps = dep_dst >= 0
    src = np.concatenate([data_ref[g.in_idx[data]], dep_ref[g.dep_idx[deps]]])
    return src, np.concatenate([at_old[dst_v[data]], dep_dst[deps]])


def _emit(g: Graph, pos, removed: set[int], rename: dict[str, str], smap_late: dict[int, str], added) -> Graph:
    """Build the bucketed graph in FX order, with storages created where their owner runs, as ``from_fx`` (through
    :class:`GraphBuilder`) builds it from the rewritten module: the kept nodes' columns by array indexing, the few
    new nodes one by one."""
    e = _Emit(g, _fx_order(g, pos, removed, rename, added), removed, rename)
    in_ptr, in_idx = _dedup(*e.rows(g.in_ptr, g.in_idx, e.data_map, {p: [e.ref(x, "\0data") for x in e.items[p].inputs]
                                                                       for p in e.new_pos}))  # fmt: skip
    buf_ptr, bufs = _buffers(e, smap_late)
    storage = bufs["storage"]
    dep_ptr, dep_idx = _sorted_unique(*e.rows(g.dep_ptr, g.dep_idx, e.reader_map, {}))
    new_deps = inplace_ordering_deps(e, in_ptr, in_idx, buf_ptr, storage, bufs["creator"])
    dep_ptr, dep_idx = _merge_rows(dep_ptr, dep_idx, new_deps)
    coll, wait_of = _collectives(e)
    dep_ptr, dep_idx = _wait_deps(wait_of, in_ptr, in_idx, dep_ptr, dep_idx)
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


def _dedup(ptr: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row without repeats, first occurrences in order (``GraphBuilder.add_node``'s rule)."""
    row = row_of(ptr)
    _, first = np.unique(row * (len(ptr) + 1) + vals, return_index=True)
    if len(first) == len(vals):
        return ptr, vals
    keep = np.zeros(len(vals), bool)
    keep[first] = True
    return _ptr_of(row[keep], len(ptr) - 1), vals[keep]


def _sorted_unique(ptr: np.ndarray, vals: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row sorted, without repeats."""
    span = len(ptr) + 1
    key = np.unique(row_of(ptr) * span + vals)
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
                 "storage_nbytes": storage_nbytes.astype(np.int64), "storage_owner": row_item[creator],
                 "creator": creator}  # fmt: skip


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


def noncontiguous_inputs(gm, g: Graph) -> frozenset[str]:
    """Names of the collectives' inputs in ``gm`` whose FakeTensor value is not contiguous (what
    :func:`bucket_graph` needs to know of the FX module: the FX rewrite clones these before flattening)."""
    wanted = {g.names[int(x)] for c in g.collectives.tolist() for x in g.inputs(c).tolist()}
    out = set()
    for node in gm.graph.nodes:
        if node.name in wanted:
            val = node.meta.get("val")
            if val is not None and hasattr(val, "is_contiguous") and not val.is_contiguous():
                out.add(node.name)
    return frozenset(out)

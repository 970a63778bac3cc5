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

from commsched.ir import CollType, Graph, GraphBuilder, GraphError, OpKind
from commsched.ir.graph import csr
from commsched.ir.transform import kahn_order
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
_NOT_WRITERS = (int(OpKind.VIEW), int(OpKind.WAIT), int(OpKind.INPUT), int(OpKind.OUTPUT))


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

    __slots__ = ("buffers", "coll", "inputs", "kind", "name", "priority", "side_effect", "target", "wait_of")

    def __init__(self, name, target, kind, inputs, buffers, priority, *, side_effect=False, coll=None, wait_of=None):
        self.name, self.target, self.kind, self.inputs, self.buffers = name, target, kind, inputs, buffers
        self.priority, self.side_effect, self.coll, self.wait_of = priority, side_effect, coll, wait_of


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
    prefix = name_prefix(g.names)
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
    in_bufs = [g.buffers(x)[0] for x in inputs]
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
        result = g.buffers(m)[0]
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


class _Facts:
    """Per-node facts of a source graph as plain lists (built once per graph: the search buckets one graph many
    times, and numpy scalar access per node is the slow part of a rewrite)."""

    def __init__(self, g: Graph) -> None:
        n = len(g)
        self.names, self.targets = g.names, g.targets
        self.kinds = g.kinds.tolist()
        self.op_kinds = [OpKind(k) for k in self.kinds]
        ip, ii, dp, di = g.in_ptr.tolist(), g.in_idx.tolist(), g.dep_ptr.tolist(), g.dep_idx.tolist()
        self.inputs = [ii[ip[v] : ip[v + 1]] for v in range(n)]
        self.deps = [di[dp[v] : dp[v + 1]] for v in range(n)]
        self.flops = g.flops.tolist()
        self.side_effect = g.side_effect.tolist()
        bp, nbytes, storage = g.buf_ptr.tolist(), g.buf_nbytes.tolist(), g.buf_storage.tolist()
        self.buffers = [
            [(g.buf_shape[b], g.buf_dtype[b], nbytes[b], storage[b]) for b in range(bp[v], bp[v + 1])]
            for v in range(n)
        ]
        self.storage_owner, self.storage_nbytes = g.storage_owner.tolist(), g.storage_nbytes.tolist()
        ct, grp, ib, ob, sync = (a.tolist() for a in (g.coll_type, g.coll_group, g.coll_in_bytes, g.coll_out_bytes,
                                                       g.coll_sync))  # fmt: skip
        self.coll = [
            (CollType(ct[v]), grp[v], g.coll_reduce_op.get(v), ib[v], ob[v], sync[v]) if ct[v] >= 0 else None
            for v in range(n)
        ]
        self.wait_of = g.wait_of.tolist()
        self.placeholder = [t == "placeholder" for t in g.targets]
        self.out_id = next((v for v in range(n - 1, -1, -1) if self.kinds[v] == OpKind.OUTPUT), None)


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
    kept = [v for v in range(n) if v not in removed and v != out_id]
    items: list = kept + added
    if out_id is not None:
        items.append(out_id)
    at_old = [-1] * n  # old node -> its item index (-1: removed)
    for i, v in enumerate(kept):
        at_old[v] = i
    if out_id is not None:
        at_old[out_id] = len(items) - 1
    name_at = {it.name: len(kept) + k for k, it in enumerate(added)}
    index = g.index

    def ref(name: str, data: bool) -> int:
        name = rename.get(name + "\0data", name) if data else rename.get(name, name)
        i = name_at.get(name)
        if i is None:
            v = index.get(name)
            i = -1 if v is None else at_old[v]
        return i

    # what an old node stands for, as data and as an ordering dependency (only removed nodes are renamed)
    data_ref, dep_ref = list(at_old), list(at_old)
    for v in removed:
        data_ref[v], dep_ref[v] = ref(names[v], True), ref(names[v], False)
    src, dst = _fx_edges(f, items, len(kept), data_ref, dep_ref)
    for k, it in enumerate(added):
        for name in it.inputs:
            src.append(ref(name, True))
            dst.append(len(kept) + k)
    m = len(items)
    a, b = np.asarray(src, np.int64), np.asarray(dst, np.int64)
    keep = (a >= 0) & (a != b)
    pairs = np.unique(a[keep] * m + b[keep])  # each edge once
    a, b = pairs // m, pairs % m
    succ_ptr, succ_idx = csr(m, b, a)
    indeg = np.bincount(b, minlength=m).astype(np.int64)
    # the sort key (class, value, item): placeholders by item, the rest by priority / position, the output last;
    # as ranks, so that the keyed sort's (key, item) order is the tuple order
    cls = np.ones(m, np.int64)
    val = np.empty(m, np.float64)
    for i, it in enumerate(items):
        if isinstance(it, _New):
            val[i] = it.priority
        elif f.placeholder[it]:
            cls[i], val[i] = 0, float(i)
        elif it == out_id:
            cls[i], val[i] = 2, 0.0
        else:
            val[i] = float(pos[it])
    rank = np.empty(m, np.float64)
    rank[np.lexsort((np.arange(m), val, cls))] = np.arange(m)
    if JIT_ENABLED:
        order = kahn_jit(succ_ptr.astype(np.int64), succ_idx.astype(np.int64), indeg, rank)
    else:
        order = np.asarray(kahn_order(succ_ptr, succ_idx, indeg, rank), np.int64)
    if len(order) != m:
        raise GraphError("the bucketed graph has a cycle: the plan does not fit this order")
    return [items[i] for i in order.tolist()]


def _fx_edges(f: _Facts, items: list, num_kept: int, data_ref: list[int], dep_ref: list[int]):
    """(src, dst) item indices of the old nodes' data edges (the kept ones and the output's) and of every
    ordering edge; -1 for a removed node nothing stands for."""
    src: list[int] = []
    dst: list[int] = []
    old = list(enumerate(items[:num_kept]))
    if f.out_id is not None:
        old.append((len(items) - 1, f.out_id))
    for i, v in old:
        for u in f.inputs[v]:
            src.append(data_ref[u])
            dst.append(i)
    for v in range(len(f.names)):  # ordering edges (in-place hazards), remapped like ir_control_edges
        b = dep_ref[v]
        if b >= 0:
            for d in f.deps[v]:
                src.append(dep_ref[d])
                dst.append(b)
    return src, dst


def _emit(g: Graph, pos, removed: set[int], rename: dict[str, str], smap_late: dict[int, str], added) -> Graph:
    """Build the bucketed graph in FX order, with storages created where their owner runs (as from_fx does)."""
    f = _facts(g)
    names = f.names
    b = GraphBuilder(g.meta)
    for grp in g.groups:
        b.group(grp.name, grp.size, grp.stride)
    ids: dict[str, int] = {}
    smap: dict[int, int] = {}  # old storage -> new storage
    last_writer: dict[int, int] = {}  # new storage -> the node that last wrote it in place
    new_id = [-1] * len(g)  # old node -> its new id (kept nodes, once emitted)

    def storage_of(name: str, k: int = 0) -> int:
        return b.node_storages(ids[rename.get(name + "\0data", name)])[k]

    def as_data(u: int) -> int:  # the new id standing for old node u's data
        return ids[rename.get(names[u] + "\0data", names[u])] if u in removed else new_id[u]

    def as_reader(d: int) -> int:  # ... and for old node d as an ordering dependency
        return ids[rename.get(names[d] + "\0reader", names[d])] if d in removed else new_id[d]

    for it in _fx_order(g, pos, removed, rename, added):
        if isinstance(it, _New):
            _emit_new(b, it, ids, last_writer, rename, storage_of)
            continue
        v = it
        nid = len(b)
        bufs = []
        for shape, dtype, nbytes, s in f.buffers[v]:
            if f.storage_owner[s] == v:
                smap[s] = b.new_storage(f.storage_nbytes[s], nid)
            elif s not in smap:
                smap[s] = storage_of(smap_late[s])
            bufs.append((shape, dtype, nbytes, smap[s]))
        inputs = [as_data(u) for u in f.inputs[v]]
        deps = sorted({as_reader(d) for d in f.deps[v]})
        nid = b.add_node(names[v], f.targets[v], f.op_kinds[v], inputs, buffers=bufs, flops=f.flops[v],
                         side_effect=f.side_effect[v], deps=deps)  # fmt: skip
        ids[names[v]] = new_id[v] = nid
        if f.kinds[v] not in _NOT_WRITERS:  # an in-place result: its output lives on an input's storage
            read = {st for i in inputs for st in b.node_storages(i)}
            for buf in bufs:
                if buf[3] in read:
                    last_writer[buf[3]] = nid
        coll = f.coll[v]
        if coll is not None:
            b.set_collective(nid, *coll)
        w = f.wait_of[v]
        if w >= 0:
            b.set_wait(nid, ids[rename.get(names[w], names[w])])
    return b.build(validate=False)


def _emit_new(b: GraphBuilder, it: _New, ids: dict[str, int], last_writer: dict[int, int], rename: dict[str, str],
              storage_of) -> None:  # fmt: skip
    """Append one node the rewrite adds."""
    bufs = []
    for shape, dtype, nbytes, st in it.buffers:
        st = None if st is None else storage_of(st) if isinstance(st, str) else storage_of(*st)
        bufs.append((shape, dtype, nbytes, st))
    inputs = [ids[rename.get(x + "\0data", x)] for x in it.inputs]  # a member may read an earlier one
    # read after an in-place write: after the writer (from_fx's rule; the member read its input directly, a new
    # node may read it through a view)
    deps = (
        []
        if it.kind in (OpKind.VIEW, OpKind.WAIT)
        else sorted(
            {w for i in inputs for st in b.node_storages(i) if (w := last_writer.get(st)) is not None} - set(inputs)
        )
    )
    nid = b.add_node(it.name, it.target, it.kind, inputs, buffers=bufs, side_effect=it.side_effect, deps=deps)
    if it.coll is not None:
        b.set_collective(nid, *it.coll)
    if it.wait_of is not None:
        b.set_wait(nid, ids[it.wait_of])
    ids[it.name] = nid


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

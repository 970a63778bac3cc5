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

import heapq
import math
from collections.abc import Sequence

import numpy as np

from commsched.ir import CollType, Graph, GraphBuilder, GraphError, OpKind
from commsched.rewrites.bucket_plan import Bucket, BucketPlan

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


def _fx_order(g: Graph, pos: np.ndarray, removed: set[int], rename: dict[str, str], added: list[_New]) -> list:
    """The node sequence :func:`commsched.rewrites.fxutil.stable_toposort` leaves: old node ids and new nodes.

    The FX list at sort time is the surviving old nodes, then the new ones in creation order (inserted before the
    output), then the output; placeholders first by position, the output last, the rest by (priority, position)."""
    out_id = next((v for v in range(len(g) - 1, -1, -1) if g.kinds[v] == OpKind.OUTPUT), None)
    items: list = [v for v in range(len(g)) if v not in removed and v != out_id] + added
    if out_id is not None:
        items.append(out_id)
    at = {(it if isinstance(it, int) else it.name): i for i, it in enumerate(items)}
    name_at = {g.names[v]: i for v, i in at.items() if isinstance(v, int)}
    name_at.update((k, i) for k, i in at.items() if isinstance(k, str))

    def ref(name: str, data: bool) -> int | None:
        name = rename.get(name + "\0data", name) if data else rename.get(name, name)
        return name_at.get(name)

    succ: list[list[int]] = [[] for _ in items]
    indeg = [0] * len(items)
    seen: set[tuple[int, int]] = set()

    def edge(a: int | None, b: int) -> None:
        if a is None or a == b or (a, b) in seen:
            return
        seen.add((a, b))
        succ[a].append(b)
        indeg[b] += 1

    for i, it in enumerate(items):
        if isinstance(it, int):
            for u in g.inputs(it).tolist():
                edge(ref(g.names[u], True), i)
        else:
            for name in it.inputs:
                edge(ref(name, True), i)
    for v in range(len(g)):  # ordering edges (in-place hazards), remapped like ir_control_edges
        dst = ref(g.names[v], False)
        for d in g.deps(v).tolist():
            if dst is not None:
                edge(ref(g.names[d], False), dst)
    keys = []
    for i, it in enumerate(items):
        if isinstance(it, int) and g.targets[it] == "placeholder":
            keys.append((0, float(i), 0))
        elif isinstance(it, int) and it == out_id:
            keys.append((2, 0.0, i))
        else:
            keys.append((1, float(pos[it]) if isinstance(it, int) else it.priority, i))
    heap = [(keys[i], i) for i in range(len(items)) if indeg[i] == 0]
    heapq.heapify(heap)
    out = []
    while heap:
        _, i = heapq.heappop(heap)
        out.append(items[i])
        for s in succ[i]:
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(heap, (keys[s], s))
    if len(out) != len(items):
        raise GraphError("the bucketed graph has a cycle: the plan does not fit this order")
    return out


def _emit(g: Graph, pos, removed: set[int], rename: dict[str, str], smap_late: dict[int, str], added) -> Graph:
    """Build the bucketed graph in FX order, with storages created where their owner runs (as from_fx does)."""
    b = GraphBuilder(g.meta)
    for grp in g.groups:
        b.group(grp.name, grp.size, grp.stride)
    ids: dict[str, int] = {}
    smap: dict[int, int] = {}  # old storage -> new storage
    last_writer: dict[int, int] = {}  # new storage -> the node that last wrote it in place

    def storage_of(name: str, k: int = 0) -> int:
        return b.node_storages(ids[rename.get(name + "\0data", name)])[k]

    for it in _fx_order(g, pos, removed, rename, added):
        if isinstance(it, _New):
            bufs = []
            for shape, dtype, nbytes, st in it.buffers:
                st = None if st is None else storage_of(st) if isinstance(st, str) else storage_of(*st)
                bufs.append((shape, dtype, nbytes, st))
            inputs = [ids[rename.get(x + "\0data", x)] for x in it.inputs]  # a member may read an earlier one
            # read after an in-place write: after the writer (from_fx's rule; the member read its input directly,
            # a new node may read it through a view)
            deps = (
                []
                if it.kind in (OpKind.VIEW, OpKind.WAIT)
                else sorted(
                    {w for i in inputs for st in b.node_storages(i) if (w := last_writer.get(st)) is not None}
                    - set(inputs)
                )
            )
            nid = b.add_node(it.name, it.target, it.kind, inputs, buffers=bufs, side_effect=it.side_effect, deps=deps)
            if it.coll is not None:
                b.set_collective(nid, *it.coll)
            if it.wait_of is not None:
                b.set_wait(nid, ids[it.wait_of])
            ids[it.name] = nid
            continue
        v = it
        nid = len(b)
        bufs = []
        for buf in g.buffers(v):
            s = int(buf.storage)
            if int(g.storage_owner[s]) == v:
                smap[s] = b.new_storage(int(g.storage_nbytes[s]), nid)
            elif s not in smap:
                smap[s] = storage_of(smap_late[s])
            bufs.append((buf.shape, buf.dtype, buf.nbytes, smap[s]))
        inputs = [ids[rename.get(g.names[u] + "\0data", g.names[u])] for u in g.inputs(v).tolist()]
        deps = {ids[rename.get(g.names[d] + "\0reader", g.names[d])] for d in g.deps(v).tolist()}
        nid = b.add_node(g.names[v], g.targets[v], OpKind(int(g.kinds[v])), inputs, buffers=bufs,
                         flops=float(g.flops[v]), side_effect=bool(g.side_effect[v]), deps=sorted(deps))  # fmt: skip
        ids[g.names[v]] = nid
        kind = int(g.kinds[v])
        if kind not in _NOT_WRITERS:  # an in-place result: its output lives on an input's storage
            read = {st for i in inputs for st in b.node_storages(i)}
            for buf in bufs:
                if buf[3] in read:
                    last_writer[buf[3]] = nid
        if g.coll_type[v] >= 0:
            b.set_collective(nid, CollType(int(g.coll_type[v])), int(g.coll_group[v]), g.coll_reduce_op.get(v),
                             int(g.coll_in_bytes[v]), int(g.coll_out_bytes[v]), bool(g.coll_sync[v]))  # fmt: skip
        if g.wait_of[v] >= 0:
            b.set_wait(nid, ids[rename.get(g.names[int(g.wait_of[v])], g.names[int(g.wait_of[v])])])
    return b.build(validate=False)


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

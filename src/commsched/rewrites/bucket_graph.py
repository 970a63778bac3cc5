"""A bucket plan applied to the IR: the graph ``from_fx`` would import from :func:`apply_bucket_plan`'s module.

The search in :mod:`commsched.optimize` tries many bucket plans; rewriting the FX module and re-importing it for each
costs about a second per plan on a 5k-node step (FakeTensor dispatch for every new node, recompilation). This
module builds the same :class:`Graph` directly: the same nodes, names, targets, kinds, edges, buffers and storages,
in the same order (the FX rewrite's stable topological sort, replayed by :mod:`commsched.rewrites.graph_emit`).
``tests/rewrites/test_bucket_graph.py`` checks the two agree field by field on traced zoo steps, so a plan judged
here is the program the FX rewrite runs.

New nodes are named ``{prefix}{k}_...`` (bucket ``k``) by both this module and the FX rewrite (:func:`new_names`),
so a schedule of the bucketed IR applies to the rewritten module by name.
"""

from __future__ import annotations

import math
from collections.abc import Sequence

import numpy as np

from commsched.ir import CollType, Graph, GraphError, OpKind
from commsched.ir.graph import Buffer
from commsched.rewrites.bucket_plan import Bucket, BucketPlan
from commsched.rewrites.graph_emit import NewNode, emit_graph

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
    prefix = _prefix(g)
    removed: set[int] = set()
    rename: dict[str, str] = {}  # a removed node's name -> the node that stands for it (data and ordering)
    smap_late: dict[int, str] = {}  # a removed collective's storage -> the new node whose storage replaces it
    added: list[NewNode] = []
    for k, bucket in enumerate(merged):
        members = [index[m] for m in bucket.members]
        for m in members:
            if g.kinds[m] != OpKind.COLLECTIVE or len(g.inputs(m)) != 1:
                raise GraphError(f"bucket {k}: member {g.names[m]!r} is not a one-input {bucket.kind}")
        added += _bucket_nodes(g, bucket, k, prefix, members, pos, noncontiguous, removed, rename, smap_late)
    return emit_graph(g, pos, removed, rename, smap_late, added)


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
    out: list[NewNode] = []
    flats = []
    for j, (x, buf, numel) in enumerate(zip(inputs, in_bufs, numels, strict=True)):
        src = g.names[x]
        if src in noncontiguous:  # the rewrite clones a non-contiguous input before viewing it flat
            out.append(NewNode(names["clone"][j], "aten.clone.default", OpKind.OTHER, [src],
                               [(buf.shape, dtype, buf.nbytes, None)], p_issue))  # fmt: skip
            src = names["clone"][j]
        shape = (world, numel // world) if kind == "reduce_scatter" else (numel,)
        out.append(NewNode(names["flat"][j], "aten.view.default", OpKind.VIEW, [src], [(shape, dtype, buf.nbytes, src)],
                           p_issue))  # fmt: skip
        flats.append(names["flat"][j])
    total = sum(numels)
    sizes = [n // world for n in numels] if kind == "reduce_scatter" else numels
    cat_shape = (world, total // world) if kind == "reduce_scatter" else (total,)
    out.append(NewNode(names["cat"], "aten.cat.default", OpKind.OTHER, flats,
                       [(cat_shape, dtype, total * itemsize, None)], p_issue))  # fmt: skip
    coll_in = names["cat"]
    if kind == "reduce_scatter":
        out.append(NewNode(names["catflat"], "aten.view.default", OpKind.VIEW, [coll_in],
                           [((total,), dtype, total * itemsize, coll_in)], p_issue))  # fmt: skip
        coll_in = names["catflat"]
    out_numel = {"all_gather": total * world, "reduce_scatter": total // world, "all_reduce": total}[kind]
    out_bytes = out_numel * itemsize
    coll = (_COLL_TYPE[kind], int(g.coll_group[members[0]]), g.coll_reduce_op.get(members[0]), total * itemsize,
            out_bytes)  # fmt: skip
    out.append(NewNode(names["coll"], _COLL_TARGET[kind], OpKind.COLLECTIVE, [coll_in],
                       [((out_numel,), dtype, out_bytes, None)], p_issue, side_effect=True, coll=coll))  # fmt: skip
    parts = _wait_side(out, names, kind, world, dtype, itemsize, total, out_bytes, sizes, p_wait)
    cloned = [g.names[x] in noncontiguous for x in inputs]
    _member_results(g, out, names, kind, members, parts, cloned, p_wait, (removed, rename, smap_late))
    return out


def _wait_side(out: list, names: dict, kind: str, world: int, dtype: str, itemsize: int, total: int,
               out_bytes: int, sizes: list[int], p_wait: float) -> list:  # fmt: skip
    """Append the merged wait and the split of its result; returns the split's buffers (one per member)."""
    out_numel = out_bytes // itemsize
    out.append(NewNode(names["wait"], WAIT_TARGET, OpKind.WAIT, [names["coll"]],
                       [((out_numel,), dtype, out_bytes, names["coll"])], p_wait, side_effect=True,
                       wait_of=names["coll"]))  # fmt: skip
    if kind == "all_gather":  # one row per rank; every row split, each member's pieces copied out contiguous
        out.append(NewNode(names["rows"], "aten.view.default", OpKind.VIEW, [names["wait"]],
                           [((world, total), dtype, out_bytes, names["wait"])], p_wait))  # fmt: skip
        parts = [((world, n), dtype, world * n * itemsize, None) for n in sizes]
        out.append(NewNode(names["parts"], "aten.split_with_sizes_copy.default", OpKind.OTHER, [names["rows"]], parts,
                           p_wait))  # fmt: skip
        return parts
    parts = [((n,), dtype, n * itemsize, names["wait"]) for n in sizes]
    out.append(NewNode(names["parts"], "aten.split_with_sizes.default", OpKind.VIEW, [names["wait"]], parts, p_wait))
    return parts


def _member_results(g: Graph, out: list, names: dict, kind: str, members: list[int], parts: list,
                    cloned: list[bool], p_wait: float, records: tuple) -> None:  # fmt: skip
    """Append each member's result (a piece of the split, viewed in its own shape) and record what the member's
    collective and waits become: removed, renamed (as a dependency, as a reader, as data) and their storage."""
    removed, rename, smap_late = records
    for j, m in enumerate(members):
        piece_buf, dtype = parts[j], parts[j][1]
        piece_storage = names["piece"][j] if kind == "all_gather" else names["wait"]
        out.append(NewNode(names["piece"][j], "getitem", OpKind.VIEW, [names["parts"]],
                           [(piece_buf[0], dtype, piece_buf[2], (names["parts"], j))], p_wait))  # fmt: skip
        result = _first_buffer(g, m)
        out.append(NewNode(names["out"][j], "aten.view.default", OpKind.VIEW, [names["piece"][j]],
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


def _prefix(g: Graph) -> str:
    """:func:`name_prefix` of ``g``'s names, once per graph (the search buckets one graph many times)."""
    cache = g.__dict__.setdefault("_commsched_bucket_prefix", [])
    if not cache:
        cache.append(name_prefix(g.names))
    return cache[0]


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

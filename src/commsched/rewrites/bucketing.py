"""Bucketing as an FX rewrite: each planned bucket becomes one flat buffer, one collective, one wait, and views.

Layouts (``W`` ranks; member ``j`` has ``n_j`` elements per rank, offsets ``o_j`` in the flat buffer of ``N``):

* all_gather: ``flat = cat(x_j.flatten())``; the gathered ``[W * N]`` is rank-major, so member ``j``'s result is
  the column block ``[:, o_j : o_j + n_j]`` of its ``[W, N]`` view, copied out contiguous (``split_with_sizes_copy``)
  and viewed as ``[W * rows_j, ...]``: exactly what its own all_gather returned.
* reduce_scatter: each input is ``W`` rank chunks; ``cat(x_j.view(W, -1), dim=1)`` puts every member's chunk for
  rank ``r`` into row ``r``, so the scattered ``[N]`` of rank ``r`` holds every member's reduced chunk ``r``:
  member ``j``'s result is the slice ``[o_j : o_j + n_j]`` (a view).
* all_reduce: ``cat(x_j.flatten())``, reduced, then split into views.

Every element is reduced from the same operands as before and nothing is reordered within an element, so the
results are bit-identical whenever the backend reduces each element in a fixed rank order (gloo, NCCL's ring and
tree for a given size; with 2 ranks always, since IEEE addition is commutative).

The merged collective is placed where the bucket's last member was issued, its wait and copy-out where the first
member's wait was; :func:`commsched.rewrites.fxutil.stable_toposort` moves what must move (users that came before
the merged wait), honouring the IR's ordering edges for in-place ops.
"""

from __future__ import annotations

import math
import operator
from collections.abc import Sequence

import numpy as np
import torch
import torch.fx

from commsched.ir import Graph, GraphError
from commsched.rewrites.bucket_graph import name_prefix, new_names
from commsched.rewrites.bucket_plan import BUCKETABLE, Bucket, BucketConfig, BucketPlan, plan_buckets
from commsched.rewrites.fxutil import (
    RewriteResult,
    call,
    fake_mode_of,
    finish,
    ir_control_edges,
    nodes_by_name,
    order_positions,
    stable_toposort,
    wait_users,
)

aten = torch.ops.aten
c10d = torch.ops._c10d_functional


def _numel(node: torch.fx.Node) -> int:
    return math.prod(int(s) for s in node.meta["val"].shape)


def _flat_input(graph: torch.fx.Graph, mode, x: torch.fx.Node, shape: list[int], names, j: int) -> torch.fx.Node:
    if not x.meta["val"].is_contiguous():
        x = call(graph, mode, aten.clone.default, (x,), {"memory_format": torch.contiguous_format}, names["clone"][j])
    return call(graph, mode, aten.view.default, (x, shape), name=names["flat"][j])


def _merge(gm: torch.fx.GraphModule, mode, bucket: Bucket, members: list[torch.fx.Node], names):
    """Insert the merged collective of ``bucket`` (before the output node), its nodes named by ``names``
    (:func:`commsched.rewrites.bucket_graph.new_names`); returns (issue nodes, wait-side nodes, per-member
    result nodes)."""
    graph = gm.graph
    results: list[torch.fx.Node] = []
    with graph.inserting_before(graph.output_node()):
        issue, sizes = _issue_merged(graph, mode, bucket.kind, members, names)
        wait = call(graph, mode, c10d.wait_tensor.default, (issue[-1],), name=names["wait"])
        after = [wait]
        if bucket.kind == "all_gather":  # one row per rank: split every row, so each member gets all ranks' pieces
            world = members[0].args[1]
            rows = call(graph, mode, aten.view.default, (wait, [world, sum(sizes)]), name=names["rows"])
            parts = call(graph, mode, aten.split_with_sizes_copy.default, (rows, sizes, 1), name=names["parts"])
            after += [rows, parts]
        else:
            parts = call(graph, mode, aten.split_with_sizes.default, (wait, sizes), name=names["parts"])
            after.append(parts)
        for j, member in enumerate(members):
            piece = call(graph, mode, operator.getitem, (parts, j), name=names["piece"][j])
            shape = list(member.meta["val"].shape)
            results.append(call(graph, mode, aten.view.default, (piece, shape), name=names["out"][j]))
            after += [piece, results[-1]]
    return issue, after, results


def _issue_merged(graph: torch.fx.Graph, mode, kind: str, members: list[torch.fx.Node], names):
    """The nodes that issue one collective for ``members`` (flat inputs, their concatenation, the collective last)
    and each member's size in the merged result."""
    args = members[0].args
    inputs = [m.args[0] for m in members]
    if kind == "reduce_scatter":
        op, world, group = args[1], args[2], args[3]
        # each rank's chunk of every member side by side, so that rank r receives chunk r of each
        chunks = [_flat_input(graph, mode, x, [world, -1], names, j) for j, x in enumerate(inputs)]
        cat = call(graph, mode, aten.cat.default, (chunks, 1), name=names["cat"])
        flat = call(graph, mode, aten.view.default, (cat, [-1]), name=names["catflat"])
        coll = call(graph, mode, c10d.reduce_scatter_tensor.default, (flat, op, world, group), name=names["coll"])
        return [*chunks, cat, flat, coll], [_numel(x) // world for x in inputs]
    flats = [_flat_input(graph, mode, x, [-1], names, j) for j, x in enumerate(inputs)]
    cat = call(graph, mode, aten.cat.default, (flats,), name=names["cat"])
    if kind == "all_gather":  # (world, group)
        coll = call(graph, mode, c10d.all_gather_into_tensor.default, (cat, args[1], args[2]), name=names["coll"])
    else:  # (reduce op, group)
        coll = call(graph, mode, c10d.all_reduce.default, (cat, args[1], args[2]), name=names["coll"])
    return [*flats, cat, coll], [_numel(x) for x in inputs]


def apply_bucket_plan(
    gm: torch.fx.GraphModule,
    graph: Graph,
    plan: BucketPlan,
    order: Sequence[int] | np.ndarray | None = None,
    *,
    recompile: bool = True,
    copy: bool = True,
) -> RewriteResult:
    """Rewrite a copy of ``gm`` (``copy=False``: ``gm`` itself, for a module built to be rewritten) so that every
    bucket of ``plan`` with two or more members is one collective.

    ``graph`` is the IR imported from ``gm`` (node names match) that ``plan`` was made for; ``order`` (IR ids) is the
    order the plan assumed: the rewritten module follows it. ``recompile=False``: the copy is a lazy module
    (:func:`commsched.rewrites.fxutil.copy_graph_module`), its code generated when first used, not here. Raises
    GraphError if the plan does not fit ``gm``.
    """
    result = RewriteResult.on_copy(gm, "bucket_collectives", copy=copy, lazy=not recompile)
    out = result.gm
    merged = plan.merged
    if not merged:
        result.notes.append("no bucket has two or more members: nothing to rewrite")
        result.rows = plan.rows()
        result.counts = plan.closed_counts()
        return result
    mode = fake_mode_of(out)
    by_name = nodes_by_name(out)
    priority = order_positions(out, graph, order)
    remap: dict[str, torch.fx.Node] = {}
    removed: list[torch.fx.Node] = []
    prefix = name_prefix(list(by_name))
    for k, bucket in enumerate(merged):
        members = []
        for name in bucket.members:
            node = by_name.get(name)
            if node is None or node.op != "call_function" or BUCKETABLE.get(str(node.target)) != bucket.kind:
                raise GraphError(f"bucket {k}: member {name!r} is not a {bucket.kind} of this GraphModule")
            others = [u.name for u in node.users if u not in wait_users(node)]
            if others:
                raise GraphError(f"collective {name!r} is read by {others[0]!r} without a wait_tensor")
            members.append(node)
        issue, after, results = _merge(out, mode, bucket, members, new_names(prefix, k, len(members)))
        for node in issue:
            node.meta["bucket"] = k
        p_issue = max(priority[m] for m in members)
        waits = [w for m in members for w in wait_users(m)]
        p_wait = max(p_issue + 0.5, min(priority[w] for w in waits))
        for node in issue:
            priority[node] = p_issue
        for node in after:
            priority[node] = p_wait
        cat = next(n for n in issue if n.target is aten.cat.default)
        coll, wait = issue[-1], after[0]
        for m, res in zip(members, results, strict=True):
            for w in wait_users(m):
                w.replace_all_uses_with(res)
                remap[w.name] = wait
                removed.append(w)
            remap[m.name] = cat
            removed.append(m)
            result.replaced[m.name] = coll.name
        result.rows.append(
            {
                "bucket": k,
                "collective": coll.name,
                "wait": wait.name,
                "kind": bucket.kind,
                "group": bucket.group,
                "dtype": bucket.dtype,
                "members": list(bucket.members),
                "bytes": bucket.nbytes,
                "cap_bytes": bucket.cap_bytes,
                "closed_by": bucket.closed_by,
                "time_s": bucket.time_s,
                "members_time_s": bucket.members_time_s,
            }
        )
    edges = ir_control_edges(out, graph, remap)
    for node in removed:
        out.graph.erase_node(node)
    alive = set(out.graph.nodes)
    edges = [(a, b) for a, b in edges if a in alive and b in alive]
    stable_toposort(out.graph, priority, edges)
    result.counts = plan.closed_counts()
    result.notes.append(
        f"{len(merged)} buckets replace {sum(len(b.members) for b in merged)} collectives; "
        f"{plan.saved_s * 1e6:.1f} us of collective time saved on {plan.hardware} before overlap"
    )
    finish(out, recompile)
    return result


def bucket_collectives(
    gm: torch.fx.GraphModule,
    hardware,
    *,
    graph: Graph | None = None,
    order: Sequence[int] | np.ndarray | None = None,
    config: BucketConfig | None = None,
    costs=None,
    group_sizes: dict[str, int] | None = None,
) -> tuple[RewriteResult, BucketPlan]:
    """Plan buckets for ``gm`` on ``hardware`` and apply them: ``(result, plan)``.

    ``graph``: the IR of ``gm`` if already imported (else ``from_fx(gm, group_sizes=...)``; outside a (fake)
    process group pass ``group_sizes``). ``order``: the schedule to bucket for (default: the module's order);
    ``costs``: a CostEstimate of ``graph`` to plan with (default: estimated on ``hardware``).
    """
    from commsched.frontends.fx import from_fx

    g = graph if graph is not None else from_fx(gm, group_sizes=group_sizes)
    plan = plan_buckets(g, costs if costs is not None else hardware, order, hardware=hardware, config=config)
    return apply_bucket_plan(gm, g, plan, order), plan

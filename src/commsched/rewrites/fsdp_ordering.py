"""Enforce FSDP2's communication order on a traced step (what Inductor's ``enforce_comm_ordering_for_fsdp`` does
to its scheduler nodes), as an FX reorder plus ordering constraints for commsched's schedulers.

* all_gather: the copy-in block (allocation, casts, ``fsdp.all_gather_copy_in``, the all_gather) runs as one group,
  and the wait with the copy-out (``wait_tensor``, views, ``fsdp.split_with_sizes_copy``) as another; each
  all_gather's copy-in group starts only after the previous all_gather's wait group ended (one all_gather in flight
  ahead of its use, as FSDP2 prefetches).
* reduce_scatter: the copy-in (``fsdp.chunk_cat`` into the flat buffer) with the reduce_scatter is a group, its
  wait with the views of the gradient shards another; the same one-at-a-time rule.

The rewritten module runs the groups contiguously in that order; ``result.extra`` holds the groups (node names) and
the constraint edges, and :func:`ordering_constraints` turns them into IR id arrays (``PassContext.extra_src`` /
``extra_dst``) for a schedule of the rewritten graph.
"""

from __future__ import annotations

import operator

import numpy as np
import torch
import torch.fx

from commsched.ir import CollType, Graph, GraphError, OpKind
from commsched.rewrites.fxutil import (
    RewriteResult,
    copy_graph_module,
    finish,
    fsdp_op,
    ir_control_edges,
    nodes_by_name,
    stable_toposort,
)

c10d = torch.ops._c10d_functional
aten = torch.ops.aten
_CHEAP = (aten.view.default, aten.as_strided.default, aten._unsafe_view.default, aten.reshape.default, operator.getitem)


def _cheap_inputs(node: torch.fx.Node, after: int, pos: dict, into: set) -> None:
    """Add ``node``'s view / allocation inputs placed after position ``after`` (they must move with it)."""
    for a in node.all_input_nodes:
        if a in into or pos[a] <= after or a.op != "call_function":
            continue
        if a.target in _CHEAP or a.target is aten.empty.memory_format:
            into.add(a)
            _cheap_inputs(a, after, pos, into)


def enforce_fsdp_comm_ordering(gm: torch.fx.GraphModule, graph: Graph) -> RewriteResult:
    """Reorder a copy of ``gm`` (see the module docstring). ``graph`` is its IR (``from_fx(gm)``): its ordering
    edges find the reduce_scatter that reads a ``chunk_cat`` output and keep in-place ops ordered."""
    out = copy_graph_module(gm)
    result = RewriteResult(gm=out, name="enforce_fsdp_comm_ordering")
    copy_in, split_copy, chunk_cat = (fsdp_op(n) for n in ("all_gather_copy_in", "split_with_sizes_copy", "chunk_cat"))
    by_name = nodes_by_name(out)
    nodes = list(out.graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    ag_pairs: list[tuple[list[torch.fx.Node], list[torch.fx.Node]]] = []
    rs_pairs: list[tuple[list[torch.fx.Node], list[torch.fx.Node]]] = []
    for node in nodes:
        if node.op != "call_function":
            continue
        if node.target in (c10d.all_gather_into_tensor.default, c10d.all_gather_into_tensor_out.default):
            pairs, found = ag_pairs, _all_gather_groups(node, pos, copy_in, split_copy)
        elif node.target is chunk_cat:
            pairs, found = rs_pairs, _reduce_scatter_groups(node, graph, by_name, pos)
        else:
            continue
        if isinstance(found, str):
            result.count(found)
        else:
            pairs.append(found)

    priority: dict[torch.fx.Node, float] = {n: float(i) for i, n in enumerate(nodes)}
    edges: list[tuple[torch.fx.Node, torch.fx.Node]] = []
    groups: list[dict] = []
    for kind, pairs in (("all_gather", ag_pairs), ("reduce_scatter", rs_pairs)):
        prev_out: list[torch.fx.Node] | None = None
        for group_in, group_out in pairs:
            anchor_in = max(pos[n] for n in group_in if "c10d" in str(n.target) or n.target is chunk_cat)
            for k, n in enumerate(group_in):
                priority[n] = anchor_in + (k + 1) * 1e-4
            anchor_out = min(pos[n] for n in group_out if n.target is c10d.wait_tensor.default)
            for k, n in enumerate(group_out):
                priority[n] = anchor_out + (k + 1) * 1e-4
            if prev_out is not None:
                edges.append((prev_out[-1], group_in[0]))
            prev_out = group_out
            groups.append({"kind": kind, "issue": [n.name for n in group_in], "wait": [n.name for n in group_out]})
        result.count(f"{kind}_groups", len(pairs))
    ir_edges = ir_control_edges(out, graph)
    stable_toposort(out.graph, priority, edges + ir_edges)
    result.extra["groups"] = groups
    result.extra["edges"] = [(a.name, b.name) for a, b in edges]
    result.rows = [{"kind": g["kind"], "issue": len(g["issue"]), "wait": len(g["wait"]), "first": g["issue"][0],
                    "collective": next(x for x in g["issue"] if "reduce_scatter" in x or "all_gather_into" in x)}
                   for g in groups]  # fmt: skip
    finish(out)
    return result


Groups = tuple[list[torch.fx.Node], list[torch.fx.Node]]


def _all_gather_groups(node: torch.fx.Node, pos: dict, copy_in, split_copy) -> Groups | str:
    """(issue group, wait group) of an all_gather in position order, or why it has none."""
    before: set[torch.fx.Node] = set()
    stack = [node]
    while stack:  # the copy-in block: every computed ancestor
        for a in stack.pop().all_input_nodes:
            if a.op == "call_function" and a not in before:
                before.add(a)
                stack.append(a)
    if not any(a.target is copy_in for a in before):
        return "all_gather_without_copy_in"
    if any(a.target is c10d.wait_tensor.default or "c10d" in str(a.target) for a in before):
        return "copy_in_depends_on_communication"
    wait = _only_wait(node)
    if wait is None:
        return "all_gather_without_single_wait"

    def copy_out(u: torch.fx.Node) -> bool:  # views that lead to the copy-out, and the copy-out itself
        if u.target is split_copy:
            return True
        return u.target in _CHEAP and any(x.target is split_copy for x in _descendants(u))

    group_out = _users_closure(wait, copy_out)
    for m in list(group_out):
        _cheap_inputs(m, pos[wait], pos, group_out)
    return sorted(before | {node}, key=pos.get), sorted(group_out, key=pos.get)


def _reduce_scatter_groups(node: torch.fx.Node, graph: Graph, by_name: dict, pos: dict) -> Groups | str:
    """(issue group, wait group) of the reduce_scatter that reads ``chunk_cat`` ``node``, or why it has none."""
    i = graph.id_of(node.name)
    rs_ids = [s for s in graph.successors(i).tolist() if graph.coll_type[s] == CollType.REDUCE_SCATTER]
    if len(rs_ids) != 1:
        return "chunk_cat_without_reduce_scatter"
    rs = by_name[graph.names[rs_ids[0]]]
    group_in = {node, rs}
    _cheap_inputs(node, min(pos[a] for a in node.all_input_nodes) if node.all_input_nodes else 0, pos, group_in)
    _cheap_inputs(rs, pos[node], pos, group_in)
    wait = _only_wait(rs)
    if wait is None:
        return "reduce_scatter_without_single_wait"

    def view(u: torch.fx.Node) -> bool:
        return u.op == "call_function" and graph.kinds[graph.id_of(u.name)] == OpKind.VIEW

    return sorted(group_in, key=pos.get), sorted(_users_closure(wait, view), key=pos.get)


def _only_wait(coll: torch.fx.Node) -> torch.fx.Node | None:
    waits = [u for u in coll.users if u.target is c10d.wait_tensor.default]
    return waits[0] if len(waits) == 1 else None


def _users_closure(start: torch.fx.Node, keep) -> set[torch.fx.Node]:
    """``start`` and every node reachable from it through users that ``keep`` accepts."""
    found = {start}
    stack = [start]
    while stack:
        for u in stack.pop().users:
            if u not in found and keep(u):
                found.add(u)
                stack.append(u)
    return found


def _descendants(node: torch.fx.Node, limit: int = 8) -> list[torch.fx.Node]:
    out, frontier = [], [node]
    for _ in range(limit):
        frontier = [u for n in frontier for u in n.users]
        out += frontier
        if not frontier:
            break
    return out


def ordering_constraints(graph: Graph, result: RewriteResult) -> tuple[np.ndarray, np.ndarray]:
    """The rewrite's group-order edges as IR ids of ``graph`` (imported from ``result.gm``): ``(src, dst)`` int32
    arrays meaning src runs before dst, for ``PassContext.extra_src`` / ``extra_dst``."""
    if "edges" not in result.extra:
        raise GraphError("the RewriteResult has no ordering edges: run enforce_fsdp_comm_ordering first")
    src = [graph.id_of(a) for a, _ in result.extra["edges"]]
    dst = [graph.id_of(b) for _, b in result.extra["edges"]]
    return np.asarray(src, np.int32), np.asarray(dst, np.int32)

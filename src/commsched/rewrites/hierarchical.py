"""Hierarchical all_reduce for process groups whose ranks span nodes, as an FX rewrite (issue 18 c).

``all_reduce(x, op, group)`` on a group of ``g x nodes`` ranks (``g`` per node) becomes three functional collectives
on two sub-groups: ``reduce_scatter`` of the flattened ``x`` in the node (``group:intra``, ``g`` ranks at the
group's stride), ``all_reduce`` of the ``1/g`` shard across nodes (``group:inter``, one rank per node, at ``g``
times the stride) and ``all_gather`` in the node, then a view back to ``x``'s shape. Each phase is a collective of
its own, on its own group's FIFO stream, so the network phase of one all_reduce can run while the NVLink phases of
another do. As one operation it is never faster than the collective model's own choice, which already includes this
algorithm (``benchmarks/bench_hierarchical.py``); whether the pipelining pays is the simulator's call.

Sub-group names are ``"<group>:intra"`` and ``"<group>:inter"``; :func:`sub_groups` gives their sizes and strides
(for ``from_fx(group_sizes=...)``) and :func:`sub_group_blocks` their rank blocks (for ``run_spmd`` and real process
groups).
"""

from __future__ import annotations

from collections.abc import Sequence

import torch
import torch.fx

from commsched.ir import Graph, GraphError
from commsched.rewrites.decompose_tp import TRANSFORM_META
from commsched.rewrites.fxutil import (
    WAIT,
    RewriteResult,
    call,
    fake_mode_of,
    finish,
    is_op,
    nodes_by_name,
    wait_users,
)

aten = torch.ops.aten
c10d = torch.ops._c10d_functional
AR = c10d.all_reduce.default


def sub_groups(name: str, size: int, stride: int, per_node: int) -> dict[str, tuple[int, int]]:
    """``{sub-group name: (size, stride)}`` of group ``name`` (``size`` ranks at ``stride``, ``per_node`` of them
    on each node)."""
    if per_node < 2 or size % per_node or size == per_node:
        raise ValueError(f"group {name!r}: {size} ranks with {per_node} per node has no hierarchical split")
    return {f"{name}:intra": (per_node, stride), f"{name}:inter": (size // per_node, stride * per_node)}


def sub_group_blocks(blocks: Sequence[Sequence[int]], per_node: int, name: str) -> dict[str, list[list[int]]]:
    """Rank blocks of the sub-groups, from group ``name``'s blocks (each in rank order, ``per_node`` consecutive
    members on one node)."""
    intra, inter = [], []
    for b in blocks:
        b = list(b)
        intra += [b[i : i + per_node] for i in range(0, len(b), per_node)]
        inter += [b[i::per_node] for i in range(per_node)]
    return {f"{name}:intra": intra, f"{name}:inter": inter}


def find_hierarchical_sites(graph: Graph, hardware) -> list[tuple[str, str, int]]:
    """(all_reduce FX name, group name, ranks per node) of every functional all_reduce on a group that spans
    nodes with at least two of its ranks on each (placement: ``hardware.placement``)."""
    out = []
    for c in graph.collectives.tolist():
        grp = graph.groups[int(graph.coll_group[c])]
        if graph.targets[c] != "_c10d_functional.all_reduce.default":
            continue
        per_node, nodes = hardware.placement(grp.size, grp.stride)
        if per_node >= 2 and nodes >= 2:
            out.append((graph.names[c], grp.name, per_node))
    return out


def hierarchical_all_reduce(gm: torch.fx.GraphModule, sites: Sequence[tuple[str, str, int]]) -> RewriteResult:
    """Rewrite each all_reduce in ``sites`` ((FX name, group name, ranks per node), e.g. from
    :func:`find_hierarchical_sites`) on a copy of ``gm``. Raises GraphError naming a node that is not a functional
    all_reduce with one wait, or whose size ``per_node`` does not divide. O(N)."""
    result = RewriteResult.on_copy(gm, "hierarchical_all_reduce")
    out = result.gm
    mode = fake_mode_of(out) if sites else None
    by_name = nodes_by_name(out)
    for name, group, per_node in sites:
        node = by_name.get(name)
        waits = wait_users(node) if node is not None else []
        if node is None or not is_op(node, AR) or len(waits) != 1 or len(node.users) != 1:
            raise GraphError(f"node {name!r}: expected a functional all_reduce with one wait_tensor")
        x, op = node.args[0], node.args[1]
        val = x.meta["val"]
        if val.numel() % per_node:
            raise GraphError(f"all_reduce {name!r}: {val.numel()} elements do not split over {per_node} ranks")
        new = []
        with out.graph.inserting_before(node):
            src = x if val.is_contiguous() else call(out.graph, mode, aten.clone.default, (x,))
            flat = call(out.graph, mode, aten.view.default, (src, [val.numel()]))
            rs = call(out.graph, mode, c10d.reduce_scatter_tensor.default, (flat, op, per_node, f"{group}:intra"),
                      name=f"{name}_rs_intra")  # fmt: skip
            rs_w = call(out.graph, mode, WAIT, (rs,))
            ar = call(out.graph, mode, AR, (rs_w, op, f"{group}:inter"), name=f"{name}_ar_inter")
            ar_w = call(out.graph, mode, WAIT, (ar,))
            ag = call(out.graph, mode, c10d.all_gather_into_tensor.default, (ar_w, per_node, f"{group}:intra"),
                      name=f"{name}_ag_intra")  # fmt: skip
            new += [src, flat, rs, rs_w, ar, ar_w, ag]
        with out.graph.inserting_before(waits[0]):
            ag_w = call(out.graph, mode, WAIT, (ag,))
            shaped = call(out.graph, mode, aten.view.default, (ag_w, list(val.shape)))
            new += [ag_w, shaped]
        for n in new:
            if n is not x:
                n.meta[TRANSFORM_META] = "hierarchical_all_reduce"
        waits[0].replace_all_uses_with(shaped)
        out.graph.erase_node(waits[0])
        out.graph.erase_node(node)
        result.replaced[name] = shaped.name
        nbytes = val.numel() * val.element_size()
        result.rows.append({"collective": name, "group": group, "per_node": per_node, "bytes": nbytes})
        result.count("all_reduce")
    finish(out)
    return result

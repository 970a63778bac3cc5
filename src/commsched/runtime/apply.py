"""Apply a schedule (an order of node names, optionally streams) to the torch.fx GraphModule it was computed for.

The IR's node names are the FX node names (``commsched.frontends.fx``), so an order computed on the IR maps onto the
GraphModule by name. Reordering moves nodes in the FX linked list; it never adds, removes or rewrites a node.
An order planned on rank 0 maps onto every rank's graph the same way only if their names agree:
:func:`check_same_graph` checks that, on every rank together.
"""

from __future__ import annotations

import copy
import itertools
from collections.abc import Sequence
from typing import Any

import numpy as np
import torch
import torch.fx

from commsched.ir import GraphError

STREAM_META_KEY = "commsched_stream"  # node.meta key of a node's compute stream (multi-stream schedules)


def _names_and_streams(schedule: Any, streams: Sequence[int] | np.ndarray | None) -> tuple[list[str], list[int] | None]:
    """(node names in order, stream of each entry of that order or None) from a Schedule or a sequence of names."""
    if hasattr(schedule, "order") and hasattr(schedule, "graph"):  # commsched.passes.Schedule
        graph = schedule.graph
        order = np.asarray(schedule.order, np.int64)
        names = [graph.names[i] for i in order.tolist()]
        s = schedule.streams if streams is None else streams
        if s is not None:
            s = np.asarray(s)
            if len(s) != len(graph):
                raise ValueError(f"schedule.streams has {len(s)} entries; expected one per node ({len(graph)})")
            return names, [int(x) for x in s[order].tolist()]
        return names, None
    names = [str(x) for x in schedule]
    if streams is not None:
        streams = [int(x) for x in streams]
        if len(streams) != len(names):
            raise ValueError(f"streams has {len(streams)} entries; expected one per entry of the order ({len(names)})")
    return names, streams


def module_order(g: Any, order: Sequence[int] | np.ndarray) -> np.ndarray:
    """The IR ids of ``g`` in the order :func:`apply_schedule` leaves the module for the schedule ``order``: its
    placeholders first (in ``g``'s order: the signature), the output(s) last, the rest as ``order`` has them (see
    :func:`fx_order`). int32."""
    from commsched.ir import OpKind

    order = np.asarray(order, np.int64)
    is_placeholder = np.fromiter((t == "placeholder" for t in g.targets), bool, count=len(g))
    is_output = np.asarray(g.kinds) == OpKind.OUTPUT
    body = order[~is_placeholder[order] & ~is_output[order]]
    return np.concatenate([np.flatnonzero(is_placeholder), body, np.flatnonzero(is_output)]).astype(np.int32)


def fx_order(gm: torch.fx.GraphModule | torch.fx.Graph, names: Sequence[str]) -> list[torch.fx.Node]:
    """The FX nodes of ``gm`` in the order ``names`` gives, checked, without changing ``gm``.

    Placeholders come first (in their original order: they are the function's signature) and the output last.
    FX nodes the order does not name (e.g. ``get_attr`` constants, nodes an importer skipped) are placed right
    after the last of their inputs. Raises GraphError naming the node when a name is unknown or repeated, or when a
    node would run before one of its inputs.
    """
    graph = gm.graph if isinstance(gm, torch.fx.GraphModule) else gm
    by_name = {n.name: n for n in graph.nodes}
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    output = next((n for n in graph.nodes if n.op == "output"), None)
    body: list[torch.fx.Node] = []
    seen: set[str] = set()
    for name in names:
        node = by_name.get(name)
        if node is None:
            raise GraphError(f"the schedule names node {name!r}, which is not in the FX graph")
        if name in seen:
            raise GraphError(f"the schedule names node {name!r} twice")
        seen.add(name)
        if node.op not in ("placeholder", "output"):
            body.append(node)
    # nodes the order does not name: after their last input (or first, without inputs), in FX order among themselves
    placed = set(placeholders) | set(body)
    unnamed = [n for n in graph.nodes if n not in placed and n.op != "output"]
    if unnamed:
        position = {n: i for i, n in enumerate(body)}
        inserts: dict[int, list[torch.fx.Node]] = {}
        for n in unnamed:
            after = max((position.get(a, -1) for a in n.all_input_nodes), default=-1)
            position[n] = after  # an unnamed user of an unnamed node lands after it (same slot, FX order)
            inserts.setdefault(after, []).append(n)
        merged = list(inserts.get(-1, []))
        for i, n in enumerate(body):
            merged.append(n)
            merged.extend(inserts.get(i, []))
        body = merged
    new = placeholders + body + ([output] if output is not None else [])
    done: set[torch.fx.Node] = set()
    for n in new:
        for a in n.all_input_nodes:
            if a not in done:
                raise GraphError(
                    f"the schedule runs FX node {n.name!r} ({n.target}) before its input {a.name!r}; "
                    "expected a topological order"
                )
        done.add(n)
    return new


def apply_schedule(
    gm: torch.fx.GraphModule | torch.fx.Graph,
    schedule: Any,
    *,
    streams: Sequence[int] | np.ndarray | None = None,
) -> torch.fx.GraphModule | torch.fx.Graph:
    """Reorder ``gm``'s nodes in place to follow ``schedule``, lint and recompile it; return ``gm``. A bare
    ``torch.fx.Graph`` (e.g. Inductor's post-grad graph) is reordered and linted; its owner recompiles.

    ``schedule``: a :class:`commsched.passes.Schedule` computed on ``from_fx(gm)`` (or on a graph with the same node
    names), or a sequence of node names. ``streams`` (one per entry of the order; default: ``schedule.streams``):
    each node's compute stream goes to ``node.meta["commsched_stream"]`` (stream lowering is a separate pass); with
    no streams, an annotation left by an earlier call is removed. The check runs before anything moves, so on error
    ``gm`` is unchanged. O(N + E).
    """
    names, node_streams = _names_and_streams(schedule, streams)
    new = fx_order(gm, names)
    graph = gm.graph if isinstance(gm, torch.fx.GraphModule) else gm
    # Node.append moves a node right after another: chaining every node after its predecessor in the new order
    # leaves one contiguous chain, i.e. the whole list in the new order
    for prev, node in itertools.pairwise(new):
        if prev.next is not node:
            prev.append(node)
    if node_streams is not None:
        by_name = dict(zip(names, node_streams, strict=True))
        for node in new:
            if node.name in by_name:
                node.meta[STREAM_META_KEY] = by_name[node.name]
    else:
        for node in new:
            node.meta.pop(STREAM_META_KEY, None)
    graph.lint()
    if isinstance(gm, torch.fx.GraphModule):
        gm.recompile()
    return gm


def copy_graph_module(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """A new GraphModule over a copy of ``gm``'s graph (same node names, shallow-copied meta, shared submodules and
    attributes), so that one traced step can be reordered several ways."""
    new_graph = torch.fx.Graph()
    new_graph.set_codegen(copy.deepcopy(gm.graph._codegen))  # pytree in/out specs of dynamo graphs
    value_map: dict[torch.fx.Node, torch.fx.Node] = {}
    for old in gm.graph.nodes:
        new = value_map[old] = new_graph.node_copy(old, lambda a: value_map[a])
        if new.name != old.name:
            raise GraphError(f"copying the FX graph renamed node {old.name!r} to {new.name!r}")
    return torch.fx.GraphModule(gm, new_graph)


def check_same_graph(gm: torch.fx.GraphModule, what: str = "traced step") -> None:
    """Every rank's graph must have rank 0's node names and targets, in the same order (SPMD): the orders are by
    name. Call on every rank; raises on every rank whose graph differs, naming ``what`` it is."""
    import torch.distributed as dist

    mine = [(n.name, str(n.target)) for n in gm.graph.nodes]
    box = [mine if dist.get_rank() == 0 else None]
    dist.broadcast_object_list(box, src=0)
    ref = box[0]
    bad = torch.tensor([0 if mine == ref else 1])
    dist.all_reduce(bad, op=dist.ReduceOp.MAX)
    if bad.item():
        first = next(((a, b) for a, b in zip(mine, ref) if a != b), (f"{len(mine)} nodes", f"{len(ref)} nodes"))
        raise RuntimeError(
            f"rank {dist.get_rank()}'s {what} differs from rank 0's ({first[0]} vs {first[1]}): the schedule "
            "maps onto every rank by node name, so every rank must have the same graph"
        )

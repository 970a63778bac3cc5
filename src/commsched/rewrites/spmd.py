"""Run one traced GraphModule for every rank of a world in one process, with exact collective semantics.

Every rank runs the same graph (SPMD) on its own inputs; the ops run rank by rank and a collective combines the
ranks' values. Reductions add in rank order (``((x0 + x1) + x2) ...``), so two graphs that reduce the same operands
give bit-identical results here. This is how the rewrites are checked on small random inputs without a process
group; ``tests/rewrites/gloo_helpers.py`` checks them on real gloo ranks.

Semantics per op (``_c10d_functional`` and ``symm_mem``): all_gather concatenates along dim 0 in rank order;
reduce_scatter reduces then hands rank ``r`` chunk ``r`` of dim 0; all_reduce (and the one-shot symmetric-memory
all_reduce) reduces; all_to_all_single sends input chunk ``j`` to rank ``j``; broadcast copies the source's value;
``wait_tensor`` is the identity; in-place and ``_out`` variants write into their argument. The non-functional
``c10d`` ops that eager FSDP2 records (``_allgather_base_``, ``_reduce_scatter_base_``) write into their output.
"""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch
import torch.fx
from torch.utils._pytree import tree_map

_REDUCE: dict[str, Callable[[torch.Tensor, torch.Tensor], torch.Tensor]] = {
    "sum": torch.add,
    "avg": torch.add,
    "product": torch.mul,
    "max": torch.maximum,
    "min": torch.minimum,
}


def _reduce(values: Sequence[torch.Tensor], op: str) -> torch.Tensor:
    op = str(op).lower()
    if op not in _REDUCE:
        raise ValueError(f"reduce op {op!r} is not supported: expected one of {', '.join(_REDUCE)}")
    acc = values[0].clone()
    for v in values[1:]:
        acc = _REDUCE[op](acc, v)
    if op == "avg":
        acc = acc / len(values)
    return acc


def _reduce_op_name(op: Any) -> str:
    if isinstance(op, str):
        return op
    # a torchbind c10d ReduceOp recorded by make_fx: its value is the RedOpType
    name = str(getattr(op, "op", op)).rsplit(".", 1)[-1]
    return name.lower()


class _World:
    def __init__(self, world_size: int, groups: Mapping[str, Sequence[Sequence[int]]]):
        self.world_size = world_size
        self.groups = {k: [list(b) for b in v] for k, v in groups.items()}

    def blocks(self, name: Any, size: int | None = None) -> list[list[int]]:
        key = name if isinstance(name, str) else getattr(name, "group_name", str(name))
        blocks = self.groups.get(key, [list(range(self.world_size))])
        if size is not None and any(len(b) != size for b in blocks):
            raise ValueError(f"group {key!r} has blocks of {[len(b) for b in blocks]} ranks; the op says {size}")
        return blocks


def _schema(target: Any) -> str | None:
    s = getattr(target, "_schema", None)
    return s.name if s is not None else None


def _collective(world: _World, schema: str, args: list, kwargs: list) -> list | None:
    """Per-rank results of a collective, or None if ``schema`` is not one."""
    w = world.world_size
    out: list[Any] = [None] * w
    a0 = [a[0] for a in args]
    if schema in ("_c10d_functional::wait_tensor",):
        return list(a0)
    if schema in ("_c10d_functional::all_gather_into_tensor", "_c10d_functional::all_gather_into_tensor_out"):
        for block in world.blocks(args[0][2], args[0][1]):
            full = torch.cat([a0[r] for r in block])
            for r in block:
                res = kwargs[r].get("out")
                out[r] = res.copy_(full) if res is not None else full.clone()
        return out
    if schema in ("_c10d_functional::reduce_scatter_tensor", "_c10d_functional::reduce_scatter_tensor_out"):
        for block in world.blocks(args[0][3], args[0][2]):
            total = _reduce([a0[r] for r in block], args[0][1])
            chunks = total.chunk(len(block))
            for k, r in enumerate(block):
                res = kwargs[r].get("out")
                out[r] = res.copy_(chunks[k]) if res is not None else chunks[k].clone()
        return out
    if schema in ("_c10d_functional::all_reduce", "symm_mem::one_shot_all_reduce", "_c10d_functional::all_reduce_"):
        inplace = schema.endswith("_")
        for block in world.blocks(args[0][2]):
            total = _reduce([a0[r] for r in block], args[0][1])
            for r in block:
                out[r] = a0[r].copy_(total) if inplace else total.clone()
        return out
    if schema in ("_c10d_functional::all_reduce_coalesced", "_c10d_functional::all_reduce_coalesced_"):
        inplace = schema.endswith("_")
        for block in world.blocks(args[0][2]):
            for r in block:
                out[r] = []
            for t in range(len(a0[block[0]])):
                total = _reduce([a0[r][t] for r in block], args[0][1])
                for r in block:
                    out[r].append(a0[r][t].copy_(total) if inplace else total.clone())
        return out
    if schema == "_c10d_functional::all_gather_into_tensor_coalesced":
        for block in world.blocks(args[0][2], args[0][1]):
            for r in block:
                out[r] = [torch.cat([a0[q][t] for q in block]) for t in range(len(a0[r]))]
        return out
    if schema == "_c10d_functional::reduce_scatter_tensor_coalesced":
        for block in world.blocks(args[0][3], args[0][2]):
            for r in block:
                out[r] = []
            for t in range(len(a0[block[0]])):
                chunks = _reduce([a0[q][t] for q in block], args[0][1]).chunk(len(block))
                for k, r in enumerate(block):
                    out[r].append(chunks[k].clone())
        return out
    if schema == "_c10d_functional::all_to_all_single":
        for block in world.blocks(args[0][3]):
            pieces = {r: list(a0[r].split(list(args[r][2]))) for r in block}
            for k, r in enumerate(block):
                out[r] = torch.cat([pieces[q][k] for q in block])
        return out
    if schema in ("_c10d_functional::broadcast", "_c10d_functional::broadcast_"):
        inplace = schema.endswith("_")
        for block in world.blocks(args[0][2]):
            src = a0[block[int(args[0][1])]]
            for r in block:
                out[r] = a0[r].copy_(src) if inplace else src.clone()
        return out
    if schema == "c10d::_allgather_base_":
        for block in world.blocks(args[0][2]):
            full = torch.cat([args[r][1] for r in block])
            for r in block:
                out[r] = (a0[r].copy_(full), None)
        return out
    if schema == "c10d::_reduce_scatter_base_":
        for block in world.blocks(args[0][2]):
            chunks = _reduce([args[r][1] for r in block], _reduce_op_name(args[0][3])).chunk(len(block))
            for k, r in enumerate(block):
                out[r] = (a0[r].copy_(chunks[k]), None)
        return out
    return None


def run_spmd(
    gm: torch.fx.GraphModule,
    inputs: Sequence[Sequence[Any]],
    *,
    groups: Mapping[str, Sequence[Sequence[int]]] | None = None,
) -> list[list[Any]]:
    """Run ``gm`` once per rank (``inputs[r]`` are rank ``r``'s placeholders) and return each rank's flat outputs.

    ``groups`` maps a process-group name to its rank blocks (e.g. ``{"tp": [[0, 1], [2, 3]]}``); a group not listed
    spans every rank. Inputs are cloned first, so the caller's tensors are not mutated by in-place ops.
    """
    w = len(inputs)
    if w < 1:
        raise ValueError("run_spmd needs inputs for at least one rank")
    world = _World(w, groups or {})
    env: dict[torch.fx.Node, list[Any]] = {}
    placeholders = [n for n in gm.graph.nodes if n.op == "placeholder"]
    for r, rank_inputs in enumerate(inputs):
        if len(rank_inputs) != len(placeholders):
            raise ValueError(f"rank {r}: {len(rank_inputs)} inputs for {len(placeholders)} placeholders")
    clone = lambda v: v.detach().clone() if isinstance(v, torch.Tensor) else v  # noqa: E731
    for k, node in enumerate(placeholders):
        env[node] = [clone(inputs[r][k]) for r in range(w)]
    result: list[list[Any]] = []
    with torch.no_grad():
        for node in gm.graph.nodes:
            if node.op == "placeholder":
                continue
            if node.op == "get_attr":
                val = gm
                for part in node.target.split("."):
                    val = getattr(val, part)
                env[node] = [clone(val) for _ in range(w)]
                continue
            args = [tree_map(lambda a, r=r: env[a][r] if isinstance(a, torch.fx.Node) else a, node.args)
                    for r in range(w)]  # fmt: skip
            kwargs = [tree_map(lambda a, r=r: env[a][r] if isinstance(a, torch.fx.Node) else a, node.kwargs)
                      for r in range(w)]  # fmt: skip
            if node.op == "output":
                result = [list(torch.utils._pytree.tree_leaves(a[0])) for a in args]
                break
            if node.op != "call_function":
                raise ValueError(f"FX node {node.name!r}: op {node.op!r} is not supported (call_function only)")
            schema = _schema(node.target)
            vals = _collective(world, schema, args, kwargs) if schema else None
            if vals is None:
                vals = [node.target(*args[r], **kwargs[r]) for r in range(w)]
            env[node] = vals
    return result

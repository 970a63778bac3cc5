"""Turn the non-functional ``c10d`` collectives that eager code records (FSDP2's ``_allgather_base_`` and
``_reduce_scatter_base_``, which write into an output tensor and return it with a Work handle) into
``_c10d_functional`` collectives plus ``wait_tensor``, the form ``commsched.from_fx``, the scheduler and the other
rewrites read.

``out, work = _allgather_base_(out, inp, pg, async_op)`` becomes ``w = wait_tensor(all_gather_into_tensor(inp, n,
name))``; every read of the returned ``out`` reads ``w``. If the ``out`` tensor is also read through another node
after the collective, an ``out.copy_(w)`` keeps that read right. The same for ``_reduce_scatter_base_``.
"""

from __future__ import annotations

import operator
from typing import Any

import torch
import torch.fx

from commsched.ir import GraphError
from commsched.rewrites.fxutil import RewriteResult, call, copy_graph_module, fake_mode_of, finish

c10d = torch.ops._c10d_functional
aten = torch.ops.aten


def reduce_op_name(op: Any) -> str:
    """A reduce op as the functional collectives spell it: from a string, a ``ReduceOp``, or its torchbind box."""
    import torch.distributed as dist

    if isinstance(op, str):
        return op.lower()
    if isinstance(op, torch.ScriptObject) and op._has_method("op"):
        return dist.ReduceOp.RedOpType(op.op()).name.lower()
    if isinstance(op, dist.ReduceOp.RedOpType):
        return op.name.lower()
    if isinstance(op, dist.ReduceOp):
        return dist.ReduceOp.RedOpType(int(op)).name.lower() if hasattr(op, "__int__") else str(op).lower()
    raise GraphError(f"cannot read reduce op {op!r}")


def _group(gm: torch.fx.GraphModule, node: torch.fx.Node, pg_arg: Any, groups: dict[str, dict]) -> tuple[str, int]:
    if not isinstance(pg_arg, torch.fx.Node) or pg_arg.op != "get_attr":
        raise GraphError(f"FX node {node.name!r}: process group argument is not a get_attr constant")
    info = groups.get(pg_arg.target)
    if info is None:
        try:
            from torch.distributed.distributed_c10d import ProcessGroup

            pg = ProcessGroup.unbox(getattr(gm, pg_arg.target))
            info = {"name": pg.group_name, "size": pg.size()}
        except Exception as exc:  # the group no longer exists in this process
            raise GraphError(
                f"FX node {node.name!r}: cannot resolve process group {pg_arg.target!r} ({exc}); trace with "
                "commsched.rewrites.fsdp_trace.trace_fsdp2_step (it records group names) or pass groups="
            ) from None
    return str(info["name"]), int(info["size"])


def functionalize_c10d(gm: torch.fx.GraphModule, groups: dict[str, dict] | None = None) -> RewriteResult:
    """Rewrite a copy of ``gm`` (see the module docstring). ``groups``: torchbind attribute -> {"name", "size"}
    (default: ``gm.meta["fsdp2_groups"]``, else resolved from live process groups)."""
    out = copy_graph_module(gm)
    result = RewriteResult(gm=out, name="functionalize_c10d")
    groups = dict(groups or gm.meta.get("fsdp2_groups", {}))
    mode = None
    graph = out.graph
    position = {n: i for i, n in enumerate(graph.nodes)}
    for node in list(graph.nodes):
        if node.op != "call_function":
            continue
        if node.target is torch.ops.c10d._allgather_base_.default:
            dest, src, pg = node.args[0], node.args[1], node.args[2]
            name, size = _group(out, node, pg, groups)
            make = (c10d.all_gather_into_tensor.default, (src, size, name))
        elif node.target is torch.ops.c10d._reduce_scatter_base_.default:
            dest, src, pg, op = node.args[0], node.args[1], node.args[2], node.args[3]
            name, size = _group(out, node, pg, groups)
            make = (c10d.reduce_scatter_tensor.default, (src, reduce_op_name(_constant(out, op)), size, name))
        else:
            continue
        mode = mode or fake_mode_of(out)
        with graph.inserting_before(node):
            coll = call(graph, mode, *make)
            wait = call(graph, mode, c10d.wait_tensor.default, (coll,))
        later_reads = [u for u in dest.users if u is not node and position.get(u, -1) > position[node]]
        if later_reads:
            with graph.inserting_after(wait):
                call(graph, mode, aten.copy_.default, (dest, wait))
            result.count("copy_back")
        for user in list(node.users):
            if user.target is operator.getitem and user.args[1] == 0:
                user.replace_all_uses_with(wait)
                graph.erase_node(user)
            elif user.target is operator.getitem and not user.users:
                graph.erase_node(user)  # the Work handle
            else:
                raise GraphError(f"FX node {user.name!r} reads {node.name!r} in a way this rewrite does not know")
        graph.erase_node(node)
        result.replaced[node.name] = coll.name
        result.rows.append({"collective": node.name, "new": coll.name, "wait": wait.name, "group": name, "size": size})
        result.count(str(node.target).split(".")[1])
    for node in list(graph.nodes):  # the process-group and reduce-op constants nobody reads any more
        if node.op == "get_attr" and not node.users and isinstance(getattr(out, node.target, None), torch.ScriptObject):
            graph.erase_node(node)
    finish(out)
    return result


def _constant(gm: torch.fx.GraphModule, arg: Any) -> Any:
    if isinstance(arg, torch.fx.Node) and arg.op == "get_attr":
        return getattr(gm, arg.target)
    return arg

"""Make compute read FSDP2's unsharded parameters from the graph values that fill them, not from graph inputs.

FSDP2 keeps each unsharded parameter as one tensor whose storage it refills before every use and frees after it.
A traced graph therefore reads the parameter as an input (a placeholder or ``get_attr`` constant) with no data
edge to the all_gather that filled it, so a scheduler could move the all_gather after its consumer. Two patterns:

* ``torch.compile`` (what Inductor's ``remove_fsdp2_unsharded_param_graph_input_usage`` handles):
  ``resize_storage_bytes_(P, full)``, ``fsdp.copy_(P, Y)``, uses of ``P``, ``resize_storage_bytes_(P, 0)``,
  possibly repeated. Uses of ``P`` after each ``fsdp.copy_(P, Y)`` and before the next one read ``Y``; the copies
  and resizes go. A parameter whose resizes do not pair up (equal counts, each full before its zero) is left alone.
* eager FSDP2 traced by :func:`commsched.rewrites.fsdp_trace.trace_fsdp2_step`: each ``fsdp.split_with_sizes_copy``
  writes the parameters listed in ``gm.meta["fsdp2_copy_outs"]``; uses of ``P`` after a copy-out (and before the
  next copy-out of ``P``) read an ``as_strided`` view of the buffer it wrote, as FSDP2 builds the parameter.

Any other op that writes ``P`` is an error: the rewrite would change what it reads.
"""

from __future__ import annotations

from collections import defaultdict

import torch
import torch.fx

from commsched.ir import GraphError
from commsched.rewrites.fxutil import RewriteResult, call, copy_graph_module, fake_mode_of, finish, fsdp_op

aten = torch.ops.aten


def _resize_op():
    try:
        return torch.ops.inductor.resize_storage_bytes_.default
    except (AttributeError, RuntimeError):
        return None


def _writes(node: torch.fx.Node, target: torch.fx.Node) -> bool:
    schema = getattr(node.target, "_schema", None)
    if schema is None:
        return False
    for k, arg in enumerate(schema.arguments):
        if arg.alias_info is None or not arg.alias_info.is_write:
            continue
        value = node.args[k] if k < len(node.args) else node.kwargs.get(arg.name)
        flat = value if isinstance(value, (list, tuple)) else [value]
        if any(v is target for v in flat):
            return True
    return False


def remove_unsharded_param_usage(gm: torch.fx.GraphModule) -> RewriteResult:
    """Rewrite a copy of ``gm`` (see the module docstring); rows list every replaced parameter use."""
    out = copy_graph_module(gm)
    result = RewriteResult(gm=out, name="remove_unsharded_param_usage")
    copy_ = fsdp_op("copy_")
    resize = _resize_op()
    nodes = list(out.graph.nodes)
    pos = {n: i for i, n in enumerate(nodes)}
    _compile_pattern(out, nodes, pos, copy_, resize, result)
    if out.meta.get("fsdp2_copy_outs"):
        _eager_pattern(out, nodes, pos, result)
    for n in list(out.graph.nodes):
        if n.op == "get_attr" and not n.users and n.name in result.replaced:
            out.graph.erase_node(n)
    finish(out)
    return result


def _compile_pattern(gm, nodes, pos, copy_, resize, result: RewriteResult) -> None:
    copies: dict[torch.fx.Node, list[torch.fx.Node]] = defaultdict(list)
    resizes: dict[torch.fx.Node, list[tuple[torch.fx.Node, bool]]] = defaultdict(list)
    for n in nodes:
        if n.op != "call_function":
            continue
        if n.target is copy_:
            if n.args[0].op not in ("placeholder", "get_attr"):
                raise GraphError(f"fsdp.copy_ node {n.name!r} writes {n.args[0].name!r}, expected a graph input")
            copies[n.args[0]].append(n)
        elif resize is not None and n.target is resize:
            resizes[n.args[0]].append((n, int(n.args[1]) > 0))
    for param, cps in copies.items():
        seq = resizes.get(param, [])
        fulls = [pos[r] for r, full in seq if full]
        zeros = [pos[r] for r, full in seq if not full]
        if len(fulls) != len(zeros) or any(f >= z for f, z in zip(fulls, zeros, strict=True)):
            result.count("resize_pattern_mismatch")
            result.notes.append(f"{param.name}: resize_storage_bytes_ calls do not pair up; left as is")
            continue
        bounds = [pos[c] for c in cps] + [len(nodes) - 1]
        for k, cp in enumerate(cps):
            replacement = cp.args[1]
            for user in list(param.users):
                if user is cp or user.op == "output" or (resize is not None and user.target is resize):
                    continue
                if not bounds[k] < pos[user] < bounds[k + 1]:
                    continue
                if _writes(user, param):
                    raise GraphError(f"FX node {user.name!r} writes FSDP2 unsharded parameter {param.name!r}")
                user.replace_input_with(param, replacement)
                result.rows.append({"param": param.name, "use": user.name, "reads": replacement.name})
                result.count("uses_replaced")
        for cp in cps:
            gm.graph.erase_node(cp)
        for r, _ in seq:
            gm.graph.erase_node(r)
        result.replaced[param.name] = None
        result.count("params")


def _eager_pattern(gm, nodes, pos, result: RewriteResult) -> None:
    split_copy = fsdp_op("split_with_sizes_copy")
    copy_outs = [n for n in nodes if n.op == "call_function" and n.target is split_copy]
    records = gm.meta["fsdp2_copy_outs"]
    if len(copy_outs) != len(records):
        raise GraphError(
            f"gm.meta['fsdp2_copy_outs'] lists {len(records)} copy-outs but the graph has {len(copy_outs)} "
            "fsdp.split_with_sizes_copy nodes: trace with commsched.rewrites.fsdp_trace.trace_fsdp2_step"
        )
    # per parameter attribute: (copy-out position, buffer node) in graph order
    fills: dict[str, list[tuple[int, torch.fx.Node, torch.fx.Node]]] = defaultdict(list)
    for cp, attrs in zip(copy_outs, records, strict=True):
        outs = cp.kwargs.get("out", cp.args[3] if len(cp.args) > 3 else None)
        if outs is None or len(outs) != len(attrs):
            raise GraphError(f"FX node {cp.name!r}: expected {len(attrs)} out= tensors")
        for attr, view in zip(attrs, outs, strict=True):
            if attr is None:
                continue
            base = view.args[0] if view.target is aten.view.default else view
            fills[attr].append((pos[cp], cp, base))
    mode = fake_mode_of(gm)
    views: dict[tuple[str, int], torch.fx.Node] = {}
    for getter in [n for n in nodes if n.op == "get_attr" and n.target in fills]:
        val = getter.meta["val"]
        for user in list(getter.users):
            if _writes(user, getter):
                raise GraphError(f"FX node {user.name!r} writes FSDP2 unsharded parameter {getter.target!r}")
            before = [f for f in fills[getter.target] if f[0] < pos[user]]
            if not before:
                result.count("use_before_first_copy_out")
                continue
            p, cp, base = before[-1]
            key = (getter.target, p)
            if key not in views:
                with gm.graph.inserting_after(cp):
                    views[key] = call(
                        gm.graph, mode, aten.as_strided.default, (base, list(val.shape), list(val.stride()), 0)
                    )
            user.replace_input_with(getter, views[key])
            result.rows.append(
                {"param": getter.target, "use": user.name, "reads": views[key].name, "copy_out": cp.name}
            )
            result.count("uses_replaced")
        result.replaced[getter.name] = None
    result.count("params", len(fills))

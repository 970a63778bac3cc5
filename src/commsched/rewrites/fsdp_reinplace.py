"""Reinplace FSDP2's all_gather: gather straight into the buffer the copy-in already allocated.

``fsdp.all_gather_copy_in`` returns ``(input, output)``: the flat all-gather output buffer with this rank's shards
already copied into its slot, and ``input``, a view of that slot. A functional ``all_gather_into_tensor(input)``
allocates a second output buffer; ``all_gather_into_tensor_out(input, ..., out=output)`` fills the first one in
place (the input is the output's own slot, which every backend handles). One buffer of the gathered size less per
all_gather, same values.
"""

from __future__ import annotations

import operator

import torch
import torch.fx

from commsched.rewrites.fxutil import RewriteResult, call, copy_graph_module, fake_mode_of, finish, fsdp_op

c10d = torch.ops._c10d_functional


def _numel_bytes(node: torch.fx.Node) -> int:
    v = node.meta["val"]
    return v.numel() * v.element_size()


def reinplace_fsdp_all_gather(gm: torch.fx.GraphModule) -> RewriteResult:
    """Rewrite a copy of ``gm``: every ``all_gather_into_tensor(getitem(fsdp.all_gather_copy_in(...), 0), n, g)``
    becomes ``all_gather_into_tensor_out(..., out=getitem(copy_in, 1))``; unused ``getitem(copy_in, 1)`` go."""
    out = copy_graph_module(gm)
    result = RewriteResult(gm=out, name="reinplace_fsdp_all_gather")
    copy_in = fsdp_op("all_gather_copy_in")
    graph = out.graph
    pos = {n: i for i, n in enumerate(graph.nodes)}
    mode = None
    for node in list(graph.nodes):
        if node.op != "call_function" or node.target is not c10d.all_gather_into_tensor.default:
            continue
        src = node.args[0]
        if not (src.target is operator.getitem and src.args[1] == 0 and src.args[0].target is copy_in):
            result.count("not_fsdp_copy_in")
            continue
        owner = src.args[0]
        buffer = next((u for u in owner.users if u.target is operator.getitem and u.args[1] == 1), None)
        mode = mode or fake_mode_of(out)
        if buffer is None:
            with graph.inserting_after(src):
                buffer = call(graph, mode, operator.getitem, (owner, 1))
        elif pos[buffer] > pos[node]:
            node.prepend(buffer)  # the output buffer must exist before the collective writes it
        with graph.inserting_before(node):
            new = call(
                graph, mode, c10d.all_gather_into_tensor_out.default, (src, node.args[1], node.args[2]), {"out": buffer}
            )
        node.replace_all_uses_with(new)
        graph.erase_node(node)
        result.replaced[node.name] = new.name
        result.rows.append(
            {"collective": node.name, "new": new.name, "out": buffer.name, "bytes_saved": _numel_bytes(buffer)}
        )
        result.count("reinplaced")
    for node in list(graph.nodes):
        if (
            node.target is operator.getitem
            and not node.users
            and isinstance(node.args[0], torch.fx.Node)
            and node.args[0].target is copy_in
            and node.args[1] == 1
        ):
            graph.erase_node(node)
            result.count("unused_getitem_removed")
    finish(out)
    return result

"""Lower each functional all_reduce the way Inductor's comm lowering does, as an FX rewrite.

* A small sum all_reduce (at most ``threshold_bytes``, default Inductor's 128 KiB) on a group that can run the
  one-shot symmetric-memory all_reduce, where the cost model says it is faster than NCCL
  (:func:`commsched.cost.symm_mem.choose_all_reduce_lowering`), becomes ``torch.ops.symm_mem.one_shot_all_reduce``
  when that op exists in this torch. It blocks its stream and returns the reduced tensor, so its ``wait_tensor``
  nodes are dropped.
* Every other all_reduce becomes ``clone`` + in-place ``all_reduce_`` (its waits now wait on the in-place op). The
  clone is skipped ("reinplaced") when nothing reads the input's storage after the all_reduce and the storage is not
  a graph input, which saves one buffer of the collective's size.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
import torch.fx

from commsched.cost.collectives import plan_collective
from commsched.cost.symm_mem import ONE_SHOT_THRESHOLD_BYTES, choose_all_reduce_lowering, one_shot_all_reduce_time_s
from commsched.ir import Graph, OpKind
from commsched.rewrites.bucket_plan import resolve_hardware
from commsched.rewrites.fxutil import RewriteResult, call, copy_graph_module, fake_mode_of, finish, wait_users

aten = torch.ops.aten
c10d = torch.ops._c10d_functional


def one_shot_op() -> Any:
    """``torch.ops.symm_mem.one_shot_all_reduce.default``, or None when this torch build has no such op."""
    try:
        return torch.ops.symm_mem.one_shot_all_reduce.default
    except (AttributeError, RuntimeError):
        return None


def _reinplace_safe(g: Graph, node: int, inp: int) -> bool:
    """May the all_reduce at IR ``node`` write into its input ``inp``'s storage? Only if the storage is not a graph
    input's, no node after ``node`` uses it, and no earlier collective still reads it (its wait comes later)."""
    lo, hi = int(g.buf_ptr[inp]), int(g.buf_ptr[inp + 1])
    if hi - lo != 1:
        return False
    s = int(g.buf_storage[lo])
    owner = int(g.storage_owner[s])
    if owner < 0 or g.kinds[owner] == OpKind.INPUT:
        return False
    ptr, idx = g.storage_users
    users = idx[ptr[s] : ptr[s + 1]]
    if np.any(users > node):
        return False
    in_flight = [u for u in users.tolist() if g.coll_type[u] >= 0 and u != node]
    return not any(int(w) > node for u in in_flight for w in g.waits_of(u))


def lower_all_reduces(
    gm: torch.fx.GraphModule,
    hardware: Any,
    *,
    graph: Graph | None = None,
    threshold_bytes: int = ONE_SHOT_THRESHOLD_BYTES,
    one_shot: bool = True,
    reinplace: bool = True,
    group_sizes: dict[str, int] | None = None,
) -> RewriteResult:
    """Rewrite every functional ``all_reduce`` of a copy of ``gm`` (see the module docstring). ``graph``: the IR of
    ``gm`` (default: ``from_fx(gm, group_sizes=...)``). Rows say, per all_reduce, what it became and why."""
    from commsched.frontends.fx import from_fx

    hw = resolve_hardware(hardware)
    g = graph if graph is not None else from_fx(gm, group_sizes=group_sizes)
    out = copy_graph_module(gm)
    result = RewriteResult(gm=out, name="lower_all_reduces")
    targets = [n for n in out.graph.nodes if n.op == "call_function" and n.target is c10d.all_reduce.default]
    if not targets:
        result.notes.append("no functional all_reduce in the graph")
        return result
    mode = fake_mode_of(out)
    op_one_shot = one_shot_op() if one_shot else None
    if one_shot and op_one_shot is None:
        result.notes.append("torch.ops.symm_mem.one_shot_all_reduce does not exist in this torch: NCCL lowering only")
    for node in targets:
        i = g.id_of(node.name)
        grp = g.groups[int(g.coll_group[i])]
        inp, rop, group = node.args[0], node.args[1], node.args[2]
        nbytes = int(g.comm_bytes[i])
        choice = "nccl"
        if op_one_shot is not None:
            choice = choose_all_reduce_lowering(
                nbytes, grp.size, hw, reduce_op=str(rop), stride=grp.stride, threshold_bytes=threshold_bytes
            )
        nccl_s = plan_collective("all_reduce", nbytes, grp.size, hw, stride=grp.stride).time_s
        row = {"collective": node.name, "group": grp.name, "bytes": nbytes, "reduce_op": str(rop), "nccl_s": nccl_s}
        waits = wait_users(node)
        if choice == "one_shot":
            with out.graph.inserting_before(node):
                new = call(out.graph, mode, op_one_shot, (inp, rop, group))
            for w in waits:
                w.replace_all_uses_with(new)
                out.graph.erase_node(w)
                result.replaced[w.name] = None
            one_s = one_shot_all_reduce_time_s(nbytes, grp.size, hw, stride=grp.stride)
            row.update(lowering="one_shot", one_shot_s=one_s, waits_dropped=len(waits))
        else:
            inputs = g.inputs(i)
            safe = reinplace and len(inputs) == 1 and _reinplace_safe(g, i, int(inputs[0]))
            with out.graph.inserting_before(node):
                buf = inp if safe else call(out.graph, mode, aten.clone.default, (inp,))
                new = call(out.graph, mode, c10d.all_reduce_.default, (buf, rop, group))
            row.update(lowering="all_reduce_", clone=not safe, clone_bytes_saved=nbytes if safe else 0)
        node.replace_all_uses_with(new)
        out.graph.erase_node(node)
        result.replaced[node.name] = new.name
        row["new"] = new.name
        result.rows.append(row)
        result.count(
            row["lowering"] if row["lowering"] == "one_shot" else ("reinplaced" if not row["clone"] else "clone")
        )
    finish(out)
    return result

"""Trace a training step of a module sharded with torch FSDP2 (``torch.distributed.fsdp.fully_shard``) on CPU.

``make_fx`` records FSDP2's own ops (``torch.ops.fsdp.all_gather_copy_in``, ``split_with_sizes_copy``,
``chunk_cat``) and its collectives as the non-functional ``c10d`` ops it calls (``_allgather_base_``,
``_reduce_scatter_base_``, with the process group as a torchbind object). Two things the trace loses are put back:

* which unsharded parameter each copy-out fills: compute reads an unsharded parameter as a constant (``get_attr``)
  whose storage FSDP2 refills by ``split_with_sizes_copy`` before every use; the tracer records, for every
  copy-out in trace order, which parameter attributes its outputs back (``gm.meta["fsdp2_copy_outs"]``), for
  :func:`commsched.rewrites.fsdp_unsharded_params.remove_unsharded_param_usage`;
* the collectives' group names and sizes (``gm.meta["fsdp2_groups"]``), for
  :func:`commsched.rewrites.c10d_functionalize.functionalize_c10d`.

:func:`trace_fsdp2` is the public entry point (``commsched.trace_fsdp2``): the trace, then the FSDP2 graph passes
(:func:`fsdp2_passes`), which make it a program ``from_fx``, ``optimize`` and ``apply_schedule`` take.
"""

from __future__ import annotations

import contextlib
import itertools
from collections.abc import Callable, Iterator, Sequence
from typing import Any

import torch
import torch.fx
import torch.nn as nn

from commsched.rewrites.fxutil import fill_none_vals


@contextlib.contextmanager
def _record_copy_outs(calls: list[list[Any]]) -> Iterator[None]:
    from torch.distributed.fsdp._fully_shard import _fsdp_param_group as pg_mod

    original = pg_mod.foreach_all_gather_copy_out

    def recording(result, fsdp_params, group):
        calls.append(list(fsdp_params))
        return original(result, fsdp_params, group)

    pg_mod.foreach_all_gather_copy_out = recording
    try:
        yield
    finally:
        pg_mod.foreach_all_gather_copy_out = original


def trace_fsdp2_step(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    example: torch.Tensor,
) -> torch.fx.GraphModule:
    """make_fx of one step: ``loss = loss_fn(model, example)``, ``loss.backward()``, returning ``[loss, *grads]``
    (the local gradient shards). ``model`` must already be wrapped with ``fully_shard`` under an initialised process
    group (the fake backend works at any world size). The graph's meta records the FSDP2 facts listed above."""
    import torch.distributed as dist

    if not dist.is_initialized() or dist.get_world_size() < 2:
        raise ValueError(
            "trace_fsdp2_step needs an initialised process group of >= 2 ranks: at world size 1 FSDP2 copies "
            "parameters without an all_gather, so there is nothing to trace (use commsched.fake_process_group(2))"
        )
    params = [p for p in model.parameters()]

    def step(x: torch.Tensor) -> list[torch.Tensor]:
        loss = loss_fn(model, x)
        loss.backward()
        return [loss, *[_local(p.grad) for p in params]]

    calls: list[list[Any]] = []
    from torch.fx.experimental.proxy_tensor import make_fx

    with _record_copy_outs(calls):
        gm = make_fx(step)(example)
    for p in params:
        p.grad = None
    _drop_profiler_markers(gm)
    # make_fx on real tensors gives every value its own FakeTensorMode; one mode for all lets rewrites compute
    # the values of the nodes they add (and the IR see aliasing)
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.passes.fake_tensor_prop import FakeTensorProp

    mode = FakeTensorMode(allow_non_fake_inputs=True)
    FakeTensorProp(gm, mode).propagate(mode.from_tensor(example))
    fill_none_vals(gm)
    # attribute name of each constant the graph reads, by object identity
    attr_of = {id(getattr(gm, n.target)): n.target for n in gm.graph.nodes if n.op == "get_attr"}
    gm.meta["fsdp2_copy_outs"] = [
        [attr_of.get(id(getattr(fp, "_unsharded_param", None))) for fp in fsdp_params] for fsdp_params in calls
    ]
    gm.meta["fsdp2_groups"] = _groups(gm)
    return gm


def fsdp2_passes(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """The FSDP2 graph passes, in order, on a step traced by :func:`trace_fsdp2_step`: its c10d collectives made
    functional (``functionalize_c10d``), compute relinked to the all_gathers that fill its unsharded parameters
    (``remove_unsharded_param_usage``), each all_gather written into its copy-in buffer
    (``reinplace_fsdp_all_gather``), FSDP2's communication order enforced (``enforce_fsdp_comm_ordering``). The
    process groups come from ``gm.meta["fsdp2_groups"]``, so this works after the process group is gone."""
    from commsched.frontends.fx import from_fx
    from commsched.rewrites.c10d_functionalize import functionalize_c10d
    from commsched.rewrites.fsdp_ordering import enforce_fsdp_comm_ordering
    from commsched.rewrites.fsdp_reinplace import reinplace_fsdp_all_gather
    from commsched.rewrites.fsdp_unsharded_params import remove_unsharded_param_usage

    sizes = {g["name"]: int(g["size"]) for g in gm.meta.get("fsdp2_groups", {}).values()}
    out = reinplace_fsdp_all_gather(remove_unsharded_param_usage(functionalize_c10d(gm).gm).gm).gm
    return enforce_fsdp_comm_ordering(out, from_fx(out, group_sizes=sizes or None)).gm


def trace_fsdp2(
    model: nn.Module,
    loss_fn: Callable[[nn.Module, torch.Tensor], torch.Tensor],
    example: torch.Tensor,
) -> torch.fx.GraphModule:
    """One training step of ``model``, sharded with torch FSDP2 (``fully_shard``) under an initialised process group
    of >= 2 ranks (``commsched.fake_process_group`` works at any world size), as a program commsched takes:
    ``loss = loss_fn(model, example)``, ``loss.backward()``, returning ``[loss, *local gradient shards]``, traced
    (:func:`trace_fsdp2_step`) and rewritten by :func:`fsdp2_passes`. Import it with ``from_fx`` while the process
    group exists; give it to ``optimize`` or ``apply_schedule`` as it is. ``make_fx`` of such a step alone gives
    FSDP2's own ops, c10d's in-place collectives and parameters as constants, which ``from_fx`` refuses."""
    return fsdp2_passes(trace_fsdp2_step(model, loss_fn, example))


def _drop_profiler_markers(gm: torch.fx.GraphModule) -> None:
    """FSDP2's ``record_function`` ranges are recorded as profiler ops; they carry no data and no tensor value."""
    prof = torch.ops.profiler
    markers = (prof._record_function_enter_new.default, prof._record_function_exit._RecordFunction)
    for n in reversed(list(gm.graph.nodes)):
        if n.op == "call_function" and n.target in markers and not n.users:
            gm.graph.erase_node(n)
    gm.recompile()


def _local(t: torch.Tensor | None) -> torch.Tensor | None:
    if t is None:
        return None
    return t.to_local() if hasattr(t, "to_local") else t


def _groups(gm: torch.fx.GraphModule) -> dict[str, dict[str, Any]]:
    """torchbind process-group attribute -> {"name", "size"} (resolved while the process group exists)."""
    from torch.distributed.distributed_c10d import ProcessGroup

    out: dict[str, dict[str, Any]] = {}
    for n in gm.graph.nodes:
        if n.op != "get_attr":
            continue
        obj = getattr(gm, n.target)
        if isinstance(obj, torch.ScriptObject) and "ProcessGroup" in str(obj._type()):
            pg = ProcessGroup.unbox(obj)
            out[n.target] = {"name": pg.group_name, "size": pg.size()}
    return out


def tiny_mlp(dims: Sequence[int] = (16, 24, 10, 16), *, seed: int = 0) -> nn.Module:
    """A small MLP (Linear + GELU blocks, odd widths so FSDP2 pads some shards) for tracing tests."""
    torch.manual_seed(seed)
    layers: list[nn.Module] = []
    for a, b in itertools.pairwise(dims):
        layers += [nn.Linear(a, b), nn.GELU()]
    return nn.Sequential(*layers[:-1])


def shard_mlp(model: nn.Module, mesh, *, mixed_precision: bool = False) -> nn.Module:
    """``fully_shard`` every Linear and then the root (torchtitan's layout), optionally bf16 params / fp32 grads."""
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    kw: dict[str, Any] = {"mesh": mesh}
    if mixed_precision:
        kw["mp_policy"] = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
    for m in model.modules():
        if isinstance(m, nn.Linear):
            fully_shard(m, **kw)
    fully_shard(model, **kw)
    return model

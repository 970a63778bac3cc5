"""What a pipeline rank runs once per step around its micro-batches: the gradient sync and the optimizer step.

torch's pipelining runs FSDP / DDP without a per-micro-batch sync (``backward_maybe_with_nosync``,
``perform_reduce_grad``, torch 2.13), so a stage's gradient collectives run once, after its last backward
(REDUCE_GRAD), and FSDP's all_gather once, before its first forward (UNSHARD). :func:`sync_seconds` times them with
the collective model, per parameter group as the zoo's sources issue them (``commsched.workloads.sources``):

* FSDP (fsdp, fsdp+tp*, fsdp+ep): per unit, an all_gather of the compute-dtype parameters (float8 weights in one
  byte under tensorwise float8, torchtitan's ``enable_fsdp_float8_all_gather``) and a reduce_scatter of the
  reduce-dtype gradients over each parameter's FSDP group (fsdp+ep: the dense parameters over every rank of the
  pipeline rank, the experts over ``efsdp``); HSDP (``dp_replicate``) then all-reduces each reduced shard over the
  replicas, as FSDP2's ``foreach_reduce`` does;
* DDP replicas (ddp, tp with ``dp`` > 1; ep: the dense gradients over every rank, the experts over ``edp``): the
  gradients all-reduced in DDP's buckets (25 MB, the first 1 MB: ``ddp_buckets``), in gradient-ready order.

The optimizer step (:func:`tail_seconds`) runs once per step on each pipeline rank after its last REDUCE_GRAD, over
the parameter shards of all its stages (torchtitan's ``OptimizersContainer``, one optimizer per model part, stepped
together), traced on fake tensors with the zoo's own functions (``clip_grad_norm_``, ``optimizer_step``) and
timed as predict times it. With ``max_norm`` the gradient norm is all-reduced over the pipeline ranks too
(torchtitan's ``clip_grad_norm_`` with ``pp_mesh``: ``total_norm **= p``, ``all_reduce(total_norm, group=pp)``,
``total_norm **= 1 / p``), a barrier: every rank scales its gradients and steps after the slowest rank's norm.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import torch

from commsched.pipeline.split import Stage
from commsched.pipeline.stages import ancestors, param_bytes
from commsched.workloads.program import DDP_BUCKET_CAP_BYTES, DDP_FIRST_BUCKET_BYTES, WorkloadSpec

NORM_BYTES = 4
"""the PP all_reduce's payload: torchtitan's total norm, one float32"""


def float8_gathered(spec: WorkloadSpec) -> frozenset[str]:
    """The parameters FSDP gathers in float8 (tensorwise float8 under FSDP), by name."""
    return frozenset(spec.layout[i].name for i in spec.float8_params) if spec.float8_all_gather else frozenset()


def sync_seconds(spec: WorkloadSpec, stage: Stage, hardware: Any) -> tuple[float, float]:
    """(UNSHARD, REDUCE_GRAD) seconds of ``stage`` under ``spec`` (a pipeline rank's plan; ``hardware`` sized for
    the whole job): see the module docstring."""
    from commsched.cost.collectives import plan_collective

    plan = spec.plan
    units = set(stage.units)
    layout = [p for p in spec.layout if p.unit in units]

    def time_s(kind: str, nbytes: int, size: int, stride: int) -> float:
        return plan_collective(kind, nbytes, size, hardware, stride=stride).time_s if size > 1 and nbytes else 0.0

    gather_s = reduce_s = 0.0
    if plan.fsdp > 1:
        one_byte = float8_gathered(spec)
        for unit in stage.units:
            for expert in (False, True):
                params = [p for p in layout if p.unit == unit and p.expert == expert]
                size, dim = plan.fsdp_degree(expert), plan.fsdp_dim(expert)
                stride = 1 if dim == "world" else plan.stride(dim)
                shard = param_bytes(params, spec.reduce_dtype, sharded=True)
                gather_s += time_s("all_gather", param_bytes(params, spec.dtype, sharded=True, one_byte=one_byte)
                                   * size, size, stride)  # fmt: skip
                reduce_s += time_s("reduce_scatter", shard * size, size, stride)
                if plan.replicate > 1:  # HSDP: the reduced shard all-reduced over the replicas
                    reduce_s += time_s("all_reduce", shard, plan.replicate, plan.stride("dp_replicate"))
        return gather_s, reduce_s
    for dim, members in _ddp_groups(spec, layout):
        size = spec.plan.world_size if dim == "world" else plan.dims[dim]
        stride = 1 if dim == "world" else plan.stride(dim)
        sizes = [math.prod(p.shard_shape) * spec.reduce_dtype.itemsize for p in reversed(members)]
        for bucket in _buckets(sizes):
            reduce_s += time_s("all_reduce", sum(sizes[i] for i in bucket), size, stride)
    return gather_s, reduce_s


def _ddp_groups(spec: WorkloadSpec, layout: list[Any]) -> list[tuple[str, list[Any]]]:
    """(mesh dimension, parameters) of each DDP gradient all_reduce, as ``StepProgram._bucket_plan`` groups them."""
    plan = spec.plan
    if plan.ep > 1:
        return [("world", [p for p in layout if not p.expert]),
                *([("edp", [p for p in layout if p.expert])] if plan.dims.get("edp", 1) > 1 else [])]  # fmt: skip
    return [("dp", layout)] if plan.dp > 1 else []


def _buckets(sizes: list[int]) -> list[list[int]]:
    from commsched.workloads.collectives import ddp_buckets

    return ddp_buckets(sizes, cap_bytes=DDP_BUCKET_CAP_BYTES, first_cap_bytes=DDP_FIRST_BUCKET_BYTES) if sizes else []


@dataclasses.dataclass(frozen=True)
class TailSeconds:
    """A pipeline rank's optimizer step: ``norm_s`` until its gradient norm is known on its own groups (the local
    norms and their all_reduces over FSDP / TP / EP; 0 without clipping), ``after_s`` the rest (the gradients scaled,
    the optimizer's kernels)."""

    norm_s: float
    after_s: float

    @property
    def total_s(self) -> float:
        return self.norm_s + self.after_s


class _TailStep:
    """The optimizer step of one pipeline rank's parameters as a program :func:`~commsched.workloads.trace.
    trace_step` traces: inputs the parameter shards (master dtype), their gradients (reduce dtype, as REDUCE_GRAD
    leaves them) and the optimizer states; returns the total norm (clipping) and the gradients."""

    def __init__(self, spec: WorkloadSpec, groups: dict[str, Any], layout: list[Any]) -> None:
        from commsched.workloads.collectives import Group

        self.spec, self.layout = spec, layout
        self.groups = {name: Group.of(pg, 0) for name, pg in groups.items()}

    @property
    def input_names(self) -> list[str]:
        from commsched.workloads.optimizer import state_shapes

        names = [p.name for p in self.layout] + [f"grad.{p.name}" for p in self.layout]
        return names + ([n for n, _, _ in state_shapes(self.layout, self.spec.master_dtype)]
                        if self.spec.optimizer != "none" else [])  # fmt: skip

    def empty_inputs(self) -> list[torch.Tensor]:
        from commsched.workloads.optimizer import state_tensors

        spec = self.spec
        out = [torch.empty(p.shard_shape, dtype=spec.master_dtype) for p in self.layout]
        out += [torch.empty(p.shard_shape, dtype=spec.reduce_dtype) for p in self.layout]
        return out + (state_tensors(spec.optimizer, self.layout, spec.master_dtype) if spec.optimizer != "none" else [])

    def step(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        from commsched.workloads.collectives import all_reduce
        from commsched.workloads.optimizer import clip_grad_norm_, norm_sets, optimizer_step

        spec, n = self.spec, len(self.layout)
        params, grads, states = list(inputs[:n]), list(inputs[n : 2 * n]), list(inputs[2 * n :])
        grads = [g if g.dtype == p.dtype else g.to(p.dtype) for p, g in zip(params, grads, strict=True)]
        out = []
        if spec.max_norm is not None:  # as StepProgram.step clips, over this rank's own groups
            out.append(clip_grad_norm_(grads, spec.max_norm, norm_sets(self.layout, spec.plan),
                                       lambda t, dim: all_reduce(t, self.groups[dim]),
                                       {dim: g.size for dim, g in self.groups.items()}))  # fmt: skip
        if spec.optimizer != "none":
            optimizer_step(spec.optimizer, params, grads, states)
        return out + grads


def tail_seconds(spec: WorkloadSpec, units: tuple[str, ...], hardware: Any, fusion: bool) -> TailSeconds:
    """The optimizer step (clipping included) of the parameters of ``units`` under ``spec`` (a pipeline rank's plan)
    on ``hardware``, traced on fake tensors and simulated as traced (``fusion``: predict's ``compile``). Memoised
    per process, once for every batch and AC policy (it reads the parameters, gradients and states alone), so a
    search over M and AC traces each rank's step once."""
    if spec.optimizer == "none" and spec.max_norm is None:
        return TailSeconds(0.0, 0.0)
    return _tail_seconds(dataclasses.replace(spec, batch=1, ac="none"), units, hardware, fusion)


@functools.lru_cache(maxsize=64)
def _tail_seconds(spec: WorkloadSpec, units: tuple[str, ...], hardware: Any, fusion: bool) -> TailSeconds:
    """:func:`tail_seconds` from the stage cache's disk (``tails``: a warm process traces nothing), else traced;
    ``hardware`` a Hardware."""
    from commsched.pipeline.cache import cached_seconds

    key = {"units": list(units), "fusion": fusion}
    traced = lambda: _traced_tail(spec, units, hardware, fusion)  # noqa: E731
    return TailSeconds(*cached_seconds("tails", spec, key, hardware, traced))


def clear_tails() -> None:
    """Forget the in-process optimizer steps (the disk cache stays)."""
    _tail_seconds.cache_clear()


def _traced_tail(spec: WorkloadSpec, units: tuple[str, ...], hardware: Any, fusion: bool) -> tuple[float, float]:
    from commsched.cost import estimate_costs
    from commsched.frontends.fake_pg import fake_process_group
    from commsched.frontends.fx import from_fx
    from commsched.hardware import for_graph
    from commsched.sim import simulate_costs
    from commsched.workloads.mesh import create_groups
    from commsched.workloads.program import StepProgram
    from commsched.workloads.trace import TRACED_RANK, trace_step, workload_meta

    layout = [p for p in spec.layout if p.unit in set(units)]
    with fake_process_group(spec.plan.world_size, rank=TRACED_RANK):
        groups = create_groups(spec.plan, TRACED_RANK)
        tail = _TailStep(spec, groups, layout)
        gm = trace_step(tail)
        norm = gm.graph.output_node().args[0][0].name if spec.max_norm is not None else None
        meta = {**workload_meta(StepProgram(spec, groups, TRACED_RANK), groups), "inputs": tail.input_names}
        graph = from_fx(gm, meta=meta)
    res = simulate_costs(graph, estimate_costs(graph, for_graph(hardware, graph), fusion=fusion))
    norm_ns = 0 if norm is None else int(res.end_ns[ancestors(graph, graph.names.index(norm))].max())
    return norm_ns * 1e-9, max(int(res.makespan_ns) - norm_ns, 0) * 1e-9

"""``build``: trace a zoo workload into one FX graph and the commsched IR, on fake tensors at any world size."""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import math
from collections.abc import Callable
from typing import Any

import torch
import torch.fx

from commsched.heap import imports_settled
from commsched.ir import Graph
from commsched.ir.transform import MODULE_META_KEY
from commsched.workloads.mesh import create_groups
from commsched.workloads.params import ParamInfo
from commsched.workloads.presets import PRESETS
from commsched.workloads.program import StepProgram, WorkloadSpec, dtype_name, resolve
from commsched.workloads.sources import reshard_policy

TRACED_RANK = 0
WORKLOAD_META = "commsched_workload"
"""``GraphModule.meta`` key of a traced step: (its ``WorkloadSpec``, its node names as traced), so that a rewrite can
retrace the step (e.g. at a smaller batch: ``rewrites/split_batch.py``) and tell whether the module was changed since"""


@dataclasses.dataclass(frozen=True, slots=True)
class Workload:
    """A traced step: the FX GraphModule (ATen ops with ``_c10d_functional`` collectives, FakeTensor meta), its
    commsched Graph, and ``meta`` (the configuration, parameter counts, mesh groups, padding; also in ``graph.meta``).
    ``spec`` rebuilds the same step for real runs: ``StepProgram(spec, groups, rank)``."""

    graph_module: torch.fx.GraphModule
    graph: Graph
    meta: dict[str, Any]
    spec: WorkloadSpec


def build(
    preset: str, *, parallel: str, world_size: int, progress: Callable[[str], None] | None = None, **options: Any
) -> Workload:
    """Trace ``preset`` under ``parallel`` at ``world_size`` ranks (as rank 0) into one graph, allocating nothing:
    :func:`commsched.workloads.resolve` with ``options``, then :func:`trace_spec`.

    Options (see ``resolve``): ``layers``, ``seq_len`` (default: the preset's), ``batch`` (sequences per
    data-parallel replica; default 1, 8 for decode), ``dtype``, ``mode`` (``"train"``: joint forward + backward,
    ``"prefill"`` or ``"decode"``: forward with a KV cache), ``kv_len``, ``tp_size``, ``ep_size``, ``fsdp_bucket``
    ("param" | "block"), ``reduce_dtype``, ``attention`` ("flash" | "sdpa"), ``capacity_factor``, ``ac`` (activation
    checkpointing: "none" | "full" | "selective-op" | "selective-layer:N"), ``float8`` (float8 training of the
    blocks' linears: "none" | "tensorwise" | "rowwise"), ``cp_size`` / ``cp_rotate`` (context parallelism: torch's
    ring attention, "allgather" | "alltoall"), ``dp_replicate`` (HSDP: FSDP's shards replicated over
    this many groups), ``optimizer`` (the step's AdamW: "none" | "adamw" | "adamw-fused"), ``max_norm`` (gradient
    clipping as torchtitan's, None: off), ``reshard_after_forward`` (FSDP2's; False: no re-gather in backward).
    Raises ValueError for an impossible configuration.
    """
    return trace_spec(resolve(preset, parallel=parallel, world_size=world_size, **options), progress)


def trace_spec(spec: WorkloadSpec, progress: Callable[[str], None] | None = None) -> Workload:
    """Trace a resolved spec (see :func:`build`); ``progress`` receives a message as each phase starts."""
    from commsched.frontends.fake_pg import fake_process_group
    from commsched.frontends.fx import from_fx

    say = progress or (lambda msg: None)
    layers = spec.model.n_layers
    with fake_process_group(spec.plan.world_size, rank=TRACED_RANK):
        groups = create_groups(spec.plan, TRACED_RANK)
        program = StepProgram(spec, groups, TRACED_RANK)
        program.on_layer = lambda i: say(
            f"tracing: forward of layer {i + 1}/{layers}" + (", then backward" if spec.train else "")
        )
        gm = trace_step(program)
        gm.meta[WORKLOAD_META] = (spec, tuple(n.name for n in gm.graph.nodes))
        say(f"importing {len(gm.graph.nodes)} FX nodes into the commsched graph")
        meta = workload_meta(program, groups)
        gm.meta[MODULE_META_KEY] = meta  # every import of this module, or of a rewritten copy, keeps it
        graph = from_fx(gm, meta=meta)
    return Workload(graph_module=gm, graph=graph, meta=meta, spec=spec)


def trace_step(program: StepProgram, device: torch.device | None = None) -> torch.fx.GraphModule:
    """``make_fx`` of ``program.step`` on fake tensors (created on ``device`` when given) under the program's
    process groups, with the placeholders named after its inputs. The module is a ``_LazyGraphModule``: its Python
    code is generated when first needed (called, ``.code``, printed, pickled), not by ``make_fx`` and again by
    :func:`tidy_traced` (two code generations of the whole step: ~7 % of a trace that is only imported)."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx._lazy_graph_module import _use_lazy_graph_module
    from torch.fx.experimental.proxy_tensor import make_fx

    settle_imports()
    on_device = torch.device(device) if device is not None else contextlib.nullcontext()
    with FakeTensorMode(), on_device, _use_lazy_graph_module(True):
        gm = make_fx(program.step)(*program.empty_inputs())
    tidy_traced(gm, program.input_names)
    return gm


@functools.cache
def settle_imports() -> None:
    """Once per process, before its first trace: import what a first ``make_fx`` / ``FakeTensorMode`` imports
    (``torch._dynamo``, with sympy: about 1 s of CPU) with the cyclic collector paused, then freeze every object
    alive (:func:`commsched.heap.imports_settled`). Changes no traced graph: torch imports the same modules on
    its first trace (tests/workloads/test_trace_startup.py checks that a trace is node for node the same)."""
    with imports_settled():
        import torch._dynamo  # noqa: F401  (make_fx imports it on its first call, FakeTensorMode its config)


def tidy_traced(gm: torch.fx.GraphModule, input_names: list[str]) -> None:
    """In place, on a freshly traced step (``make_fx``): name the placeholders after the inputs (``input_names``, one
    per placeholder, in order; dots become underscores) and drop the unused ``getitem`` s of multi-output ops (flash
    attention's RNG state, its None / int outputs), which carry no tensor, and the unused ``_local_scalar_dense``
    (``.item()``: the foreach AdamW's reads of its CPU step counters, host work); then recompile. Every zoo trace
    ends with it (:func:`trace_step`, :func:`commsched.rewrites.split_batch.split_zoo_step`), so their node names
    agree."""
    graph = gm.graph
    placeholders = [n for n in graph.nodes if n.op == "placeholder"]
    rename = all(hasattr(n, "_rename") for n in placeholders)  # torch.fx.Node._rename is private: optional
    for node, name in zip(placeholders, input_names, strict=True):
        if rename:
            node._rename(name.replace(".", "_"))
    for node in reversed(list(graph.nodes)):
        if (
            node.op == "call_function"
            and not node.users
            and (node.target.__name__ == "getitem" or node.target is torch.ops.aten._local_scalar_dense.default)
        ):
            graph.erase_node(node)
    gm.recompile()


def _padding_meta(layout: tuple[ParamInfo, ...], spec: WorkloadSpec) -> dict[str, Any]:
    rows = []
    fsdp_pad_bytes = 0
    float8 = spec.float8_params if spec.float8_all_gather else frozenset()  # gathered as 1 byte per element
    for pid, p in enumerate(layout):
        if p.fsdp_pad_rows or p.vocab_pad_rows:
            row_elems = math.prod(p.local_shape[1:])
            rows.append(
                {
                    "param": p.name,
                    "local_rows": p.local_shape[0],
                    "fsdp_pad_rows": p.fsdp_pad_rows,
                    "vocab_pad_rows": p.vocab_pad_rows,
                }
            )
            fsdp_pad_bytes += p.fsdp_pad_rows * row_elems * (1 if pid in float8 else spec.dtype.itemsize)
    return {"params": rows, "fsdp_all_gather_pad_bytes": fsdp_pad_bytes}


def workload_meta(program: StepProgram, groups: dict[str, Any]) -> dict[str, Any]:
    import torch.distributed as dist

    spec, cfg, plan = program.spec, program.spec.model, program.spec.plan
    layer = cfg.block_params()
    mesh_groups = {}
    for name, pg in groups.items():
        ranks = dist.get_process_group_ranks(pg)
        mesh_groups[name] = {
            "name": pg.group_name,
            "size": len(ranks),
            "stride": ranks[1] - ranks[0] if len(ranks) > 1 else 1,
        }
    meta: dict[str, Any] = {
        "workload": f"{cfg.name}/{plan.parallel}/{spec.mode}/world {plan.world_size}/{cfg.n_layers} of "
        f"{PRESETS[cfg.name].n_layers if cfg.name in PRESETS else cfg.n_layers} layers"
        + (f"/ac {spec.ac}" if spec.ac != "none" else "")
        + (f"/float8 {spec.float8}" if spec.float8 != "none" else "")
        + (f"/cp {plan.cp} {spec.cp_rotate}" if plan.cp > 1 else "")
        + (f"/optimizer {spec.optimizer}" if spec.optimizer != "none" else "")
        + (f"/max_norm {spec.max_norm:g}" if spec.max_norm is not None else ""),
        "preset": cfg.name,
        "parallel": plan.parallel,
        "mode": spec.mode,
        "world_size": plan.world_size,
        **plan.to_meta(),
        "groups": mesh_groups,
        "layers": cfg.n_layers,
        "seq_len": spec.seq_len,
        "batch": spec.batch,
        "dtype": dtype_name(spec.dtype),
        "param_dtype": dtype_name(spec.dtype),
        "master_dtype": dtype_name(spec.master_dtype),
        "reduce_dtype": dtype_name(spec.reduce_dtype) if spec.train else None,
        "intended_device": "cuda",
        "traced_device": "cpu",
        "traced_rank": TRACED_RANK,
        "attention": spec.attention,
        "ac": spec.ac,  # activation checkpointing of the blocks (commsched.workloads.ac)
        "float8": spec.float8,  # float8 training of the blocks' linears (commsched.workloads.float8)
        "optimizer": spec.optimizer,  # the step's optimizer (commsched.workloads.optimizer)
        # torch's flop counter charges causal attention for the full seq x seq score matrix
        "attention_causal": spec.mode != "decode",
        "params_total": cfg.total_params(),  # of the traced model (``layers`` blocks)
        "params_total_preset": PRESETS[cfg.name].total_params() if cfg.name in PRESETS else cfg.total_params(),
        "preset_layers": PRESETS[cfg.name].n_layers if cfg.name in PRESETS else cfg.n_layers,
        "params_per_layer": layer,
        "active_params_per_layer": cfg.block_active_params(),
        "params_embedding": cfg.vocab_size * cfg.dim,
        "params_output": cfg.vocab_size * cfg.dim,
        "tokens_per_step": spec.new_tokens * plan.data_parallel_degree,
        "tokens_per_replica": spec.new_tokens,
        "padding": _padding_meta(spec.layout, spec),
        "inputs": program.input_names,
    }
    if spec.mode != "train":
        meta["kv_len"] = spec.kv_len
    if plan.cp > 1:  # torch's ring attention (commsched.workloads.context_parallel)
        meta["context_parallel"] = {"cp": plan.cp, "rotate_method": spec.cp_rotate, "load_balancer": "headtail",
                                    "tokens_per_rank": spec.new_tokens // plan.cp}  # fmt: skip
    if spec.float8 != "none":
        meta["float8_linears"] = sorted({spec.layout[pid].key for pid in spec.float8_params})
        meta["float8_all_gather"] = spec.float8_all_gather
        meta["float8_tp"] = spec.float8_tp  # torchao's float8 TP styles (float8 activation all_gathers)
    if spec.max_norm is not None:  # gradient clipping (commsched.workloads.optimizer.clip_grad_norm_)
        meta["max_norm"] = spec.max_norm
    if spec.optimizer != "none":  # exp_avg and exp_avg_sq of every local parameter, persistent
        meta["optimizer_state_bytes"] = (
            2 * sum(math.prod(p.shard_shape) for p in spec.layout) * spec.master_dtype.itemsize
        )
    if plan.fsdp > 1:
        meta["fsdp_bucket"] = spec.fsdp_bucket
        resharded = reshard_policy(spec.reshard_after_forward)
        meta["fsdp_reshard_after_forward"] = sorted({p.unit for p in spec.layout if resharded(p.unit)})
    buckets = program.ddp_bucket_names()
    if buckets:
        meta["ddp_buckets"] = buckets
    if cfg.is_moe:
        meta["moe"] = {
            "n_experts": cfg.n_experts,
            "top_k": cfg.top_k,
            "capacity_per_expert": program.shapes.capacity,
            "capacity_factor": spec.capacity_factor,
        }
    return meta

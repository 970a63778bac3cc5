"""One pipeline stage's programs, traced from the zoo on fake tensors and timed with the cost model and simulator.

A stage (:class:`commsched.pipeline.split.Stage`) runs, per micro-batch, the embedding (first stage), its
transformer blocks and the norm, output projection and loss (last stage), then the backward of that from the
gradient of its output (the loss on the last stage). What torch's pipelining does with FSDP (``PipelineStage`` in
torch 2.13, ``backward_maybe_with_nosync`` and ``perform_reduce_grad``; torchtitan does not reshard after forward
under PP, ``torchtitan/distributed/fsdp.py``): the parameters are gathered once per step (UNSHARD) and stay
unsharded, gradients accumulate unsharded and are reduced once, after the stage's last backward (REDUCE_GRAD). So a
micro-batch's program has no FSDP collective: it is traced with the stage's parameters as FSDP hands them to the
blocks (unsharded, in the compute dtype), with the tensor-parallel collectives of its plan, and FSDP's collectives
are timed per step by :mod:`commsched.pipeline.job`.

One trace per distinct stage shape (first, its blocks' activation-checkpointing policies, last) and micro-batch size:
forward and backward in one graph (``make_fx`` of the forward, then ``torch.autograd.grad``), the nodes recorded
when the forward ends. Each block runs as the zoo's step runs it: under its AC policy's checkpoint
(:func:`commsched.workloads.ac.block_checkpoint`: the backward recomputes it), its linears in float8 with the
spec's recipe, its MoE all_to_alls and CP ring attention on the spec's groups. The
backward's halves as torch's ``stage_backward_input`` / ``stage_backward_weight`` split it: I is the part of the
backward the input gradient needs (its nodes are the input gradient's ancestors), W the rest (the weight gradients;
the first stage, whose input needs no gradient, runs its whole backward as W, as torch does).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from typing import Any

import numpy as np
import torch

from commsched.ir import Graph, OpKind
from commsched.workloads import model
from commsched.workloads.ac import block_checkpoint
from commsched.workloads.float8 import RECIPES
from commsched.workloads.program import StepProgram, WorkloadSpec
from commsched.workloads.sources import ParamSource

HIDDEN_INPUT, OUTPUT_GRAD = "h_in", "grad_out"
"""the input names of a stage's hidden state (from the previous stage) and of its output's gradient (from the next)"""


@dataclasses.dataclass(frozen=True, eq=False)
class TracedStage:
    """A stage's forward + backward for one micro-batch as one graph.

    ``forward``: its forward nodes (every node recorded before the backward started); ``weight``: the backward nodes
    of W (the rest of the backward is I). ``activation_bytes``: what it holds from the forward to the end of the
    backward (:func:`held_bytes`: the forward's storages the backward reads, the input received and the output
    sent, each storage once; parameters and model buffers not counted); ``send_bytes``: the output sent to the
    next stage (0 on the last). ``graph_module``: the traced FX module (async TP rewrites it); ``grad_in``: the
    node of the input gradient (None on the first stage)."""

    graph: Graph
    forward: np.ndarray
    weight: np.ndarray
    activation_bytes: int
    send_bytes: int
    graph_module: Any = None
    grad_in: str | None = None

    @property
    def forward_flops(self) -> float:
        return float(self.graph.flops[self.forward].sum())


@dataclasses.dataclass(frozen=True)
class StageTimesS:
    """A traced stage's simulated seconds: F, B, and B's halves I + W (== B)."""

    forward_s: float
    backward_s: float
    backward_input_s: float
    backward_weight_s: float


class StageStep:
    """A stage's micro-batch step for :func:`commsched.workloads.trace.trace_step` (it reads ``input_names``,
    ``empty_inputs`` and ``step``, as of a :class:`~commsched.workloads.program.StepProgram`).

    Inputs: the stage's parameters (unsharded, compute dtype), ``tokens`` (first stage) or ``h_in`` (the hidden
    state received), ``labels`` (last), ``rope_cos``, ``rope_sin``, ``grad_out`` (not last). Returns the output
    (loss or hidden state), the input gradient (not first) and the parameter gradients (reduce dtype). Requires a
    spec without FSDP (``program.spec.plan``: tp, tp+sp, none, ep, with or without cp) and the process groups of
    ``program`` initialised. ``policies``: each block's AC policy (one of
    :data:`commsched.workloads.ac.BLOCK_POLICIES`; None: none checkpointed)."""

    def __init__(self, program: StepProgram, first: bool, layers: int, last: bool,
                 policies: tuple[str, ...] | None = None) -> None:  # fmt: skip
        spec = program.spec
        if layers > spec.model.n_layers:
            raise ValueError(f"layers={layers}: the spec has {spec.model.n_layers}")
        policies = ("none",) * layers if policies is None else tuple(policies)
        if len(policies) != layers:
            raise ValueError(f"policies={policies}: expected one AC policy per layer ({layers})")
        self.program, self.first, self.layers, self.last, self.policies = program, first, layers, last, policies
        units = (("embed",) if first else ()) + tuple(f"layers.{i}" for i in range(layers)) + (
            ("final",) if last else ())  # fmt: skip
        self.layout = [p for p in spec.layout if p.unit in units]
        self.forward_nodes: set = set()
        self.send_bytes = 0

    @property
    def input_names(self) -> list[str]:
        names = [p.name for p in self.layout] + ["tokens" if self.first else HIDDEN_INPUT]
        names += ["labels"] if self.last else []
        return names + ["rope_cos", "rope_sin"] + ([] if self.last else [OUTPUT_GRAD])

    def hidden_shape(self) -> tuple[int, int]:
        """The hidden state a stage receives and sends: ``[tokens, dim]``, the tokens split over TP under SP."""
        spec, s = self.program.spec, self.program.shapes
        return (s.tokens // spec.plan.tp if spec.plan.sp else s.tokens, spec.model.dim)

    def empty_inputs(self) -> list[torch.Tensor]:
        spec, s, dt = self.program.spec, self.program.shapes, self.program.spec.dtype
        out = [torch.empty(p.local_shape, dtype=dt, requires_grad=True) for p in self.layout]
        out.append(torch.empty((s.batch, s.seq), dtype=torch.int64) if self.first else
                   torch.empty(self.hidden_shape(), dtype=dt, requires_grad=True))  # fmt: skip
        if self.last:
            out.append(torch.empty((s.batch, s.seq), dtype=torch.int64))
        out += [torch.empty((s.seq, 1, spec.model.head_dim), dtype=dt) for _ in range(2)]
        return out + ([] if self.last else [torch.empty(self.hidden_shape(), dtype=dt)])

    def step(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        from torch.fx.experimental.proxy_tensor import get_proxy_mode

        prog, n = self.program, len(self.layout)
        cfg, s, comm = prog.spec.model, prog.shapes, prog.comm
        params, (x, *data) = list(inputs[:n]), inputs[n:]
        labels = data.pop(0) if self.last else None
        rope, grad_out = (data[0], data[1]), (None if self.last else data[2])
        src = ParamSource(self.layout, params, train=True, **self._source_options())
        router = (cfg.dim, cfg.n_experts) if cfg.is_moe else None
        h = src.run("embed", lambda p: model.embed(p, x, s, comm)) if self.first else x
        for i, policy in enumerate(self.policies):
            h = src.run(f"layers.{i}", lambda p, h: model.block(p, h, cfg, s, comm, rope, None), h,
                        checkpoint=block_checkpoint(policy, i, moe_router_shape=router))  # fmt: skip
        out = src.run("final", lambda p: model.head_loss(p, h, labels, cfg, s, comm)) if self.last else h
        mode = get_proxy_mode()
        self.forward_nodes = set(mode.tracer.graph.nodes) if mode is not None else set()
        self.send_bytes = 0 if self.last else out.untyped_storage().nbytes()
        wrt = params if self.first else [x, *params]
        grads = torch.autograd.grad(out, wrt, grad_outputs=grad_out)
        return [out, *grads[: len(wrt) - n], *src.finalize(list(grads[len(wrt) - n :]))]

    def _source_options(self) -> dict[str, Any]:
        """The zoo's ParamSource options of the spec (``StepProgram._source`` without FSDP or DDP buckets: torch's
        pipelining reduces gradients once per step): dtypes, SP's norm all_reduce, float8 linears, EP's expert
        gradient scale."""
        spec, comm = self.program.spec, self.program.comm
        out = dict(compute_dtype=spec.dtype, reduce_dtype=spec.reduce_dtype, sp_group=comm.tp if spec.plan.sp else None,
                   expert_grad_scale=1.0 / spec.plan.ep)  # fmt: skip
        if spec.float8 != "none":  # the spec's float8 weights, by their index in this stage's layout
            names = {spec.layout[pid].name for pid in spec.float8_params}
            pids = frozenset(i for i, p in enumerate(self.layout) if p.name in names)
            out.update(float8=RECIPES[spec.float8], float8_pids=pids)
        return out


@functools.lru_cache(maxsize=64)
def trace_stage(spec: WorkloadSpec, first: bool, layers: int, last: bool,
                policies: tuple[str, ...] | None = None) -> TracedStage:  # fmt: skip
    """The stage program of ``spec`` (no FSDP; batch = one micro-batch) traced on fake tensors as rank 0 and
    imported; ``policies``: each block's AC policy (None: none). Cached per (spec, shape, policies): equal stages
    share one trace."""
    from commsched.frontends.fake_pg import fake_process_group
    from commsched.frontends.fx import from_fx
    from commsched.workloads.mesh import create_groups
    from commsched.workloads.trace import TRACED_RANK, trace_step, workload_meta

    plan = spec.plan
    # the data dimension of a micro-batch program is its CP ranks (one sequence) or its EP ranks (their own tokens)
    if plan.fsdp > 1 or plan.replicate > 1 or plan.dp > max(plan.cp, plan.ep) or not spec.train:
        raise ValueError(f"parallel={plan.parallel!r}, mode={spec.mode!r}: a stage's micro-batch program is "
                         "traced without FSDP or data parallelism, in training")  # fmt: skip
    with fake_process_group(plan.world_size, rank=TRACED_RANK):
        groups = create_groups(plan, TRACED_RANK)
        program = StepProgram(spec, groups, TRACED_RANK)
        stage = StageStep(program, first, layers, last, policies)
        gm = trace_step(stage)
        forward = {n.name for n in gm.graph.nodes if n in stage.forward_nodes}
        outputs = gm.graph.output_node().args[0]
        grad_in = None if first else outputs[1].name
        meta = {**workload_meta(program, groups), "inputs": stage.input_names, "layers": layers,
                "pipeline_stage": {"first": first, "layers": layers, "last": last,
                                   "ac": list(stage.policies)}}  # fmt: skip
        graph = from_fx(gm, meta=meta)
    fwd = np.fromiter((name in forward for name in graph.names), bool, len(graph))
    needed = np.zeros(len(graph), bool) if grad_in is None else ancestors(graph, graph.names.index(grad_in))
    weight = ~fwd & ~needed & (graph.kinds != OpKind.OUTPUT)
    kept = [graph.names.index(name) for name in ([] if first else [HIDDEN_INPUT]) + ([] if last else [outputs[0].name])]
    return TracedStage(graph, fwd, weight, held_bytes(graph, fwd, kept), stage.send_bytes, gm, grad_in)


def held_bytes(g: Graph, forward: np.ndarray, kept: list[int]) -> int:
    """What a stage holds from its forward to its backward: the storages forward nodes made that a backward node
    reads (autograd's saved tensors, as the traced backward reads them: under activation checkpointing only the
    checkpoints' inputs and what a selective policy saves, the recompute making the rest anew), plus the storages of
    ``kept`` (the input it received and the output it sent, which torch's stage keeps until the backward); each
    storage once, the parameters' (graph inputs) not counted."""
    ptr, idx = g.storage_users
    owner = g.storage_owner
    users = np.repeat(np.arange(g.num_storages), np.diff(ptr))
    reader = ~forward[idx] & (g.kinds[idx] != OpKind.OUTPUT)  # a backward node uses the storage
    held = np.zeros(g.num_storages, bool)
    held[users[reader]] = True
    held &= forward[owner] & (g.kinds[owner] != OpKind.INPUT)
    for node in kept:
        held[g.buf_storage[g.buf_ptr[node] : g.buf_ptr[node + 1]]] = True
    return int(g.storage_nbytes[held].sum())


def async_tp_stage(traced: TracedStage, spec: WorkloadSpec, hardware: Any) -> TracedStage:
    """``traced`` with async TP applied as predict applies it (:func:`commsched.experiments.predict.async_tp_step`:
    the blocks' all_gather -> matmul and matmul -> reduce_scatter as per-peer copy-engine transfers under partial
    matmuls). The rewrite keeps every node it does not fuse and places the new ones at the fused nodes' positions,
    so the forward is still the prefix that ends with the forward's last node, and I is still what the input
    gradient needs. ValueError (one line) without TP or where ``hardware`` has no symmetric-memory numbers."""
    from commsched.experiments.predict import async_tp_step
    from commsched.hardware import for_graph
    from commsched.workloads.trace import Workload

    old = traced.graph
    workload = Workload(graph_module=traced.graph_module, graph=old, meta=old.meta, spec=spec)
    g = async_tp_step(workload, for_graph(hardware, old))
    index = g.index
    kept = [index[old.names[i]] for i in np.flatnonzero(traced.forward) if old.names[i] in index]
    fwd = np.arange(len(g)) <= max(kept)
    needed = np.zeros(len(g), bool) if traced.grad_in is None else ancestors(g, index[traced.grad_in])
    weight = ~fwd & ~needed & (g.kinds != OpKind.OUTPUT)
    return dataclasses.replace(traced, graph=g, forward=fwd, weight=weight)


def ancestors(g: Graph, node: int) -> np.ndarray:
    """``node`` and every node it depends on (data inputs and control deps), as a mask. O(N + E)."""
    ptr, idx = g.predecessors_csr()
    mask = np.zeros(len(g), bool)
    mask[node] = True
    for i in range(node, -1, -1):  # ids are topological: a node's predecessors have smaller ids
        if mask[i]:
            mask[idx[ptr[i] : ptr[i + 1]]] = True
    return mask


def stage_seconds(traced: TracedStage, hardware: Any, *, fusion: bool = True) -> StageTimesS:
    """``traced`` simulated on ``hardware`` as traced (one compute stream, its collectives on their comm streams):
    F ends with its last forward node, B is the rest of the step; W is the compute time of the weight-gradient
    nodes, I the rest of B (the exposed waits of the backward's collectives included). ``fusion``: its kernels
    fused as Inductor fuses a compiled block (``estimate_costs``' default; predict's ``compile``), else one kernel
    per op (eager, predict's default)."""
    from commsched.cost import estimate_costs
    from commsched.hardware import for_graph
    from commsched.sim import simulate_costs

    g = traced.graph
    res = simulate_costs(g, estimate_costs(g, for_graph(hardware, g), fusion=fusion))
    forward_ns = int(res.end_ns[traced.forward].max(initial=0))
    backward_ns = max(int(res.makespan_ns) - forward_ns, 0)
    on_compute = (g.kinds == OpKind.COMPUTE) | (g.kinds == OpKind.OTHER)
    weight_ns = min(int(res.standalone_ns[traced.weight & on_compute].sum()), backward_ns)
    return StageTimesS(forward_ns * 1e-9, backward_ns * 1e-9, (backward_ns - weight_ns) * 1e-9, weight_ns * 1e-9)


def param_bytes(layout: list[Any], dtype: torch.dtype, *, sharded: bool, one_byte: frozenset[str] = frozenset()) -> int:
    """Bytes of ``layout`` 's parameters in ``dtype``: each rank's FSDP shard, or unsharded (TP / EP-local); those
    named in ``one_byte`` (float8 weights) one byte an element."""
    return sum(math.prod(p.shard_shape if sharded else p.local_shape) * (1 if p.name in one_byte else dtype.itemsize)
               for p in layout)  # fmt: skip

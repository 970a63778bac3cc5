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

One trace per distinct stage shape (first, number of layers, last) and micro-batch size: forward and backward in one
graph (``make_fx`` of the forward, then ``torch.autograd.grad``), the nodes recorded when the forward ends. The
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
from commsched.workloads.program import StepProgram, WorkloadSpec
from commsched.workloads.sources import ParamSource

HIDDEN_INPUT, OUTPUT_GRAD = "h_in", "grad_out"
"""the input names of a stage's hidden state (from the previous stage) and of its output's gradient (from the next)"""


@dataclasses.dataclass(frozen=True, eq=False)
class TracedStage:
    """A stage's forward + backward for one micro-batch as one graph.

    ``forward``: its forward nodes (every node recorded before the backward started); ``weight``: the backward nodes
    of W (the rest of the backward is I). ``activation_bytes``: what it holds from the forward to the end of the
    backward (the tensors autograd saved, the input received and the output sent, each storage once; parameters and
    model buffers not counted); ``send_bytes``: the output sent to the next stage (0 on the last)."""

    graph: Graph
    forward: np.ndarray
    weight: np.ndarray
    activation_bytes: int
    send_bytes: int

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


class _SavedBytes:
    """Saved-tensor hooks counting what autograd saves in a forward, each storage once, but for ``skip`` s."""

    def __init__(self, skip: list[torch.Tensor]) -> None:
        from torch.multiprocessing.reductions import StorageWeakRef

        self._ref = StorageWeakRef
        self.skip = {StorageWeakRef(t.untyped_storage()) for t in skip}
        self.held: dict[Any, int] = {}

    def add(self, t: torch.Tensor) -> None:
        key = self._ref(t.untyped_storage())
        if key not in self.skip:
            self.held[key] = t.untyped_storage().nbytes()

    def pack(self, t: torch.Tensor) -> torch.Tensor:
        self.add(t)
        return t

    @staticmethod
    def unpack(t: torch.Tensor) -> torch.Tensor:
        return t


class StageStep:
    """A stage's micro-batch step for :func:`commsched.workloads.trace.trace_step` (it reads ``input_names``,
    ``empty_inputs`` and ``step``, as of a :class:`~commsched.workloads.program.StepProgram`).

    Inputs: the stage's parameters (unsharded, compute dtype), ``tokens`` (first stage) or ``h_in`` (the hidden
    state received), ``labels`` (last), ``rope_cos``, ``rope_sin``, ``grad_out`` (not last). Returns the output
    (loss or hidden state), the input gradient (not first) and the parameter gradients (reduce dtype). Requires a
    spec without FSDP or data parallelism (``program.spec.plan``: tp, tp+sp or none) and the process groups of
    ``program`` initialised."""

    def __init__(self, program: StepProgram, first: bool, layers: int, last: bool) -> None:
        spec = program.spec
        if layers > spec.model.n_layers:
            raise ValueError(f"layers={layers}: the spec has {spec.model.n_layers}")
        self.program, self.first, self.layers, self.last = program, first, layers, last
        units = (("embed",) if first else ()) + tuple(f"layers.{i}" for i in range(layers)) + (
            ("final",) if last else ())  # fmt: skip
        self.layout = [p for p in spec.layout if p.unit in units]
        self.forward_nodes: set = set()
        self.activation_bytes = self.send_bytes = 0

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
        spec, cfg, s, comm = prog.spec, prog.spec.model, prog.shapes, prog.comm
        params, (x, *data) = list(inputs[:n]), inputs[n:]
        labels = data.pop(0) if self.last else None
        rope, grad_out = (data[0], data[1]), (None if self.last else data[2])
        src = ParamSource(self.layout, params, compute_dtype=spec.dtype, reduce_dtype=spec.reduce_dtype, train=True,
                          sp_group=comm.tp if spec.plan.sp else None)  # fmt: skip
        saved = _SavedBytes(list(inputs))
        with torch.autograd.graph.saved_tensors_hooks(saved.pack, saved.unpack):
            h = src.run("embed", lambda p: model.embed(p, x, s, comm)) if self.first else x
            for i in range(self.layers):
                h = src.run(f"layers.{i}", lambda p, h: model.block(p, h, cfg, s, comm, rope, None), h)
            out = src.run("final", lambda p: model.head_loss(p, h, labels, cfg, s, comm)) if self.last else h
        mode = get_proxy_mode()
        self.forward_nodes = set(mode.tracer.graph.nodes) if mode is not None else set()
        saved.skip.clear()  # torch's stage holds the input it received and the output it sent until the backward
        for t in ([] if self.first else [x]) + ([] if self.last else [out]):
            saved.add(t)
        self.activation_bytes = sum(saved.held.values())
        self.send_bytes = 0 if self.last else out.untyped_storage().nbytes()
        wrt = params if self.first else [x, *params]
        grads = torch.autograd.grad(out, wrt, grad_outputs=grad_out)
        return [out, *grads[: len(wrt) - n], *src.finalize(list(grads[len(wrt) - n :]))]


@functools.lru_cache(maxsize=64)
def trace_stage(spec: WorkloadSpec, first: bool, layers: int, last: bool) -> TracedStage:
    """The stage program of ``spec`` (tp, tp+sp or none; batch = one micro-batch) traced on fake tensors as rank 0
    and imported. Cached per (spec, shape): equal stages share one trace."""
    from commsched.frontends.fake_pg import fake_process_group
    from commsched.frontends.fx import from_fx
    from commsched.workloads.mesh import create_groups
    from commsched.workloads.trace import TRACED_RANK, trace_step, workload_meta

    if spec.plan.fsdp > 1 or spec.plan.dp > 1 or not spec.train:
        raise ValueError(f"parallel={spec.plan.parallel!r}, mode={spec.mode!r}: a stage's micro-batch program is "
                         "traced without FSDP or data parallelism, in training")  # fmt: skip
    with fake_process_group(spec.plan.world_size, rank=TRACED_RANK):
        groups = create_groups(spec.plan, TRACED_RANK)
        program = StepProgram(spec, groups, TRACED_RANK)
        stage = StageStep(program, first, layers, last)
        gm = trace_step(stage)
        forward = {n.name for n in gm.graph.nodes if n in stage.forward_nodes}
        grad_in = None if first else gm.graph.output_node().args[0][1].name
        meta = {**workload_meta(program, groups), "inputs": stage.input_names, "layers": layers,
                "pipeline_stage": {"first": first, "layers": layers, "last": last}}  # fmt: skip
        graph = from_fx(gm, meta=meta)
    fwd = np.fromiter((name in forward for name in graph.names), bool, len(graph))
    needed = np.zeros(len(graph), bool) if grad_in is None else _ancestors(graph, graph.names.index(grad_in))
    weight = ~fwd & ~needed & (graph.kinds != OpKind.OUTPUT)
    return TracedStage(graph, fwd, weight, stage.activation_bytes, stage.send_bytes)


def _ancestors(g: Graph, node: int) -> np.ndarray:
    """``node`` and every node it depends on (data inputs and control deps), as a mask. O(N + E)."""
    ptr, idx = g.predecessors_csr()
    mask = np.zeros(len(g), bool)
    mask[node] = True
    for i in range(node, -1, -1):  # ids are topological: a node's predecessors have smaller ids
        if mask[i]:
            mask[idx[ptr[i] : ptr[i + 1]]] = True
    return mask


def stage_seconds(traced: TracedStage, hardware: Any) -> StageTimesS:
    """``traced`` simulated on ``hardware`` as traced (one compute stream, its collectives on their comm streams):
    F ends with its last forward node, B is the rest of the step; W is the compute time of the weight-gradient
    nodes, I the rest of B (the exposed waits of the backward's collectives included)."""
    from commsched.sim import simulate

    res = simulate(traced.graph, hardware)
    g = traced.graph
    forward_ns = int(res.end_ns[traced.forward].max(initial=0))
    backward_ns = max(int(res.makespan_ns) - forward_ns, 0)
    on_compute = (g.kinds == OpKind.COMPUTE) | (g.kinds == OpKind.OTHER)
    weight_ns = min(int(res.standalone_ns[traced.weight & on_compute].sum()), backward_ns)
    return StageTimesS(forward_ns * 1e-9, backward_ns * 1e-9, (backward_ns - weight_ns) * 1e-9, weight_ns * 1e-9)


def param_bytes(layout: list[Any], dtype: torch.dtype, *, sharded: bool) -> int:
    """Bytes of ``layout`` 's parameters in ``dtype``: each rank's FSDP shard, or unsharded (TP-local)."""
    return sum(math.prod(p.shard_shape if sharded else p.local_shape) for p in layout) * dtype.itemsize

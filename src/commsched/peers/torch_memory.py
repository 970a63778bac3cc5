"""torch's own memory tracker on the zoo's training step: the peer our peak memory per GPU is checked against.

:func:`torch_fsdp_peak` builds the zoo's model as ``nn.Module`` units (embedding, each block, final norm + output:
the zoo's own functions in :mod:`commsched.workloads.model`, the zoo's parameter shapes), shards each unit with
FSDP2's ``fully_shard`` as the zoo's FSDP source does (bf16 parameters, fp32 gradient reduction, the final unit kept
unsharded after the forward; every unit so when the spec's ``reshard_after_forward`` is False), checkpoints the
blocks with the zoo's activation checkpointing (:func:`commsched.workloads.ac.block_checkpoint`: torchtitan's full
and selective policies), and runs two training
iterations (forward, backward, AdamW, ``zero_grad``), the second one's forward and backward under torch's
``FSDPMemTracker`` (``torch.distributed._tools.fsdp2_mem_tracker``), on fake tensors with the fake process group, so
any world size runs on a CPU. It returns the tracker's peak and its breakdown at that peak (sharded / unsharded
parameters, gradients, optimizer state, activations, temporaries, all_gather and reduce_scatter buffers, inputs).

The peak compared is that of the forward and backward, with the optimizer state held: the optimizer update itself
is left out on both sides (``compare_peak``), because on fake DTensors the tracker counts the global-shape
temporaries of DTensor's sharding propagation inside AdamW's in-place ops (a full unsharded parameter per op), which
a real run never allocates.

The tracker counts a storage from its allocation until Python drops its last reference, in the order the CPU runs
the program (FSDP2's hooks included), and rounds nothing on CPU devices; it is the same definition as
:mod:`commsched.memory.liveness` over the framework order. Limits: plain FSDP (``parallel="fsdp"``), bf16 linears.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.nn as nn

from commsched.workloads import model
from commsched.workloads.ac import Checkpoint, block_checkpoint
from commsched.workloads.collectives import Comm
from commsched.workloads.program import WorkloadSpec

if TYPE_CHECKING:
    from commsched.experiments.predict import StepConfig

OPTIMIZERS = ("adamw", "adamw-fused", "none")
"""the optimizers whose state :func:`torch_fsdp_peak` holds (AdamW's two moments per parameter, either way)"""

CATEGORIES = {
    "Sharded Param": "params",
    "Unsharded Param": "unsharded_params",
    "Buffer": "buffers",
    "Sharded Grad": "grads",
    "Unsharded Grad": "unsharded_grads",
    "Activation": "activations",
    "Temp": "temporaries",
    "All Gather": "all_gather",
    "Reduce Scatter": "reduce_scatter",
    "OptState": "optimizer_state",
    "Inputs": "inputs",
}
"""FSDPMemTracker's reference types -> our names for them"""


@dataclass(frozen=True)
class PeakComparison:
    """Our peak of one step (``predict``'s: the traced step in the framework's order) beside torch's tracker's."""

    config: StepConfig
    ours_bytes: int
    torch: TorchMemoryPeak

    @property
    def ratio(self) -> float:
        """ours / torch's (1: the same peak)."""
        return self.ours_bytes / self.torch.peak_bytes


@dataclass(frozen=True)
class TorchMemoryPeak:
    """FSDPMemTracker's peak of one step (rank 0): ``peak_bytes`` and what it held then, per category."""

    peak_bytes: int
    at_peak_bytes: dict[str, int]


class _Unit(nn.Module):
    """One FSDP unit of the zoo: its parameters (the zoo's unsharded local shapes, fp32) and the zoo function that
    computes it, called with ``{key: parameter}`` and the unit's inputs, under an activation checkpoint if given."""

    def __init__(self, spec: WorkloadSpec, unit: str, fn: Any, checkpoint: Checkpoint | None = None) -> None:
        super().__init__()
        self.keys = [p.key for p in spec.layout if p.unit == unit]
        for p in spec.layout:
            if p.unit == unit:
                self.register_parameter(p.key, nn.Parameter(torch.empty(p.local_shape, dtype=spec.master_dtype)))
        self.fn, self.checkpoint = fn, checkpoint

    def forward(self, *args: torch.Tensor) -> torch.Tensor:
        def body(*args: torch.Tensor) -> torch.Tensor:
            return self.fn({k: getattr(self, k) for k in self.keys}, *args)

        return body(*args) if self.checkpoint is None else self.checkpoint(body, *args)


class _Llama(nn.Module):
    """The zoo's training step as one module: embedding, blocks, final norm + output + loss."""

    def __init__(self, spec: WorkloadSpec) -> None:
        super().__init__()
        cfg, comm = spec.model, Comm()
        s = model.Shapes(batch=spec.batch, seq=spec.seq_len, heads=cfg.n_heads, kv_heads=cfg.n_kv_heads,
                         attention=spec.attention, capacity=_capacity(spec))  # fmt: skip
        self.embed = _Unit(spec, "embed", lambda p, tokens: model.embed(p, tokens, s, comm))
        self.layers = nn.ModuleList(
            _Unit(spec, f"layers.{i}", lambda p, h, cos, sin: model.block(p, h, cfg, s, comm, (cos, sin), None),
                  block_checkpoint(spec.ac, i, moe_router_shape=(cfg.dim, cfg.n_experts) if cfg.is_moe else None))
            for i in range(cfg.n_layers)
        )  # fmt: skip
        self.final = _Unit(spec, "final", lambda p, h, labels: model.head_loss(p, h, labels, cfg, s, comm))

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for block in self.layers:
            h = block(h, cos, sin)
        return self.final(h, labels)


def _capacity(spec: WorkloadSpec) -> int:
    cfg = spec.model
    return model.moe_capacity(spec.batch * spec.seq_len, cfg, spec.capacity_factor) if cfg.is_moe else 0


def _check(spec: WorkloadSpec, optimizer: str) -> None:
    if spec.plan.parallel != "fsdp" or not spec.train:
        raise ValueError(f"parallel={spec.plan.parallel!r}, mode={spec.mode!r}: the memory peer runs FSDP training "
                         "steps (parallel='fsdp', mode='train')")  # fmt: skip
    if spec.float8 != "none":
        raise ValueError(f"float8={spec.float8!r}: the memory peer runs bf16 linears (float8='none')")
    if optimizer not in OPTIMIZERS:
        raise ValueError(f"optimizer={optimizer!r}: expected one of {', '.join(OPTIMIZERS)}")


def torch_fsdp_peak(spec: WorkloadSpec, optimizer: str = "adamw") -> TorchMemoryPeak:
    """FSDPMemTracker's peak memory of rank 0 of ``spec`` (a zoo FSDP training step: ``workloads.resolve(...,
    parallel="fsdp")``) over the forward and backward of a second iteration, the optimizer state of the first held
    (``optimizer``: ``"adamw"``, ``"adamw-fused"`` or ``"none"``). Initialises the fake process group for the call
    (none may be initialised already at another world size). One-line ValueError for a step the peer does not
    run."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

    from commsched.frontends.fake_pg import fake_process_group

    _check(spec, optimizer)
    with fake_process_group(spec.plan.world_size):
        mesh = init_device_mesh("cpu", (spec.plan.world_size,))  # outside fake mode: the mesh reads real ranks
        with FakeTensorMode():
            net = _Llama(spec)
            policy = MixedPrecisionPolicy(param_dtype=spec.dtype, reduce_dtype=spec.reduce_dtype)
            for unit in (net.embed, *net.layers):
                fully_shard(unit, mesh=mesh, mp_policy=policy, reshard_after_forward=spec.reshard_after_forward)
            fully_shard(net.final, mesh=mesh, mp_policy=policy, reshard_after_forward=False)  # as the zoo's source
            fully_shard(net, mesh=mesh, mp_policy=policy)
            opt = torch.optim.AdamW(net.parameters(), lr=1e-4) if optimizer == "adamw" else None
            inputs = _inputs(spec)
            if opt is not None:  # a first iteration, untracked, creates the optimizer state
                net(*inputs).backward()
                opt.step()
                opt.zero_grad(set_to_none=True)
            tracker = FSDPMemTracker(net, opt)
            tracker.track_inputs(inputs)
            with tracker:
                net(*inputs).backward()
            snapshot = next(iter(tracker.get_tracker_snapshot("peak").values()))
    at_peak = {CATEGORIES[getattr(k, "value", k)]: int(v) for k, v in snapshot.items() if k != "Total"}
    return TorchMemoryPeak(peak_bytes=int(snapshot["Total"]), at_peak_bytes=at_peak)


def _inputs(spec: WorkloadSpec) -> tuple[torch.Tensor, ...]:
    """tokens, labels and the RoPE tables (empty: under fake mode only the shapes matter)."""
    shape, table = (spec.batch, spec.seq_len), (spec.seq_len, 1, spec.model.head_dim)
    return (torch.zeros(shape, dtype=torch.int64), torch.zeros(shape, dtype=torch.int64),
            torch.empty(table, dtype=spec.dtype), torch.empty(table, dtype=spec.dtype))  # fmt: skip


def compare_peak(config: StepConfig) -> PeakComparison:
    """Our peak memory of ``config`` (an FSDP training step of :mod:`commsched.experiments.predict`) beside
    :func:`torch_fsdp_peak`'s, both over the forward and backward (the optimizer update left out, see the module
    docstring). Ours is what ``predict`` reports there: the step as ``predict`` traces it, in the ``framework``
    pass's order, under :mod:`commsched.memory.liveness`."""
    from commsched.experiments.predict import trace

    spec = config.resolve()
    _check(spec, config.optimizer)
    ours = framework_peak_bytes(trace(config).graph, optimizer=False)
    return PeakComparison(config, ours, torch_fsdp_peak(spec, config.optimizer))


def framework_peak_bytes(g: Any, *, optimizer: bool = True) -> int:
    """The peak memory of graph ``g`` in the ``framework`` pass's order (what ``predict`` simulates); with
    ``optimizer=False``, the peak before the optimizer update begins (the forward and backward)."""
    from commsched.ir.order import positions
    from commsched.memory import memory_profile
    from commsched.passes.baselines.framework import backward_end, framework_moves, order_by_moves

    order = np.arange(len(g), dtype=np.int32)
    late, early, moved = framework_moves(g, order)
    if moved:
        order = order_by_moves(g, late, early, positions(order))
    profile = memory_profile(g, order)
    return profile.peak_bytes if optimizer else int(profile.curve_bytes[: backward_end(g, order)].max())

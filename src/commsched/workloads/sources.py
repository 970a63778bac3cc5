"""Where the model's parameters come from, one FSDP unit (embedding, block, final norm + output) at a time.

``ParamSource.run(unit, fn, *args)`` hands ``fn`` the unit's compute-ready parameters (unsharded, in the compute
dtype) and returns its output; ``finalize(grads)`` turns the gradients autograd produced for the stored tensors into
the gradients the optimizer would see (after DDP buckets, the sequence-parallel norm all_reduce, ...).

FSDP follows FSDP2: before a unit's forward its parameters are all-gathered (one collective per parameter, or one
per unit with ``bucket="block"`` as ``fully_shard`` packs them); the gathered parameters are released after the
unit's forward and gathered again when the gradient of the unit's output arrives (``reshard_after_forward``); the
gradient of each gathered parameter is reduce-scattered in ``reduce_dtype`` and divided by the FSDP degree. The
release is made real with saved-tensor hooks: autograd saves a token instead of the gathered weight, and the backward
reads the re-gathered copy, so the traced graph's data dependencies are those of FSDP2.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

import torch
from torch.autograd import Function
from torch.multiprocessing.reductions import StorageWeakRef

from commsched.workloads.collectives import (
    DDPBuckets,
    Group,
    all_gather,
    all_reduce,
    autograd_pair,
    identity_view,
    reduce_scatter,
)
from commsched.workloads.params import ParamInfo


class ParamSource:
    """Replicated parameters (DDP, TP, EP, inference): cast to the compute dtype, gradients optionally bucketed."""

    def __init__(
        self,
        layout: Sequence[ParamInfo],
        params: Sequence[torch.Tensor],
        *,
        compute_dtype: torch.dtype,
        reduce_dtype: torch.dtype,
        train: bool,
        buckets: Sequence[DDPBuckets] = (),
        sp_group: Group | None = None,
        expert_grad_scale: float = 1.0,
    ) -> None:
        self.layout, self.params = list(layout), list(params)
        # Under expert parallelism an expert's local gradient already sums the losses of its whole EP group; the
        # average over all ranks divides that by the EP degree here and by the replicas in the bucket all_reduce.
        self.grad_scale = {pid: expert_grad_scale for pid, p in enumerate(self.layout) if p.expert}
        self.compute_dtype, self.reduce_dtype, self.train = compute_dtype, reduce_dtype, train
        self.buckets = list(buckets)
        self.sp_group = sp_group
        self.units: dict[str, list[int]] = {}
        for pid, p in enumerate(self.layout):
            self.units.setdefault(p.unit, []).append(pid)

    def run(self, unit: str, fn: Callable[..., Any], *args: Any) -> Any:
        params = {self.layout[pid].key: self._compute_param(pid) for pid in self.units[unit]}
        return fn(params, *args)

    def _compute_param(self, pid: int) -> torch.Tensor:
        p = self.params[pid]
        if not self.train:
            return p if p.dtype == self.compute_dtype else p.to(self.compute_dtype)
        return _GradTap.apply(p, self, pid)

    def grad_ready(self, pid: int, grad: torch.Tensor) -> torch.Tensor:
        scale = self.grad_scale.get(pid, 1.0)
        if scale != 1.0:
            grad = grad * scale
        for b in self.buckets:
            if b.owns(pid):
                b.grad_ready(pid, grad)
        return grad

    def finalize(self, grads: Sequence[torch.Tensor]) -> list[torch.Tensor]:
        out = list(grads)
        for b in self.buckets:
            b.finish()
            for pid, g in b.reduced.items():
                out[pid] = g
        return self._sp_norm_all_reduce(out)

    def _sp_norm_all_reduce(self, grads: list[torch.Tensor]) -> list[torch.Tensor]:
        # Megatron: with sequence parallelism each TP rank holds a partial gradient of the replicated norm weights;
        # one all_reduce of their concatenation completes them.
        pids = [pid for pid, p in enumerate(self.layout) if p.sp_partial]
        if self.sp_group is None or not pids:
            return grads
        flat = all_reduce(torch.cat([grads[pid].reshape(-1) for pid in pids]), self.sp_group)
        for pid, piece in zip(pids, flat.split([grads[pid].numel() for pid in pids]), strict=True):
            grads[pid] = piece.view(grads[pid].shape)
        return grads


class _GradTap(Function):
    """Cast a stored parameter to the compute dtype; in backward, hand its gradient (in the reduce dtype) to the
    DDP buckets as autograd's AccumulateGrad hook does in DDP."""

    @staticmethod
    def forward(ctx, p, source, pid):
        ctx.source, ctx.pid = source, pid
        return p.to(source.compute_dtype) if p.dtype != source.compute_dtype else p.view_as(p)

    @staticmethod
    def backward(ctx, g):
        g = g.to(ctx.source.reduce_dtype) if g.dtype != ctx.source.reduce_dtype else g
        return ctx.source.grad_ready(ctx.pid, g), None, None


class FSDPSource(ParamSource):
    """FSDP2 over ``group``: see the module docstring. ``reshard(unit)`` says whether a unit is re-gathered in
    backward (FSDP2 keeps the final norm + output unsharded after forward, as torchtitan configures it)."""

    def __init__(
        self,
        layout: Sequence[ParamInfo],
        params: Sequence[torch.Tensor],
        *,
        group: Group,
        compute_dtype: torch.dtype,
        reduce_dtype: torch.dtype,
        bucket: str = "param",
        reshard: Callable[[str], bool] = lambda unit: unit != "final",
        sp_group: Group | None = None,
    ) -> None:
        super().__init__(
            layout, params, compute_dtype=compute_dtype, reduce_dtype=reduce_dtype, train=True, sp_group=sp_group
        )
        if bucket not in ("param", "block"):
            raise ValueError(f"fsdp_bucket={bucket!r}: expected 'param' or 'block'")
        self.group, self.bucket, self.reshard = group, bucket, reshard
        self.regathered: dict[int, torch.Tensor] = {}

    # -------------------------------------------------------------- gathering
    def _gather(self, pids: list[int]) -> list[torch.Tensor]:
        """Unsharded compute-dtype parameters of ``pids`` (no autograd)."""
        shards = [self.params[pid].detach().to(self.compute_dtype) for pid in pids]
        if self.bucket == "param":
            return [self._unpad(pid, all_gather(s, self.group)) for pid, s in zip(pids, shards, strict=True)]
        # FSDP2 copy-in / copy-out: one flat all_gather, then each parameter copied out of the [world, total] layout
        flat = all_gather(torch.cat([s.reshape(-1) for s in shards]), self.group).view(self.group.size, -1)
        sizes = [s.numel() for s in shards]
        pieces = torch.split_with_sizes_copy(flat, sizes, dim=1)
        return [
            self._unpad(pid, piece.view(-1, *self.layout[pid].shard_shape[1:]))
            for pid, piece in zip(pids, pieces, strict=True)
        ]

    def _unpad(self, pid: int, full: torch.Tensor) -> torch.Tensor:
        rows = self.layout[pid].local_shape[0]
        return full if full.shape[0] == rows else full.narrow(0, 0, rows)

    def _reduce(self, pids: list[int], grads: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """Reduce-scatter unsharded gradients into gradient shards in the reduce dtype."""
        padded = []
        for pid, g in zip(pids, grads, strict=True):
            info = self.layout[pid]
            if g is None:
                g = torch.zeros(info.local_shape, dtype=self.reduce_dtype)
            g = g.to(self.reduce_dtype)
            if info.fsdp_pad_rows:
                g = torch.cat([g, g.new_zeros(info.fsdp_pad_rows, *g.shape[1:])])
            padded.append(g)
        if self.bucket == "param":
            return [reduce_scatter(g, self.group) / self.group.size for g in padded]
        world = self.group.size
        flat = torch.cat([g.reshape(world, -1) for g in padded], dim=1).reshape(-1)
        shard = reduce_scatter(flat, self.group) / world
        sizes = [self.params[pid].numel() for pid in pids]
        return [s.view(self.params[pid].shape) for pid, s in zip(pids, shard.split(sizes), strict=True)]

    # -------------------------------------------------------------- units
    def run(self, unit: str, fn: Callable[..., Any], *args: Any) -> Any:
        pids = self.units[unit]
        gathered = _FSDPUnshard.apply(self, pids, *[self.params[pid] for pid in pids])
        params = {self.layout[pid].key: t for pid, t in zip(pids, gathered, strict=True)}
        if not self.reshard(unit):
            return fn(params, *args)
        keys = {StorageWeakRef(t.untyped_storage()): (pid, t) for pid, t in zip(pids, gathered, strict=True)}

        def pack(t: torch.Tensor) -> Any:
            hit = keys.get(StorageWeakRef(t.untyped_storage()))
            if hit is None:
                return t
            pid, base = hit
            return _Released(pid, base, t)

        def unpack(saved: Any) -> torch.Tensor:
            if not isinstance(saved, _Released):
                return saved
            if saved.pid not in self.regathered:
                self._pre_backward(pids)
            return saved.rebuild(self.regathered[saved.pid])

        with torch.autograd.graph.saved_tensors_hooks(pack, unpack):
            out = fn(params, *args)
        if not isinstance(out, torch.Tensor) or not out.requires_grad:
            return out
        return _PreBackward.apply(out, lambda: self._pre_backward(pids))

    def _pre_backward(self, pids: list[int]) -> None:
        todo = [pid for pid in pids if pid not in self.regathered]
        if todo:
            self.regathered.update(zip(todo, self._gather(todo), strict=True))


class _Released:
    """A saved tensor that aliased a gathered parameter; rebuilt from the re-gathered copy in backward."""

    __slots__ = ("how", "offset", "pid", "shape", "stride")

    def __init__(self, pid: int, base: torch.Tensor, t: torch.Tensor) -> None:
        self.pid, self.shape, self.stride = pid, tuple(t.shape), tuple(t.stride())
        self.offset = t.storage_offset() - base.storage_offset()
        if self.offset == 0 and self.shape == tuple(base.shape) and self.stride == tuple(base.stride()):
            self.how = "same"
        elif (
            self.offset == 0
            and base.dim() == 2
            and self.shape == tuple(base.shape)[::-1]
            and self.stride == tuple(base.stride())[::-1]
        ):
            self.how = "t"
        else:
            self.how = "strided"

    def rebuild(self, full: torch.Tensor) -> torch.Tensor:
        if self.how == "same":
            return full
        if self.how == "t":
            return full.t()
        return full.as_strided(self.shape, self.stride, full.storage_offset() + self.offset)


class _FSDPUnshard(Function):
    """All-gather a unit's parameter shards (cast to the compute dtype first, as FSDP2's mixed precision does);
    backward reduce-scatters the unsharded gradients."""

    @staticmethod
    def forward(ctx, source, pids, *shards):
        ctx.source, ctx.pids = source, pids
        return tuple(source._gather(pids))

    @staticmethod
    def backward(ctx, *grads):
        return (None, None, *ctx.source._reduce(ctx.pids, list(grads)))


def _run_hook(grad: torch.Tensor, hook: Callable[[], None]) -> torch.Tensor:
    hook()
    return grad


_PreBackward = autograd_pair("_PreBackward", identity_view, _run_hook)  # FSDP2's pre-backward unshard of a unit

"""Where the model's parameters come from, one FSDP unit (embedding, block, final norm + output) at a time.

``ParamSource.run(unit, fn, *args)`` hands ``fn`` the unit's compute-ready parameters (unsharded, in the compute
dtype) and returns its output; ``finalize(grads)`` turns the gradients autograd produced for the stored tensors into
the gradients the optimizer would see (after DDP buckets, the sequence-parallel norm all_reduce, ...).

FSDP follows FSDP2: before a unit's forward its parameters are all-gathered (one collective per parameter, or one
per unit with ``bucket="block"`` as ``fully_shard`` packs them); the gathered parameters are released after the
unit's forward and gathered again when the gradient of the unit's output arrives (``reshard_after_forward``); the
gradient of each gathered parameter is reduce-scattered in ``reduce_dtype`` and divided by the FSDP degree; under
HSDP (``replicate_group``) each reduce-scattered shard (one flat shard per unit with ``bucket="block"``) is then
all-reduced over the replicate group and divided by its size, as FSDP2's ``foreach_reduce`` does
(``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py`` in torch 2.13: ``reduce_scatter`` on the shard group,
then ``all_reduce`` of ``reduce_output`` on the replicate group; FSDP2 averages with ``ReduceOp.AVG``, the zoo sums
and divides, as for every reduction). The release is made real with saved-tensor hooks: autograd saves a token
instead of the gathered weight, and the backward reads the re-gathered copy, so the traced graph's data dependencies
are those of FSDP2. With ``reshard_after_forward=False`` (:func:`reshard_policy`) no unit is re-gathered: each unit's
gathered parameters are held until its backward ends (FSDP2's ``post_backward``), and a checkpointed block's
recompute reads them.

Float8 training (:mod:`commsched.workloads.float8`): the weights of the float8 linears reach the model as
:class:`~commsched.workloads.float8.Float8Weight`; with FSDP's float8 all_gather (``float8_all_gather``) each such
shard is cast to float8 with the scale computed at the start of the step (:meth:`FSDPSource.start_step`) and
gathered as one byte per element (as ``uint8``: gloo has no float8 type); a unit of mixed dtypes is gathered as
bytes as FSDP2 does (``torch/distributed/fsdp/_fully_shard/_fsdp_collectives.py``,
``_get_all_gather_input_metadatas``).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Sequence
from typing import TYPE_CHECKING, Any

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
from commsched.workloads.float8 import Float8Weight, Recipe, precompute_scales, to_float8
from commsched.workloads.params import ParamInfo
from commsched.workloads.tags import FLOAT8, tagged

if TYPE_CHECKING:
    from commsched.workloads.ac import Checkpoint


class _Same:
    """The default of ``FSDPSource(expert_group=...)``: expert weights share the dense group."""


_SAME = _Same()


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
        float8: Recipe | None = None,
        float8_pids: frozenset[int] = frozenset(),
    ) -> None:
        self.layout, self.params = list(layout), list(params)
        # the parameters that are float8 linears' weights (float8 training), and the recipe
        self.float8, self.float8_pids = float8, (float8_pids if float8 is not None else frozenset())
        # Under expert parallelism an expert's local gradient already sums the losses of its whole EP group; the
        # average over all ranks divides that by the EP degree here and by the replicas in the bucket all_reduce.
        self.grad_scale = {pid: expert_grad_scale for pid, p in enumerate(self.layout) if p.expert}
        self.compute_dtype, self.reduce_dtype, self.train = compute_dtype, reduce_dtype, train
        self.buckets = list(buckets)
        self.sp_group = sp_group
        self.units: dict[str, list[int]] = {}
        for pid, p in enumerate(self.layout):
            self.units.setdefault(p.unit, []).append(pid)

    def run(self, unit: str, fn: Callable[..., Any], *args: Any, checkpoint: Checkpoint | None = None) -> Any:
        """``fn(params, *args)`` with the unit's compute-ready parameters. ``checkpoint`` (activation
        checkpointing, :mod:`commsched.workloads.ac`): the parameter fetch and ``fn`` run under it, so the
        backward recomputes both (FSDP: re-gathers the unit, as FSDP2 does before a checkpointed block)."""
        if checkpoint is None:
            return self._run(unit, fn, *args)
        return checkpoint(functools.partial(self._run, unit, fn, checkpointed=True), *args)

    def start_step(self) -> None:
        """What runs once before the step's first unit (FSDP's float8 scales); nothing here."""

    def _run(self, unit: str, fn: Callable[..., Any], *args: Any, checkpointed: bool = False) -> Any:
        params = {self.layout[pid].key: self._weight(pid, self._compute_param(pid)) for pid in self.units[unit]}
        return fn(params, *args)

    def _weight(self, pid: int, t: torch.Tensor) -> Any:
        """A compute-ready parameter as the model takes it: a float8 linear's wrapped, every other as is."""
        return Float8Weight(t, self.float8) if pid in self.float8_pids else t

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


def _reshard_but_final(unit: str) -> bool:
    return unit != "final"


def _keep_gathered(unit: str) -> bool:
    return False


def reshard_policy(after_forward: bool) -> Callable[[str], bool]:
    """Which units FSDP2 re-gathers in backward (``FSDPSource(reshard=...)``): with ``reshard_after_forward`` every
    unit but the final norm + output (torchtitan's ``fully_shard(model, reshard_after_forward=False)`` on the root
    keeps them); without it none (``fsdp_reshard_after_forward = "never"``: every gathered unit held until its
    backward, which gathers nothing)."""
    return _reshard_but_final if after_forward else _keep_gathered


class FSDPSource(ParamSource):
    """FSDP2 over ``group`` (expert weights over ``expert_group`` when given; ``None`` there: experts not sharded):
    see the module docstring. ``reshard(unit)`` says whether a unit is re-gathered in backward (FSDP2 keeps the final
    norm + output unsharded after forward, as torchtitan configures it; :func:`reshard_policy`). ``hold_gathered``:
    a unit not resharded keeps its gathered parameters until its backward ends, as FSDP2 does, even those its
    backward does not read (off by default: the final unit's backward reads all of its weights anyway)."""

    def __init__(
        self,
        layout: Sequence[ParamInfo],
        params: Sequence[torch.Tensor],
        *,
        group: Group,
        compute_dtype: torch.dtype,
        reduce_dtype: torch.dtype,
        bucket: str = "param",
        reshard: Callable[[str], bool] = _reshard_but_final,
        hold_gathered: bool = False,
        sp_group: Group | None = None,
        expert_group: Group | _Same | None = _SAME,
        expert_grad_scale: float = 1.0,
        float8: Recipe | None = None,
        float8_pids: frozenset[int] = frozenset(),
        float8_all_gather: bool = False,
        replicate_group: Group | None = None,
        tp_group: Group | None = None,
    ) -> None:
        super().__init__(
            layout,
            params,
            compute_dtype=compute_dtype,
            reduce_dtype=reduce_dtype,
            train=True,
            sp_group=sp_group,
            expert_grad_scale=expert_grad_scale,
            float8=float8,
            float8_pids=float8_pids,
        )
        if bucket not in ("param", "block"):
            raise ValueError(f"fsdp_bucket={bucket!r}: expected 'param' or 'block'")
        self.bucket, self.reshard, self.hold_gathered = bucket, reshard, hold_gathered
        self.replicate_group = replicate_group  # HSDP: the reduced shards are all-reduced over it
        expert = group if isinstance(expert_group, _Same) else expert_group
        self.group_of = [expert if p.expert else group for p in self.layout]
        self.regathered: dict[int, torch.Tensor] = {}
        # units kept gathered: parameters their backward does not read, read by _FSDPUnshard's backward
        self.held_to_backward: dict[tuple[int, ...], list[torch.Tensor]] = {}
        # FSDP's float8 all_gather (torchao enable_fsdp_float8_all_gather): these shards are gathered in float8
        # with the scales start_step computes
        self.float8_gathered = frozenset(
            pid for pid in self.float8_pids if float8_all_gather and self.group_of[pid] is not None
        )
        self.float8_scales: dict[int, torch.Tensor] = {}
        self.tp_group = tp_group  # FSDP+TP: the float8 weights' amaxes are all-reduced over it too

    def start_step(self) -> None:
        """With the float8 all_gather: every float8 weight's scale, as torchao's
        ``precompute_float8_dynamic_scale_for_fsdp`` computes them after the optimizer step (one all_reduce of
        the stacked amaxes over the FSDP group; under FSDP+TP a second over the TP group, as DTensor reduces a
        ``Partial`` on each mesh dimension)."""
        pids = sorted(self.float8_gathered)
        if not pids:
            return
        groups = {self.group_of[pid].name: self.group_of[pid] for pid in pids}
        if len(groups) != 1:
            raise ValueError(f"float8 all_gather: the float8 weights span FSDP groups {sorted(groups)}")
        group = next(iter(groups.values()))
        tp = self.tp_group

        def reduce_max(t: torch.Tensor) -> torch.Tensor:
            t = all_reduce(t, group, "max")
            return t if tp is None else all_reduce(t, tp, "max")

        with tagged(FLOAT8):
            scales = precompute_scales([self.params[pid] for pid in pids], reduce_max)
        self.float8_scales = {pid: scales[k] for k, pid in enumerate(pids)}

    def _by_group(self, pids: list[int]) -> list[tuple[Group | None, list[int]]]:
        """``pids`` split by FSDP group, in first-use order."""
        out: dict[str | None, tuple[Group | None, list[int]]] = {}
        for pid in pids:
            g = self.group_of[pid]
            out.setdefault(None if g is None else g.name, (g, []))[1].append(pid)
        return list(out.values())

    # -------------------------------------------------------------- gathering
    def _gather(self, pids: list[int]) -> list[torch.Tensor]:
        """Unsharded compute-dtype parameters of ``pids`` (no autograd): one all_gather per parameter, or with
        ``bucket="block"`` one flat all_gather per FSDP group of the unit."""
        if self.float8_gathered.intersection(pids):
            shards = {pid: self._gather_input(pid) for pid in pids}
        else:
            shards = {pid: self.params[pid].detach().to(self.compute_dtype) for pid in pids}
        if self.bucket == "param":
            return [self._gather_param(pid, shards[pid]) for pid in pids]
        got: dict[int, torch.Tensor] = {}
        for group, members in self._by_group(pids):
            got.update(zip(members, self._gather_flat(members, [shards[pid] for pid in members], group), strict=True))
        return [got[pid] for pid in pids]

    def _gather_input(self, pid: int) -> torch.Tensor:
        """What a parameter's all_gather sends: its shard in the compute dtype, or (float8 all_gather) cast to
        float8 with its precomputed scale (torchao ``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``)."""
        shard = self.params[pid].detach()
        if pid in self.float8_gathered:
            with tagged(FLOAT8):
                return to_float8(shard, self.float8_scales[pid], self.float8.weight_dtype)
        return shard.to(self.compute_dtype)

    def _gather_param(self, pid: int, shard: torch.Tensor) -> torch.Tensor:
        group = self.group_of[pid]
        if group is None:
            return shard
        if pid in self.float8_gathered:  # as bytes: gloo has no float8 type (NCCL moves float8 as bytes too)
            return self._unshard(pid, all_gather(shard.view(torch.uint8), group).view(shard.dtype), group.size)
        return self._unshard(pid, all_gather(shard, group), group.size)

    def _gather_flat(self, pids: list[int], shards: list[torch.Tensor], group: Group | None) -> list[torch.Tensor]:
        if group is None:
            return shards
        # FSDP2 copy-in / copy-out: one flat all_gather, then each parameter copied out of the [world, total] layout
        if len({s.dtype for s in shards}) > 1:
            return self._gather_bytes(pids, shards, group)
        flat = all_gather(torch.cat([s.reshape(-1) for s in shards]), group).view(group.size, -1)
        sizes = [s.numel() for s in shards]
        pieces = torch.split_with_sizes_copy(flat, sizes, dim=1)
        return [
            self._unshard(pid, piece.view(-1, *self.layout[pid].shard_shape[1:]), group.size)
            for pid, piece in zip(pids, pieces, strict=True)
        ]

    def _gather_bytes(self, pids: list[int], shards: list[torch.Tensor], group: Group) -> list[torch.Tensor]:
        """The flat all_gather of shards of several dtypes (float8 weights, compute-dtype norms), as FSDP2 runs
        it: every shard viewed as bytes, gathered as ``uint8``, each copied out and viewed back."""
        raw = [s.reshape(-1).view(torch.uint8) for s in shards]
        flat = all_gather(torch.cat(raw), group).view(group.size, -1)
        pieces = torch.split_with_sizes_copy(flat, [r.numel() for r in raw], dim=1)
        return [
            self._unshard(pid, piece.view(s.dtype).view(-1, *self.layout[pid].shard_shape[1:]), group.size)
            for pid, s, piece in zip(pids, shards, pieces, strict=True)
        ]

    def _unshard(self, pid: int, gathered: torch.Tensor, world: int) -> torch.Tensor:
        """The local tensor from its shards concatenated on dim 0: padding dropped, or dim-1 shards put back."""
        info = self.layout[pid]
        if info.fsdp_shard_dim == 1:
            parts = gathered.view(world, *info.shard_shape).movedim(0, 1)
            return parts.reshape(info.local_shape)
        rows = info.local_shape[0]
        return gathered if gathered.shape[0] == rows else gathered.narrow(0, 0, rows)

    def _reduce(self, pids: list[int], grads: list[torch.Tensor | None]) -> list[torch.Tensor]:
        """Reduce-scatter unsharded gradients into gradient shards in the reduce dtype."""
        laid_out = {pid: self._shard_major(pid, g) for pid, g in zip(pids, grads, strict=True)}
        if self.bucket == "param":
            got = {pid: self._reduce_param(pid, laid_out[pid].to(self.reduce_dtype)) for pid in pids}
        else:
            got = {}
            for group, members in self._by_group(pids):
                shards = self._reduce_flat(members, [laid_out[pid] for pid in members], group)
                got.update(zip(members, shards, strict=True))
        for pid in pids:
            scale = self.grad_scale.get(pid, 1.0)  # experts under fsdp+ep: 1 / ep (see ParamSource)
            if scale != 1.0:
                got[pid] = got[pid] * scale
        return [got[pid] for pid in pids]

    def _reduce_param(self, pid: int, g: torch.Tensor) -> torch.Tensor:
        group = self.group_of[pid]
        return g if group is None else self._replicate(reduce_scatter(g, group) / group.size)

    def _replicate(self, shard: torch.Tensor) -> torch.Tensor:
        """HSDP: the mean of a reduced gradient shard over the replicate group (the shard itself without HSDP)."""
        r = self.replicate_group
        return shard if r is None else all_reduce(shard, r) / r.size

    def _reduce_flat(self, pids: list[int], grads: list[torch.Tensor], group: Group | None) -> list[torch.Tensor]:
        if group is None:
            return [g.to(self.reduce_dtype) for g in grads]
        world = group.size
        # FSDP2's copy-in (foreach_reduce_scatter_copy_in: chunk_cat into a reduce-dtype buffer): the buffer is
        # allocated once the gradients exist (new_empty of one: after them in the order) and each gradient is cast
        # as it is copied in, so no reduce-dtype copy of a gradient is ever held beside the buffer
        flat = grads[0].new_empty((world, sum(g.numel() // world for g in grads)), dtype=self.reduce_dtype)
        start = 0
        for g in grads:
            width = g.numel() // world
            flat[:, start : start + width].copy_(g.reshape(world, width))
            start += width
        shard = self._replicate(reduce_scatter(flat.reshape(-1), group) / world)
        sizes = [self.params[pid].numel() for pid in pids]
        return [s.view(self.params[pid].shape) for pid, s in zip(pids, shard.split(sizes), strict=True)]

    def _shard_major(self, pid: int, g: torch.Tensor | None) -> torch.Tensor:
        """An unsharded gradient (in its own dtype; zeros in the compute dtype for a missing one), laid out so that
        shard ``i`` is its ``i``-th slice of dim 0."""
        info = self.layout[pid]
        g = torch.zeros(info.local_shape, dtype=self.compute_dtype) if g is None else g
        group = self.group_of[pid]
        if info.fsdp_shard_dim == 1 and group is not None:
            split = g.view(info.local_shape[0], group.size, *info.shard_shape[1:]).movedim(1, 0)
            return split.reshape(group.size * info.shard_shape[0], *info.shard_shape[1:])
        if info.fsdp_pad_rows:
            g = torch.cat([g, g.new_zeros(info.fsdp_pad_rows, *g.shape[1:])])
        return g

    # -------------------------------------------------------------- units
    def run(self, unit: str, fn: Callable[..., Any], *args: Any, checkpoint: Checkpoint | None = None) -> Any:
        """As :meth:`ParamSource.run`; a unit kept gathered (not resharded) is gathered once, outside the
        checkpoint, and its recompute reads the held parameters (FSDP2 re-gathers only resharded units)."""
        if checkpoint is None or self.reshard(unit):
            return super().run(unit, fn, *args, checkpoint=checkpoint)
        params, held = self._gathered_unit(unit)
        return checkpoint(functools.partial(self._kept, unit, fn, params, held), *args)

    def _gathered_unit(self, unit: str) -> tuple[dict[str, Any], list[torch.Tensor]]:
        """The unit's gathered parameters as the model takes them, and the tensors that hold their memory."""
        pids = self.units[unit]
        out = _FSDPUnshard.apply(self, pids, *[self.params[pid] for pid in pids])
        gathered = list(out[: len(pids)])
        data = dict(zip([pid for pid in pids if pid in self.float8_gathered], out[len(pids) :], strict=True))
        params = {self.layout[pid].key: self._weight(pid, t, data.get(pid)) for pid, t in zip(pids, gathered,
                                                                                             strict=True)}  # fmt: skip
        return params, [data.get(pid, t) for pid, t in zip(pids, gathered, strict=True)]

    def _kept(self, unit: str, fn: Callable[..., Any], params: dict[str, Any], held: list[torch.Tensor],
              *args: Any) -> Any:  # fmt: skip
        """``fn`` on a unit that is not resharded. FSDP2 frees its gathered parameters after the unit's backward
        (``post_backward``); with ``hold_gathered`` they are read there (:class:`_FSDPUnshard`'s backward), so
        those the backward does not read anyway (the embedding's weight) live as long."""
        if self.hold_gathered and torch.is_grad_enabled():
            self.held_to_backward[tuple(self.units[unit])] = held
        return fn(params, *args)

    def _run(self, unit: str, fn: Callable[..., Any], *args: Any, checkpointed: bool = False) -> Any:
        pids = self.units[unit]
        params, held = self._gathered_unit(unit)
        if checkpointed:  # the recompute re-gathers, nothing is saved
            return fn(params, *args)
        if not self.reshard(unit):
            return self._kept(unit, fn, params, held, *args)
        keys = {StorageWeakRef(t.untyped_storage()): (pid, t) for pid, t in zip(pids, held, strict=True)}

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

    def _weight(self, pid: int, t: torch.Tensor, data: torch.Tensor | None = None) -> Any:
        """A gathered parameter as the model takes it; a float8-gathered weight: its float8 ``data`` and scale,
        ``t`` the stand-in that carries its gradient (:class:`_FSDPUnshard`)."""
        if data is None:
            return super()._weight(pid, t)
        return Float8Weight(t, self.float8, data=data, scale=self.float8_scales[pid])

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
    backward reduce-scatters the unsharded gradients.

    A float8-gathered weight's float8 tensor is no differentiable output (a gradient of its dtype would be cast to
    float8): it comes after the unit's outputs, marked non-differentiable, and its place among them holds a
    stand-in of the weight's shape and compute dtype (an expanded scalar: no memory) that carries the weight's
    gradient back here."""

    @staticmethod
    def forward(ctx, source, pids, *shards):
        ctx.source, ctx.pids = source, pids
        gathered = source._gather(pids)
        data = [t for pid, t in zip(pids, gathered, strict=True) if pid in source.float8_gathered]
        if not data:
            return tuple(gathered)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(*data)
        stand_in = [
            t.new_empty((), dtype=source.compute_dtype).expand(t.shape) if pid in source.float8_gathered else t
            for pid, t in zip(pids, gathered, strict=True)
        ]
        return (*stand_in, *data)

    @staticmethod
    def backward(ctx, *grads):
        for t in ctx.source.held_to_backward.pop(tuple(ctx.pids), ()):
            t.view_as(t)  # FSDP2's post_backward frees the unit's unsharded parameters: read here, they live as long
        return (None, None, *ctx.source._reduce(ctx.pids, list(grads[: len(ctx.pids)])))


def _run_hook(grad: torch.Tensor, hook: Callable[[], None]) -> torch.Tensor:
    hook()
    return grad


_PreBackward = autograd_pair("_PreBackward", identity_view, _run_hook)  # FSDP2's pre-backward unshard of a unit

"""Collectives of the zoo models, written with ``torch.ops._c10d_functional`` so that ``make_fx`` records them.

Each parallel primitive is an autograd Function with an explicit backward, so the traced joint graph holds exactly
the collectives the imitated system issues (Megatron's f / g operators, sequence-parallel gather / scatter, MoE
all_to_all, DDP gradient buckets). The same code runs on a real process group (gloo, NCCL).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable, Sequence

import torch
from torch.autograd import Function

c10d = torch.ops._c10d_functional


@dataclasses.dataclass(frozen=True, slots=True)
class Group:
    """One process group as the model code needs it: name (for the functional ops), size, own index in it."""

    name: str
    size: int
    rank: int = 0

    @classmethod
    def of(cls, pg, global_rank: int) -> Group:
        import torch.distributed as dist

        ranks = dist.get_process_group_ranks(pg)
        return cls(name=pg.group_name, size=len(ranks), rank=ranks.index(global_rank))


# ---------------------------------------------------------------------- plain (non-autograd) helpers
def all_reduce(x: torch.Tensor, group: Group, op: str = "sum") -> torch.Tensor:
    return c10d.wait_tensor(c10d.all_reduce(x, op, group.name))


def all_gather(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Concatenate every rank's ``x`` along dim 0."""
    return c10d.wait_tensor(c10d.all_gather_into_tensor(x.contiguous(), group.size, group.name))


def reduce_scatter(x: torch.Tensor, group: Group, op: str = "sum") -> torch.Tensor:
    """Sum over ranks, then keep this rank's 1/size of dim 0."""
    return c10d.wait_tensor(c10d.reduce_scatter_tensor(x.contiguous(), op, group.size, group.name))


def all_to_all(x: torch.Tensor, group: Group) -> torch.Tensor:
    """Equal splits of dim 0: chunk j goes to rank j, chunk j of the result came from rank j."""
    splits = [x.shape[0] // group.size] * group.size
    return c10d.wait_tensor(c10d.all_to_all_single(x.contiguous(), splits, splits, group.name))


# ---------------------------------------------------------------------- autograd primitives
def autograd_pair(name: str, forward: Callable, backward: Callable) -> type[Function]:
    """An autograd Function ``name`` computing ``forward(x, arg)`` whose gradient is ``backward(grad, arg)``: the
    one shape of every parallel primitive (Megatron's f and g, sequence gather / scatter, MoE all_to_all)."""

    def forward_fn(ctx, x, arg):
        ctx.arg = arg
        return forward(x, arg)

    def backward_fn(ctx, grad):
        return backward(grad, ctx.arg), None

    doc = f"{forward.__name__} forward, {backward.__name__} of the gradient backward"
    return type(
        name, (Function,), {"__doc__": doc, "forward": staticmethod(forward_fn), "backward": staticmethod(backward_fn)}
    )


def identity_view(x: torch.Tensor, _arg: object = None) -> torch.Tensor:
    """The identity as a new view (an autograd Function's forward must not return its input itself)."""
    return x.view_as(x)


def identity(grad: torch.Tensor, _arg: object = None) -> torch.Tensor:
    return grad


_CopyToTP = autograd_pair("_CopyToTP", identity_view, all_reduce)  # Megatron f
_ReduceFromTP = autograd_pair("_ReduceFromTP", all_reduce, identity)  # Megatron g
_GatherSeq = autograd_pair("_GatherSeq", all_gather, reduce_scatter)  # sequence parallel: gather the tokens
_ScatterSeq = autograd_pair("_ScatterSeq", reduce_scatter, all_gather)  # sequence parallel: scatter the tokens
_AllToAll = autograd_pair("_AllToAll", all_to_all, all_to_all)  # MoE dispatch / combine, equal splits


@dataclasses.dataclass(frozen=True, slots=True)
class Comm:
    """The model's view of its parallel groups: tensor parallel (optionally sequence parallel), experts and context
    parallel (``cp``: ring attention, K/V rotated by ``cp_rotate``, :mod:`commsched.workloads.context_parallel`)."""

    tp: Group | None = None
    sp: bool = False
    ep: Group | None = None
    cp: Group | None = None
    cp_rotate: str = "allgather"

    def tp_in(self, x: torch.Tensor) -> torch.Tensor:
        """Enter a column-parallel region: f (TP) or all_gather of the sequence (SP)."""
        if self.tp is None:
            return x
        return _GatherSeq.apply(x, self.tp) if self.sp else _CopyToTP.apply(x, self.tp)

    def tp_out(self, x: torch.Tensor) -> torch.Tensor:
        """Leave a row-parallel region: g, an all_reduce (TP), or reduce_scatter of the sequence (SP)."""
        if self.tp is None:
            return x
        return _ScatterSeq.apply(x, self.tp) if self.sp else _ReduceFromTP.apply(x, self.tp)

    def gather_seq(self, x: torch.Tensor) -> torch.Tensor:
        """The whole sequence from SP shards (identity without SP)."""
        return _GatherSeq.apply(x, self.tp) if (self.tp is not None and self.sp) else x

    def all_to_all(self, x: torch.Tensor) -> torch.Tensor:
        return x if self.ep is None else _AllToAll.apply(x, self.ep)


class _VocabParallelCrossEntropy(Function):
    """Mean cross-entropy over logits split on the vocabulary (Megatron): three all_reduces of one value per token
    (max, sum of exp, target logit) in forward; backward is local (softmax minus one-hot)."""

    @staticmethod
    def forward(ctx, logits, labels, group, vocab_start, vocab_size):
        rows = logits.shape[-1]
        if vocab_start + rows > vocab_size:  # the last shard's padding rows are no words: leave them out
            pad = torch.arange(rows, device=logits.device) >= vocab_size - vocab_start
            logits = logits.masked_fill(pad, float("-inf"))
        local_max = logits.amax(dim=-1)
        global_max = all_reduce(local_max, group, "max")
        shifted = logits - global_max.unsqueeze(-1)
        local = labels - vocab_start
        outside = (local < 0) | (local >= rows)
        local = local.masked_fill(outside, 0)
        picked = shifted.gather(-1, local.unsqueeze(-1)).squeeze(-1).masked_fill(outside, 0.0)
        picked = all_reduce(picked, group)
        exp = shifted.exp()
        sum_exp = all_reduce(exp.sum(dim=-1), group)
        loss = (sum_exp.log() - picked).mean()
        softmax = exp / sum_exp.unsqueeze(-1)
        ctx.save_for_backward(softmax, local, outside)
        return loss

    @staticmethod
    def backward(ctx, g):
        softmax, local, outside = ctx.saved_tensors
        onehot = torch.zeros_like(softmax).scatter_(-1, local.unsqueeze(-1), (~outside).to(softmax.dtype).unsqueeze(-1))
        grad = (softmax - onehot) * (g / softmax.shape[0])
        return grad, None, None, None, None


def vocab_parallel_cross_entropy(
    logits: torch.Tensor, labels: torch.Tensor, group: Group, vocab_start: int, vocab_size: int
) -> torch.Tensor:
    return _VocabParallelCrossEntropy.apply(logits, labels, group, vocab_start, vocab_size)


# ---------------------------------------------------------------------- DDP gradient buckets
def ddp_buckets(sizes_bytes: Sequence[int], *, cap_bytes: int, first_cap_bytes: int) -> list[list[int]]:
    """DDP's bucket assignment over tensors listed in gradient-ready order: fill a bucket until it reaches its
    limit (the first bucket's limit is ``first_cap_bytes``, later ones ``cap_bytes``); a tensor larger than the
    limit closes its bucket on its own."""
    buckets: list[list[int]] = []
    current: list[int] = []
    filled, limit = 0, first_cap_bytes
    for i, size in enumerate(sizes_bytes):
        current.append(i)
        filled += size
        if filled >= limit:
            buckets.append(current)
            current, filled, limit = [], 0, cap_bytes
    if current:
        buckets.append(current)
    return buckets


class DDPBuckets:
    """Gradient all_reduce in buckets, launched from backward as soon as a bucket (and every earlier one) is full.

    ``order`` lists parameter ids in gradient-ready order; the all_reduce sums ``grad / group.size`` (DDP's
    default comm hook divides first). The reduced gradients are views of the flat bucket (``gradient_as_bucket_view``).
    """

    def __init__(
        self,
        group: Group,
        order: Sequence[int],
        shapes: dict[int, tuple[int, ...]],
        buckets: list[list[int]],
        dtype: torch.dtype,
    ):
        self.group = group
        self.dtype = dtype
        self.buckets = [[order[j] for j in b] for b in buckets]
        self.shapes = shapes
        self.bucket_of = {pid: k for k, b in enumerate(self.buckets) for pid in b}
        self.pending: dict[int, torch.Tensor] = {}
        self.missing = [len(b) for b in self.buckets]
        self.next_bucket = 0
        self.reduced: dict[int, torch.Tensor] = {}

    def owns(self, pid: int) -> bool:
        return pid in self.bucket_of

    def grad_ready(self, pid: int, grad: torch.Tensor) -> None:
        self.pending[pid] = grad
        self.missing[self.bucket_of[pid]] -= 1
        while self.next_bucket < len(self.buckets) and self.missing[self.next_bucket] == 0:
            self._launch(self.next_bucket)
            self.next_bucket += 1

    def _launch(self, k: int) -> None:
        pids = self.buckets[k]
        flat = torch.cat([self.pending.pop(pid).reshape(-1) for pid in pids]) / self.group.size
        flat = all_reduce(flat, self.group)
        for pid, piece in zip(pids, flat.split([math.prod(self.shapes[pid]) for pid in pids]), strict=True):
            self.reduced[pid] = piece.view(self.shapes[pid])

    def finish(self) -> None:
        """Launch what is left (a parameter that got no gradient counts as zeros, as DDP's find_unused does)."""
        while self.next_bucket < len(self.buckets):
            for pid in self.buckets[self.next_bucket]:
                if pid not in self.pending:
                    self.pending[pid] = torch.zeros(self.shapes[pid], dtype=self.dtype)
            self._launch(self.next_bucket)
            self.next_bucket += 1

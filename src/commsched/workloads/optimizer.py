"""The optimizer step of a zoo training step: AdamW over each rank's local parameters, as torch runs it.

``optimizer`` is ``"none"`` (the step ends with the gradients), ``"adamw"`` (``torch.optim.AdamW(foreach=True)``,
torch's default on CUDA) or ``"adamw-fused"`` (``torch.optim.AdamW(fused=True)``, torchtitan's default:
``[optimizer] implementation = "fused"`` in ``torchtitan/config/job_config.py`` at commit 4a950ea, passed on as
``fused=True`` by ``build_optimizers`` in ``torchtitan/components/optimizer.py``).

The step calls torch's own functional AdamW, ``torch.optim.adam.adam(..., decoupled_weight_decay=True)`` (what
``AdamW.step`` calls in torch 2.13, ``torch/optim/adam.py``), so ``make_fx`` records the ops torch issues:

* ``adamw`` (``_multi_tensor_adam``): ``_foreach_add_`` of the step counters (CPU tensors: host work),
  ``_foreach_mul_`` (weight decay), ``_foreach_lerp_`` (exp_avg), ``_foreach_mul_`` + ``_foreach_addcmul_``
  (exp_avg_sq), ``_foreach_sqrt`` (a temporary list), ``_foreach_div_``, ``_foreach_add_`` (eps) and
  ``_foreach_addcdiv_`` (the update): each a multi-tensor CUDA kernel over every local parameter. The bias
  corrections are host floats read from the step counters (their ``.item()`` calls are host work, dropped from
  the traced graph by :func:`commsched.workloads.trace.tidy_traced`).
* ``adamw-fused`` (``_fused_adam``): ``_foreach_add_`` of the step counters (device tensors), then one
  ``_fused_adamw_`` that reads each parameter, gradient, exp_avg and exp_avg_sq and writes the three states.

What a rank optimizes is what it stores: its FSDP shards with their reduce-scattered gradient shards, DDP's full
parameters, TP's local slices, EP's local experts (the step's parameter inputs and its returned gradients). The
states exp_avg and exp_avg_sq have the parameters' dtype (the fp32 master weights) and shapes; they and the step
counters are inputs of the step (``exp_avg.<param>``, ``exp_avg_sq.<param>``, ``step.<param>``), so they persist
across steps as torch keeps them. A gradient in another dtype than its parameter (``reduce_dtype``) is cast first, as
FSDP2 casts the reduced gradient to the parameter's dtype. Hyperparameters: torchtitan's defaults (they change no
cost).

``max_norm`` (a float > 0; None: no clipping) clips the gradients before the update as torchtitan does
(``training.max_norm``, default 1.0; ``torchtitan/distributed/utils.py``'s ``clip_grad_norm_`` at b5bcd76, called by
``trainer.py``): ``torch.nn.utils.get_total_norm`` then ``clip_grads_with_norm_`` (torch 2.13
``torch/nn/utils/clip_grad.py``) over FSDP2's / TP's DTensor gradients, as DTensor runs them: one ``_foreach_norm``
of the local gradients; each norm is partial (``_NormPartial``) over the mesh dimensions its gradient is sharded on,
and the stacked norms are made partial on every dimension any of them is (a replicated norm divided by
``size ** 0.5``, DTensor's ``_partition_value``); then, per such dimension, outer first, ``pow(2)``, an all_reduce
(sum) of the stacked vector and ``pow(0.5)`` (``full_tensor``: one all_reduce per partial mesh dimension, as
DTensor's redistribute issues them); the total ``vector_norm`` of the vector; ``clamp(max_norm / (total + 1e-6),
max=1)`` and one ``_foreach_mul_`` of the gradients. FSDP's (and HSDP's shard, CP included) group, TP's and EP's
are the partial dimensions; replicas (DDP, HSDP's replicate, EP's data-parallel groups) hold whole gradients. With
expert parallelism, torchtitan's ``_clip_grad_norm_with_ep``: the experts' and the other gradients' norms apart,
combined as ``(a ** 2 + b ** 2) ** 0.5``, each set scaled by its own ``_foreach_mul_``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable, Mapping, Sequence
from typing import Any

import torch

OPTIMIZERS: dict[str, str] = {
    "none": "no optimizer step: the step ends with the gradients",
    "adamw": "torch.optim.AdamW(foreach=True), torch's default on CUDA: multi-tensor _foreach_* kernels",
    "adamw-fused": "torch.optim.AdamW(fused=True), torchtitan's default: one _fused_adamw_ kernel over the tensors",
}
STATE_KEYS = ("exp_avg", "exp_avg_sq", "step")
"""the per-parameter inputs of an optimizer, in order (each ``<key>.<param name>``)"""


@dataclasses.dataclass(frozen=True, slots=True)
class AdamW:
    """AdamW's hyperparameters: torchtitan's defaults (``torchtitan/config/job_config.py``, ``Optimizer``)."""

    lr: float = 8e-4
    beta1: float = 0.9
    beta2: float = 0.95
    eps: float = 1e-8
    weight_decay: float = 0.1


ADAMW = AdamW()


@dataclasses.dataclass(frozen=True, slots=True)
class NormSet:
    """Gradients whose norm torch takes in one ``get_total_norm``: ``members`` (indices of the step's gradients),
    ``dims`` (the mesh dimensions the stacked norms are reduced over, outer first) and per member the dimensions its
    gradient is sharded on (``partial``)."""

    members: tuple[int, ...]
    dims: tuple[str, ...]
    partial: tuple[frozenset[str], ...]


MESH_ORDER = ("world", "fsdp", "efsdp", "ep", "tp")
"""the mesh dimensions a gradient can be sharded on, outer first (the order DTensor reduces them in)"""


def parse_max_norm(value: str | float | None) -> float | None:
    """``max_norm`` as a float > 0, or None for ``"none"`` / None (no clipping); a one-line ValueError otherwise."""
    if value is None or str(value).strip().lower() == "none":
        return None
    try:
        norm = float(value)
    except ValueError:
        norm = 0.0
    if not norm > 0 or norm == float("inf"):
        raise ValueError(f"max_norm={value!r}: expected a number > 0 (the gradient norm clipped to) or none")
    return norm


def norm_sets(layout: Sequence, plan) -> list[NormSet]:
    """The gradient sets of torchtitan's clipping under ``plan`` (a ``ParallelPlan``): with expert parallelism the
    experts' then the others (``_clip_grad_norm_with_ep``), else one set of every gradient."""
    partial = [_sharded_on(p, plan) for p in layout]
    groups = [[i for i, p in enumerate(layout) if p.expert], [i for i, p in enumerate(layout) if not p.expert]]
    if plan.ep <= 1:
        groups = [list(range(len(layout)))]
    out = []
    for members in (m for m in groups if m):
        dims = set().union(*(partial[i] for i in members))
        out.append(NormSet(tuple(members), tuple(d for d in MESH_ORDER if d in dims),
                           tuple(partial[i] for i in members)))  # fmt: skip
    return out


def _sharded_on(p, plan) -> frozenset[str]:
    """The mesh dimensions parameter ``p``'s gradient is sharded on (its norm partial over)."""
    dims = set()
    if plan.fsdp_degree(p.expert) > 1:
        dims.add(plan.fsdp_dim(p.expert))
    if plan.ep > 1 and p.expert:
        dims.add("ep")
    if plan.tp > 1 and p.tp_dim is not None:
        dims.add("tp")
    return frozenset(dims)


def clip_grad_norm_(grads: Sequence[torch.Tensor], max_norm: float, sets: Sequence[NormSet],
                    reduce: Callable[[torch.Tensor, str], torch.Tensor],
                    sizes: Mapping[str, int]) -> torch.Tensor:  # fmt: skip
    """torchtitan's ``clip_grad_norm_`` of the local ``grads`` in place (see the module): ``reduce(t, dim)`` sums
    ``t`` over the group of mesh dimension ``dim``, ``sizes[dim]`` its ranks. Returns the total norm."""
    with torch.no_grad():
        totals = [_total_norm([grads[i] for i in s.members], s, reduce, sizes) for s in sets]
        # with EP, _clip_grad_norm_with_ep: (ep ** 2 + non_ep ** 2) ** (1 / 2)
        total = totals[0] if len(totals) == 1 else (totals[0] ** 2.0 + totals[1] ** 2.0) ** (1.0 / 2.0)
        for s in sets:
            coef = torch.clamp(max_norm / (total + 1e-6), max=1.0)
            for same in _by_dtype([grads[i] for i in s.members]):
                torch._foreach_mul_(same, coef)
    return total


def _total_norm(grads: list[torch.Tensor], s: NormSet, reduce, sizes: Mapping[str, int]) -> torch.Tensor:
    """``get_total_norm`` of one set on DTensors: local norms, partitioned where replicated, the stacked vector
    reduced over each partial dimension, then its norm."""
    norms: list[Any] = [None] * len(grads)
    for idx in _by_dtype(list(range(len(grads))), key=lambda i: grads[i].dtype):
        for i, norm in zip(idx, torch._foreach_norm([grads[i] for i in idx], 2.0), strict=True):
            norms[i] = norm
    for i, dims in enumerate(s.partial):
        for d in s.dims:
            if d not in dims:  # a replicated norm made partial: _NormPartial._partition_value
                norms[i] = norms[i] / sizes[d] ** 0.5
    stacked = torch.stack(norms)
    for d in s.dims:
        stacked = reduce(stacked**2.0, d) ** 0.5
    return torch.linalg.vector_norm(stacked, 2.0)


def _by_dtype(items: list, key: Callable[[Any], Any] = lambda t: t.dtype) -> list[list]:
    """``items`` grouped by dtype, in first-seen order (torch's ``_group_tensors_by_device_and_dtype``)."""
    groups: dict[Any, list] = {}
    for item in items:
        groups.setdefault(key(item), []).append(item)
    return list(groups.values())


def parse_optimizer(value: str) -> str:
    """``value`` as one of :data:`OPTIMIZERS` (case and surrounding spaces ignored); a one-line ValueError
    otherwise."""
    name = str(value).strip().lower()
    if name not in OPTIMIZERS:
        raise ValueError(f"optimizer={value!r}: expected one of {', '.join(OPTIMIZERS)}")
    return name


def state_shapes(layout: Sequence, dtype: torch.dtype) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
    """(input name, shape, dtype) of the optimizer's inputs: every parameter's exp_avg, then every exp_avg_sq
    (its shard shape, ``dtype``: the stored parameters'), then every step counter (a float32 scalar)."""
    out = [(f"{key}.{p.name}", tuple(p.shard_shape), dtype) for key in STATE_KEYS[:2] for p in layout]
    return out + [(f"step.{p.name}", (), torch.float32) for p in layout]


def state_tensors(kind: str, layout: Sequence, dtype: torch.dtype, steps_done: int = 0) -> list[torch.Tensor]:
    """Fresh optimizer inputs (zero states, counters at ``steps_done``), as torch's ``_init_group`` creates them:
    foreach counters on the CPU, fused ones with the parameters. Under ``FakeTensorMode`` the counters are fake
    constants, whose values the foreach step's bias corrections read on the host."""
    states = [torch.zeros(shape, dtype=dt) for _, shape, dt in state_shapes(layout, dtype)[: 2 * len(layout)]]
    device = {"device": "cpu"} if kind == "adamw" else {}
    return states + [torch.tensor(float(steps_done), dtype=torch.float32, **device) for _ in layout]


def optimizer_step(kind: str, params: Sequence[torch.Tensor], grads: Sequence[torch.Tensor],
                   states: Sequence[torch.Tensor], hp: AdamW = ADAMW) -> None:  # fmt: skip
    """One AdamW step in place over ``params`` (``states``: as :func:`state_shapes` lists them), through torch's
    functional AdamW with ``foreach=True`` (``kind="adamw"``) or ``fused=True`` (``"adamw-fused"``)."""
    from torch.optim.adam import adam

    if kind not in ("adamw", "adamw-fused"):
        raise ValueError(f"optimizer={kind!r}: expected 'adamw' or 'adamw-fused'")
    n = len(params)
    if len(grads) != n or len(states) != 3 * n:
        raise ValueError(f"optimizer_step: {n} parameters, {len(grads)} gradients, {len(states)} states (3 each)")
    with torch.no_grad():
        grads = [g if g.dtype == p.dtype else g.to(p.dtype) for p, g in zip(params, grads, strict=True)]
        adam(list(params), grads, list(states[:n]), list(states[n : 2 * n]), [], list(states[2 * n :]),
             foreach=kind == "adamw", fused=kind == "adamw-fused", decoupled_weight_decay=True, amsgrad=False,
             beta1=hp.beta1, beta2=hp.beta2, lr=hp.lr, weight_decay=hp.weight_decay, eps=hp.eps,
             maximize=False)  # fmt: skip


def reference_clip(grads: dict[str, torch.Tensor], max_norm: float) -> dict[str, torch.Tensor]:
    """``torch.nn.utils.clip_grad_norm_(foreach=True)`` of copies of the unsharded ``grads`` (the reference of a real
    sharded run's clipping)."""
    leaves = {name: torch.zeros_like(g, requires_grad=True) for name, g in grads.items()}
    for name, leaf in leaves.items():
        leaf.grad = grads[name].detach().clone()
    torch.nn.utils.clip_grad_norm_(list(leaves.values()), max_norm, foreach=True)
    return {name: leaf.grad for name, leaf in leaves.items()}


def reference_adamw(kind: str, params: dict[str, torch.Tensor], grads: dict[str, torch.Tensor],
                    hp: AdamW = ADAMW) -> dict[str, torch.Tensor]:  # fmt: skip
    """``torch.optim.AdamW`` (foreach or fused, as ``kind``) applied once to copies of ``params`` with ``grads``:
    the updated parameters (the reference of a real sharded run)."""
    leaves = {name: t.detach().clone().requires_grad_(True) for name, t in params.items()}
    opt = torch.optim.AdamW(list(leaves.values()), lr=hp.lr, betas=(hp.beta1, hp.beta2), eps=hp.eps,
                            weight_decay=hp.weight_decay, foreach=kind == "adamw",
                            fused=kind == "adamw-fused" or None)  # fmt: skip
    for name, leaf in leaves.items():
        leaf.grad = grads[name].detach().clone().to(leaf.dtype)
    opt.step()
    return {name: leaf.detach() for name, leaf in leaves.items()}

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
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

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

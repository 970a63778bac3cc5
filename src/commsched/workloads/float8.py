"""Float8 training of the zoo's linears, as torchtitan runs it with torchao's ``Float8Linear``: ``float8`` is
``"none"``, ``"tensorwise"`` or ``"rowwise"``.

Written in plain torch ops (torchao is not needed), following torchao at commit
36027d82d1ad9949597ea16002ff4940374b1b94 (2026-08-21):

* ``torchao/float8/config.py``, ``Float8LinearConfig.from_recipe_name``: the recipes. ``tensorwise`` (the
  default config): one dynamic scale per tensor, input and weight cast to ``float8_e4m3fn``, the output gradient
  to ``float8_e5m2``. ``rowwise``: one scale per row along the contraction dimension (``AXISWISE``), every operand
  ``float8_e4m3fn``, scales rounded down to a power of 2 (``round_scales_to_power_of_2=True``). Both: the output
  GEMM with ``use_fast_accum=True``, the two gradient GEMMs without.
* ``torchao/float8/float8_linear.py``, ``matmul_with_hp_or_float8_args``: the forward saves the high-precision
  input and weight and casts both; the backward casts the output gradient twice (along its rows for grad_input,
  along its columns for grad_weight), the weight again and the input again (each cast its own amax), then
  ``grad_input = go @ w`` and ``grad_weight = go.t() @ x``: three ``torch._scaled_mm`` per linear and step.
* ``torchao/float8/float8_utils.py``: ``tensor_to_amax`` (``torch.max(torch.abs(x))``; rowwise
  ``torch.amax(torch.abs(x), dim, keepdim=True)``), ``amax_to_scale`` (in float64: ``finfo.max / clamp(amax,
  EPS)``, back to float32; ``exp2(floor(log2(scale)))`` when rounded), ``to_fp8_saturated`` (clamp, then cast);
  ``float8_training_tensor.py``, ``_ToFloat8ConstrFunc``: ``x.to(float32) * scale``.
* ``torchao/float8/float8_ops.py``: ``preprocess_addmm`` (the left operand made row-major, the right one
  column-major, each by a copy where it is not) and ``addmm_float8_unwrapped`` (``_scaled_mm`` takes the
  reciprocal scales; a rowwise GEMM without fast accumulation runs the tensorwise kernel with unit scales and
  multiplies its output by the outer product of the reciprocal scales; a rowwise GEMM never outputs float32:
  bfloat16, then cast).
* ``torchao/float8/fsdp_utils.py``: with ``enable_fsdp_float8_all_gather`` (tensorwise only: ``config.py``
  refuses it otherwise) the FSDP shard is cast to float8 before its all_gather
  (``WeightWithDynamicFloat8CastTensor.fsdp_pre_all_gather``), so FSDP2 gathers one byte per element, and the
  linear takes the gathered float8 weight as is, in the forward and again (re-gathered) for grad_input;
  ``precompute_float8_dynamic_scale_for_fsdp`` computes every such weight's scale once per step from one
  ``torch._foreach_norm(inf)`` of the shards and one all_reduce (max) of their stacked amaxes.

Which linears, and when the all_gather is float8, follows torchtitan at commit
169ba3bd770617e9b623205dfe610720251d985d (the one the zoo's AC follows; ``torchtitan/components/quantization/
float8.py``, ``utils.py``'s ``module_filter_fn`` and the ``[quantize.linear.float8]`` of ``torchtitan/models/
llama3/train_configs/llama3_405b.toml``): every ``nn.Linear`` whose weight's dimensions are both multiples of 16,
but those ``filter_fqns`` names: ``output`` (the llama3 configs) and ``router.gate`` (torchtitan's ``float8.md``
at b5bcd76c66d0acb1a08b176d9639425bc55e0b2a for MoE models; Mixtral's 8-expert router fails the multiple-of-16
rule anyway). So the seven linears of each block (wq wk wv wo w1 w2 w3) are float8; the output head, the
embedding, the norms, the router and the MoE experts (grouped GEMMs, which ``Float8LinearConverter`` does not
convert) stay in the compute dtype. ``tensorwise`` under FSDP is the 405B config: ``enable_fsdp_float8_all_gather``
and ``precompute_float8_dynamic_scale_for_fsdp`` both on (torchtitan's only config with the float8 all_gather;
without the precompute each pre-all_gather would all_reduce its weight's amax on its own). The precompute runs
after the optimizer step, before the next forward: here, at the start of the step. Under tensor parallelism only
``rowwise`` is modelled (its TP collectives stay in high precision, as torchtitan runs them); ``tensorwise`` TP
(torchao's ``Float8ColwiseParallel``: float8 sequence all_gathers, amax all_reduces over the TP group) is refused.

The ops are traced eagerly as torchao runs them (torch.compile would fuse the casts; the cost model's fusion
regions stand for that). ``torch._scaled_mm`` has a CPU kernel in the torch this project runs (2.13), so a real
step on gloo computes the same float8 arithmetic as on a GPU, with CPU accumulation.
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F
from torch.autograd import Function

FLOAT8_MODES = ("none", "tensorwise", "rowwise")
"""the accepted values of ``float8``"""

EPS = 1e-12
"""torchao's ``float8_utils.EPS``: the least amax a scale divides by"""

FILTER_FQNS = ("output", "router.gate")
"""the modules torchtitan leaves in high precision by name (see the module docstring)"""

LINEAR_KEYS = frozenset({"wq", "wk", "wv", "wo", "w1", "w2", "w3", "gate", "output"})
"""the zoo's parameters that are ``nn.Linear`` weights in torchtitan's models (2-D; MoE experts are 3-D)"""

_FULL_NAME = {"gate": "router.gate", "output": "output"}


@dataclasses.dataclass(frozen=True, slots=True)
class Recipe:
    """A torchao float8 recipe as the matmuls need it."""

    name: str
    input_dtype: torch.dtype
    weight_dtype: torch.dtype
    grad_dtype: torch.dtype
    rowwise: bool  # AXISWISE scaling (one scale per row along K) instead of one per tensor
    pow2: bool  # round_scales_to_power_of_2
    fast_accum: tuple[bool, bool, bool]  # use_fast_accum of the output, grad_input and grad_weight GEMMs


RECIPES = {
    "tensorwise": Recipe("tensorwise", torch.float8_e4m3fn, torch.float8_e4m3fn, torch.float8_e5m2, False, False,
                         (True, False, False)),
    "rowwise": Recipe("rowwise", torch.float8_e4m3fn, torch.float8_e4m3fn, torch.float8_e4m3fn, True, True,
                      (True, False, False)),
}  # fmt: skip


def parse_float8(value: str) -> str:
    """The canonical form of a ``float8`` value; a one-line ValueError naming the field and the accepted values
    otherwise."""
    text = str(value).strip().lower()
    if text in FLOAT8_MODES:
        return text
    raise ValueError(f"float8={value!r}: expected one of {', '.join(FLOAT8_MODES)}")


def converts(key: str, full_shape: tuple[int, ...]) -> bool:
    """Whether torchtitan's float8 converter turns the linear of parameter ``key`` (unsharded shape ``full_shape``)
    into a ``Float8Linear``: an ``nn.Linear`` weight, both dimensions multiples of 16, not filtered by name."""
    if key not in LINEAR_KEYS or len(full_shape) != 2 or _FULL_NAME.get(key) in FILTER_FQNS:
        return False
    return full_shape[0] % 16 == 0 and full_shape[1] % 16 == 0


@dataclasses.dataclass(frozen=True, slots=True)
class Float8Weight:
    """A ``Float8Linear``'s weight as the model's matmul takes it: ``weight`` ``[out, in]`` in the compute dtype,
    differentiable; with FSDP's float8 all_gather, ``data`` (the gathered float8 weight) and its ``scale``, and
    ``weight`` is a stand-in of the weight's shape that only carries the gradient to FSDP's reduce_scatter."""

    weight: torch.Tensor
    recipe: Recipe
    data: torch.Tensor | None = None
    scale: torch.Tensor | None = None

    def linear(self, x: torch.Tensor) -> torch.Tensor:
        """``F.linear(x, weight)`` as ``Float8Linear.forward``: ``matmul_with_hp_or_float8_args(x, weight.t())``."""
        data_t = None if self.data is None else self.data.t()
        return _Float8Matmul.apply(x, self.weight.t(), data_t, self.scale, self.recipe)


def linear(x: torch.Tensor, w: torch.Tensor | Float8Weight) -> torch.Tensor:
    """``F.linear(x, w)``; a float8 linear when the parameter source handed a :class:`Float8Weight`."""
    if isinstance(w, Float8Weight):
        return w.linear(x)
    return F.linear(x, w)


# ---------------------------------------------------------------------- casts (torchao float8_utils)
def amax_to_scale(amax: torch.Tensor, dtype: torch.dtype, pow2: bool = False) -> torch.Tensor:
    """torchao's ``amax_to_scale``: ``finfo(dtype).max / clamp(amax, EPS)`` in float64, as float32."""
    amax = amax.to(torch.float64)
    scale = (torch.finfo(dtype).max / torch.clamp(amax, min=EPS)).to(torch.float32)
    if pow2:  # _round_scale_down_to_power_of_2
        scale = torch.exp2(torch.floor(torch.log2(scale)))
    return scale


def to_float8(t: torch.Tensor, scale: torch.Tensor, dtype: torch.dtype) -> torch.Tensor:
    """torchao's ``_ToFloat8ConstrFunc`` and ``to_fp8_saturated``: ``clamp(t.float() * scale)`` cast to float8."""
    fmax = torch.finfo(dtype).max
    return (t.to(torch.float32) * scale).clamp(min=-fmax, max=fmax).to(dtype)


def cast(t: torch.Tensor, dtype: torch.dtype, recipe: Recipe, axis: int) -> tuple[torch.Tensor, torch.Tensor]:
    """torchao's ``hp_tensor_to_float8_dynamic``: (float8 data, scale) of ``t``; rowwise: one scale per slice
    along ``axis`` (the dimension reduced, kept as 1)."""
    amax = torch.amax(torch.abs(t), dim=axis, keepdim=True) if recipe.rowwise else torch.max(torch.abs(t))
    scale = amax_to_scale(amax, dtype, recipe.pow2)
    return to_float8(t, scale, dtype), scale


def _row_major(t: torch.Tensor) -> bool:
    stride = t.stride()
    return stride[0] > stride[1] and stride[1] == 1


def scaled_mm(a: torch.Tensor, a_scale: torch.Tensor, b: torch.Tensor, b_scale: torch.Tensor,
              out_dtype: torch.dtype, fast_accum: bool) -> torch.Tensor:  # fmt: skip
    """``a @ b`` of float8 operands with their scales (``a = a_data / a_scale``), as torchao's ``float8_mm``
    calls it (``preprocess_addmm`` then ``addmm_float8_unwrapped``)."""
    if not _row_major(a):
        a = a.contiguous()
    if _row_major(b):
        b = b.t().contiguous().t()
    a_inv, b_inv = a_scale.reciprocal(), b_scale.reciprocal()
    rowwise = a_scale.shape == (a.shape[0], 1) and b_scale.shape == (1, b.shape[1])
    post = None
    if rowwise and not fast_accum:  # the tensorwise kernel, the rowwise scales applied to its output
        post = a_inv * b_inv
        a_inv = a_inv.new_ones(())
        b_inv = a_inv.new_ones(())
    mm_dtype = torch.bfloat16 if rowwise and out_dtype in (torch.float16, torch.float32) else out_dtype
    out = torch._scaled_mm(a, b, scale_a=a_inv, scale_b=b_inv, out_dtype=mm_dtype, use_fast_accum=fast_accum)
    if post is not None:
        out *= post
    return out.to(out_dtype) if mm_dtype != out_dtype else out


class _Float8Matmul(Function):
    """torchao's ``matmul_with_hp_or_float8_args`` for a 2-D input ``x [M, K]`` and ``w_t [K, N]`` (the weight
    transposed); ``w_data_t`` / ``w_scale``: the weight already in float8 (FSDP's float8 all_gather), not cast
    again, saved instead of the high-precision weight."""

    @staticmethod
    def forward(ctx, x, w_t, w_data_t, w_scale, recipe):
        ctx.recipe, ctx.given = recipe, w_data_t is not None
        ctx.save_for_backward(x, w_t if w_data_t is None else w_data_t, w_scale)
        x8, sx = cast(x, recipe.input_dtype, recipe, -1)
        if w_data_t is None:
            w8, sw = cast(w_t, recipe.weight_dtype, recipe, 0)
        else:
            w8, sw = w_data_t, w_scale
        return scaled_mm(x8, sx, w8, sw, x.dtype, recipe.fast_accum[0])

    @staticmethod
    def backward(ctx, grad_out):
        r = ctx.recipe
        x, w_t, w_scale = ctx.saved_tensors
        go = grad_out.reshape(-1, grad_out.shape[-1])
        # grad_input = grad_output (scaled along its rows) @ weight (along its rows of w_t: output features)
        go0, s_go0 = cast(go, r.grad_dtype, r, -1)
        if ctx.given:
            w0, s_w0 = w_t, w_scale
        else:
            w0, s_w0 = cast(w_t, r.weight_dtype, r, -1)
        grad_input = scaled_mm(go0, s_go0, w0.t(), s_w0.t() if s_w0.dim() > 1 else s_w0, go.dtype, r.fast_accum[1])
        # grad_weight = grad_output.t() (scaled along the tokens) @ input (along the tokens)
        go1, s_go1 = cast(go, r.grad_dtype, r, 0)
        x1, s_x1 = cast(x.reshape(-1, x.shape[-1]), r.input_dtype, r, 0)
        grad_weight = scaled_mm(go1.t(), s_go1.t() if s_go1.dim() > 1 else s_go1, x1, s_x1, go.dtype, r.fast_accum[2])
        return grad_input.reshape(*grad_out.shape[:-1], grad_input.shape[-1]), grad_weight.t(), None, None, None


def precompute_scales(shards: list[torch.Tensor], reduce_max) -> torch.Tensor:
    """torchao's ``precompute_float8_dynamic_scale_for_fsdp``: the float8 scale of every weight from its FSDP
    shards, one ``_foreach_norm(inf)``, one all_reduce (``reduce_max``, max over the FSDP group) of the stacked
    amaxes. Returns ``[len(shards)]`` float32 scales."""
    with torch.no_grad():
        amax = torch.stack(torch._foreach_norm(shards, ord=math.inf))
        amax = torch.clamp(reduce_max(amax), EPS)
        scale = torch.finfo(torch.float8_e4m3fn).max / amax.to(torch.float64)
        return scale.to(torch.float32)

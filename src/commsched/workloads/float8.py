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
after the optimizer step, before the next forward: here, at the start of the step (under FSDP+TP its amaxes are
all-reduced over the FSDP group, then over the TP group: the weights are DTensors on both mesh dimensions).

Under tensor parallelism ``rowwise`` keeps its TP collectives in high precision, and ``tensorwise`` runs torchao's
float8 TP styles (torchtitan's ``apply_tp`` with ``enable_float8_tensorwise_tp``: every recipe but rowwise;
``torchao/float8/float8_tensor_parallel.py`` at the commit above), which :class:`TPStyle` and the two functions
:func:`enter_tp` and :func:`row_parallel_linear` follow:

* ``PrepareFloat8ModuleInput`` on ``attention`` and ``feed_forward``: the block's input (sequence-sharded under SP)
  is cast to float8 once for the region's column-parallel linears (wq wk wv, or w1 w3), its amax all-reduced (max)
  over the TP group (the amax of a sharded DTensor is ``Partial(max)``; the scale needs it ``Replicate``), then
  gathered in float8 (``Shard(1) -> Replicate`` of a float8 tensor: ``float8_ops.allgather_fp8``, one byte per
  element). The cast passes its gradient through unchanged, so the backward reduce-scatters (SP; all-reduces
  without SP) the region's input gradient in high precision, as the bf16 step does.
* ``Float8ColwiseParallel``: the linear takes the gathered float8 input as is; its output gradient is cast once
  (``NoopFwToFloat8BwDynamic``), its amax all-reduced over the TP group (it is sharded on the features).
* ``Float8RowwiseParallel``: the input (sharded on the features) is cast with its amax all-reduced over the group;
  the output is reduce-scattered (SP; all-reduced without SP) in high precision; the output gradient (sequence-
  sharded under SP) is cast with its amax all-reduced over the group and gathered in float8 (the backward of
  ``Partial -> Shard(1)`` is ``Shard(1) -> Replicate``).
* every weight not gathered in float8 by FSDP is a TP shard: each of its casts (forward, and again for grad_input)
  all-reduces its amax over the TP group.

With every amax all-reduced, each float8 operand equals the unsharded step's, so the TP step computes the unsharded
float8 step but for the order of the row-parallel sums.

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

from commsched.workloads.collectives import Group, all_gather, all_reduce, reduce_scatter

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

    @property
    def float8_tp(self) -> bool:
        """Whether tensor parallelism runs torchao's float8 TP styles (:class:`TPStyle`): torchtitan applies them
        for every recipe but rowwise (``enable_float8_tensorwise_tp``; torchao supports dynamic tensorwise only)."""
        return not self.rowwise


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


@dataclasses.dataclass(frozen=True, slots=True)
class TPStyle:
    """A float8 linear's place under tensorwise tensor parallelism (torchao's ``Float8ColwiseParallel`` or
    ``Float8RowwiseParallel``; see the module docstring)."""

    group: Group  # the TP group: every amax of a sharded tensor is all-reduced (max) over it
    sp: bool  # sequence parallelism: the activations outside the region are sharded on the tokens
    rowwise: bool  # row-parallel: input sharded on the features, output reduced over the group


@dataclasses.dataclass(frozen=True, slots=True)
class Float8Input:
    """A region's input cast to float8 once for its column-parallel linears (``PrepareFloat8ModuleInput``):
    ``data`` (gathered under SP) and its ``scale``; ``stand_in``, of the data's shape in the compute dtype (an
    expanded scalar: no memory), carries the linears' input gradients back to :func:`enter_tp`."""

    stand_in: torch.Tensor
    data: torch.Tensor
    scale: torch.Tensor
    style: TPStyle


def linear(x: torch.Tensor | Float8Input, w: torch.Tensor | Float8Weight) -> torch.Tensor:
    """``F.linear(x, w)``; a float8 linear when the parameter source handed a :class:`Float8Weight`; a column-
    parallel float8 linear (``Float8ColwiseParallel``) when ``x`` is a :class:`Float8Input`."""
    if isinstance(x, Float8Input):
        if not isinstance(w, Float8Weight):
            raise TypeError("a float8 TP region's input feeds float8 linears only (torchao's Float8ColwiseParallel)")
        return _tp_matmul(x.stand_in, w, x.data, x.scale, x.style)
    if isinstance(w, Float8Weight):
        return w.linear(x)
    return F.linear(x, w)


def enter_tp(x: torch.Tensor, recipe: Recipe, group: Group, sp: bool) -> Float8Input:
    """``PrepareFloat8ModuleInput``: ``x`` (``[tokens / tp, dim]`` under SP, else replicated) cast to float8 with
    its amax all-reduced over the TP group (under SP; a replicated tensor's own amax is the group's), then gathered
    in float8 (SP). The backward reduce-scatters (SP) or all-reduces the input gradient in high precision."""
    stand_in, data, scale = _Float8Enter.apply(x, recipe, group, sp)
    return Float8Input(stand_in, data, scale, TPStyle(group, sp, rowwise=False))


def row_parallel_linear(x: torch.Tensor, w: Float8Weight, group: Group, sp: bool) -> torch.Tensor:
    """``Float8RowwiseParallel``: ``linear(x, w)`` of ``x`` sharded on its features, the output reduce-scattered
    on the tokens (SP) or all-reduced, in high precision; the output gradient gathered in float8 (SP)."""
    return _tp_matmul(x, w, None, None, TPStyle(group, sp, rowwise=True))


def _tp_matmul(x: torch.Tensor, w: Float8Weight, x_data: torch.Tensor | None, x_scale: torch.Tensor | None,
               style: TPStyle) -> torch.Tensor:  # fmt: skip
    data_t = None if w.data is None else w.data.t()
    return _Float8TPMatmul.apply(x, w.weight.t(), x_data, x_scale, data_t, w.scale, w.recipe, style)


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


def cast(t: torch.Tensor, dtype: torch.dtype, recipe: Recipe, axis: int,
         group: Group | None = None) -> tuple[torch.Tensor, torch.Tensor]:  # fmt: skip
    """torchao's ``hp_tensor_to_float8_dynamic``: (float8 data, scale) of ``t``; rowwise: one scale per slice
    along ``axis`` (the dimension reduced, kept as 1). ``group``: ``t`` is a shard of a tensor sharded over it, and
    its amax is all-reduced (max) over it first (DTensor's ``Partial(max)`` made ``Replicate``)."""
    amax = torch.amax(torch.abs(t), dim=axis, keepdim=True) if recipe.rowwise else torch.max(torch.abs(t))
    if group is not None:
        amax = all_reduce(amax, group, "max")
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


def _gather_float8(t: torch.Tensor, group: Group) -> torch.Tensor:
    """All-gather a float8 tensor along dim 0 as bytes (gloo has no float8 type; NCCL moves float8 as bytes too)."""
    return all_gather(t.view(torch.uint8), group).view(t.dtype)


class _Float8Enter(Function):
    """:func:`enter_tp`. The float8 data and scale are no differentiable outputs (a gradient of a float8 dtype
    would be cast to float8): a stand-in of the gathered shape carries the input gradient (see
    :class:`Float8Input`)."""

    @staticmethod
    def forward(ctx, x, recipe, group, sp):
        ctx.group, ctx.sp = group, sp
        data, scale = cast(x, recipe.input_dtype, recipe, -1, group if sp else None)
        if sp:
            data = _gather_float8(data, group)
        ctx.set_materialize_grads(False)
        ctx.mark_non_differentiable(data, scale)
        return x.new_empty(()).expand(data.shape), data, scale

    @staticmethod
    def backward(ctx, grad, _data, _scale):
        if grad is None:
            return None, None, None, None
        # the cast passes its gradient through: the region's input gradient in high precision, reduced over TP
        return (reduce_scatter(grad, ctx.group) if ctx.sp else all_reduce(grad, ctx.group)), None, None, None


class _Float8TPMatmul(Function):
    """torchao's ``matmul_with_hp_or_float8_args`` under its float8 TP styles (``style``): the input given in
    float8 (column-parallel: ``x_data`` / ``x_scale``, ``x`` the stand-in) or cast here with its amax over the
    group (row-parallel); the weight cast with its amax over the group unless given (``w_data_t``: FSDP's float8
    all_gather); the output gradient cast once, its amax over the group where it is sharded, and used by both
    gradient GEMMs (``NoopFwToFloat8BwDynamic``); the float8 input saved, not the high-precision one."""

    @staticmethod
    def forward(ctx, x, w_t, x_data, x_scale, w_data_t, w_scale, recipe, style):
        if x_data is None:
            x_data, x_scale = cast(x, recipe.input_dtype, recipe, -1, style.group)
        ctx.recipe, ctx.style, ctx.given = recipe, style, w_data_t is not None
        if w_data_t is None:
            w8, sw = cast(w_t, recipe.weight_dtype, recipe, 0, style.group)
        else:
            w8, sw = w_data_t, w_scale
        ctx.save_for_backward(x_data, x_scale, w_t if w_data_t is None else w_data_t, w_scale)
        out = scaled_mm(x_data, x_scale, w8, sw, x.dtype, recipe.fast_accum[0])
        if style.rowwise:
            out = reduce_scatter(out, style.group) if style.sp else all_reduce(out, style.group)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        r, st = ctx.recipe, ctx.style
        x8, sx, w_t, w_scale = ctx.saved_tensors
        # column-parallel: sharded on the features; row-parallel: on the tokens under SP, else replicated
        sharded = st.sp or not st.rowwise
        go8, s_go = cast(grad_out, r.grad_dtype, r, -1, st.group if sharded else None)
        if st.rowwise and st.sp:
            go8 = _gather_float8(go8, st.group)
        if ctx.given:
            w0, s_w0 = w_t, w_scale
        else:
            w0, s_w0 = cast(w_t, r.weight_dtype, r, -1, st.group)
        grad_input = scaled_mm(go8, s_go, w0.t(), s_w0, grad_out.dtype, r.fast_accum[1])
        grad_weight = scaled_mm(go8.t(), s_go, x8, sx, grad_out.dtype, r.fast_accum[2])
        return grad_input, grad_weight.t(), None, None, None, None, None, None


def precompute_scales(shards: list[torch.Tensor], reduce_max) -> torch.Tensor:
    """torchao's ``precompute_float8_dynamic_scale_for_fsdp``: the float8 scale of every weight from its FSDP
    shards, one ``_foreach_norm(inf)``, one all_reduce (``reduce_max``, max over the FSDP group) of the stacked
    amaxes. Returns ``[len(shards)]`` float32 scales."""
    with torch.no_grad():
        amax = torch.stack(torch._foreach_norm(shards, ord=math.inf))
        amax = torch.clamp(reduce_max(amax), EPS)
        scale = torch.finfo(torch.float8_e4m3fn).max / amax.to(torch.float64)
        return scale.to(torch.float32)

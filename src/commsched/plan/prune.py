"""Lower bounds that prune a layout before it is traced: memory (what every rank must hold) and step time (the compute
no order hides). Each is a bound, never an estimate: a pruned layout could not fit or could not win.

Memory per rank is at least the fp32 master shard and AdamW's two states (12 bytes per parameter of the shard: FSDP
over ``dp_shard x cp``, TP and PP divide the model), under FSDP with PP the unsharded compute-dtype parameters and
reduce-dtype gradients torch's pipelining holds all step, plus the larger of the fp32 gradient shard (live at the
optimizer step) and what the end of the forward holds (the backward frees activations as gradients appear): the
activations a rank keeps: per layer and token at least :func:`saved_bytes_per_token` (the block input under full AC,
with its attention output under selective AC; without AC what flash attention's, the norms' and SwiGLU's backwards
read, and the linears' inputs, float8 casts under float8), split over TP and CP, for
every block and micro-batch a pipeline rank holds at once (:func:`pipeline_live_layers`), plus the bf16 logits of
the local batch (without PP), plus, under FSDP without reshard-after-forward, every gathered weight (split over
TP). The step is at least the rank's compute: the model FLOPs of its tokens at the fastest dtype's peak or, with
the hardware, its share of the GEMMs and flash attention passes (recompute included) at the fastest rate the cost
model gives each (:func:`kernel_lower_bound_s`: 2.0-3.8x the former on llama3-70b), plus the published bubble
``(P - 1) / (V x M)`` of it for GPipe / 1F1B / interleaved schedules, or, where it is longer, the CP ring's
communication (:func:`cp_ring_lower_bound_s`: at CP 256 it is tens of seconds, against a best step of a few, so such
a layout is pruned before it is traced).

Inference (prefill, decode): a rank holds at least its weights in the compute dtype (split over TP; the experts over
EP) and its KV cache (its sequences x layers x K and V x its KV heads x head_dim x the cache's positions over CP); no
gradient, optimizer state or saved activation. Its step is at least the blocks' matmul FLOPs of its tokens (two per
parameter a token uses; attention and the output projection, which a prefill runs for its last position only, left
out) at the peak.
"""

from __future__ import annotations

import functools
from typing import Any, NamedTuple

from commsched.plan.layout import Layout, PlanRequest, local_batch

MASTER_BYTES_PER_PARAM = 4 + 2 * 4  # fp32 master, AdamW's exp_avg and exp_avg_sq
GRADIENT_BYTES_PER_PARAM = 4  # fp32 gradient
ZERO_BUBBLE = ("ZBVZeroBubble", "InterleavedZeroBubble", "DualPipeV")


def saved_bytes_per_token(model: Any, ac: str, float8: str) -> float:
    """Bytes one block saves per token for its backward, at least (compute dtype 2 bytes, a float8 cast 1): under
    full AC its input; under selective-op its input, attention output and (a dense block in the compute dtype) the
    outputs of every second of its seven matmuls, at least the four smallest (under float8 its linears are no
    ``mm``, so it recomputes them); without AC the two norms' inputs, q, k, v and the attention's
    output (flash attention's backward reads them), SwiGLU's w1 and w3 outputs and silu's (what silu and the product
    read back; compute dtype in every recipe), and the
    linears' inputs: the two normed activations and w2's (float8 casts under float8). A mixture of experts keeps
    the coarser count of the seven linears' inputs (halved under float8). A policy per block (``selective-layer:N``,
    ``per-layer:...``): the least of its blocks'."""
    if ac not in ("none", "selective-op", "full"):  # selective-layer:N, per-layer: each block its own policy
        from commsched.workloads.ac import layer_policies

        policies = set(layer_policies(ac, model.n_layers))
        return min(saved_bytes_per_token(model, policy, float8) for policy in policies)
    if ac == "full":
        return 2.0 * model.dim
    if ac == "selective-op":
        if model.is_moe or float8 != "none":  # a float8 linear is no ``mm``: recomputed, not saved
            return 2.0 * 2 * model.dim
        return 2.0 * (2 * model.dim + sum(sorted(out for _, out in _linears(model))[:4]))  # every 2nd of 7 matmuls
    if model.is_moe:
        return (4 * model.dim + 3 * model.ffn_dim) * 2 * (0.5 if float8 != "none" else 1.0)
    attention, kv = model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
    kept = 2 * model.dim + 2 * attention + 2 * kv + 3 * model.ffn_dim  # SwiGLU: w1's and w3's outputs, silu's
    linear_inputs = 2 * model.dim + model.ffn_dim
    return 2.0 * kept + (1.0 if float8 != "none" else 2.0) * linear_inputs


def _linears(model: Any) -> list[tuple[int, int]]:
    """(in, out) features of a dense block's seven linears: wq wk wv wo w1 w3 w2."""
    attention, kv = model.n_heads * model.head_dim, model.n_kv_heads * model.head_dim
    dim, ffn = model.dim, model.ffn_dim
    return [(dim, attention), (dim, kv), (dim, kv), (attention, dim), (dim, ffn), (dim, ffn), (ffn, dim)]


@functools.lru_cache(maxsize=16)
def _model(req: PlanRequest) -> tuple[Any, int]:
    """The request's model and its parameter count (a plan bounds tens of thousands of layouts of one request)."""
    model = req.model()
    return model, model.total_params()


def memory_lower_bound_bytes(req: PlanRequest, layout: Layout) -> int:
    """Bytes the most loaded rank holds at least (see the module docstring)."""
    if req.inference:
        return _inference_memory_bytes(req, layout)
    model, params = _model(req)
    shards = layout.fsdp * layout.tp * layout.pp
    static = params * MASTER_BYTES_PER_PARAM / shards
    if layout.pp > 1 and layout.fsdp > 1:
        static += params * (2 + 4) / (layout.tp * layout.pp)
    micro = local_batch(req, layout) // max(layout.microbatches, 1)
    tokens = micro * req.seq / (layout.cp * layout.tp)
    per_layer = saved_bytes_per_token(model, layout.ac, layout.float8)
    if layout.pp > 1:
        live = pipeline_live_layers(layout.pp_schedule, layout.pp, layout.microbatches, layout.stages_per_rank,
                                    model.n_layers)  # fmt: skip
    else:
        live = model.n_layers
    activations = live * tokens * per_layer
    logits = 0 if layout.pp > 1 else micro * req.seq / layout.cp * model.vocab_size / layout.tp * 2
    # FSDP without reshard-after-forward: every unit's gathered weights held to the backward (float8: 1 byte each)
    held = 0 if layout.reshard_after_forward else params * (1 if layout.float8 != "none" else 2) / layout.tp
    return int(static + max(activations + logits + held, params * GRADIENT_BYTES_PER_PARAM / shards))


@functools.lru_cache(maxsize=1024)
def pipeline_live_layers(schedule: str, pp: int, microbatches: int, stages_per_rank: int, layers: int) -> int:
    """The most blocks' activations a pipeline rank holds at once: over each rank's actions in torch's order
    (:func:`commsched.pipeline.lower_schedule`), a forward of stage s takes its blocks' (torchtitan's split,
    :func:`commsched.pipeline.split.stages_of`) and the end of its whole or weight backward gives them back, as the
    pipeline engine counts them (a rank runs one action at a time, so what it holds at each action's start follows
    from its order alone, whatever the actions' times)."""
    from commsched.pipeline.actions import ActionKind, lower_schedule
    from commsched.pipeline.split import stages_of

    program = lower_schedule(schedule, pp, microbatches, stages_per_rank)
    blocks = [len(stage.layers) for stage in stages_of(program.num_stages, layers)]
    frees = (ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_WEIGHT)
    most = 0
    for rows in program.actions:
        held = 0
        for kind, stage, _, kind2, stage2, _ in rows.tolist():
            overlap = kind == ActionKind.OVERLAP_F_B
            parts = [(ActionKind.FORWARD, stage), (kind2, stage2)] if overlap else [(kind, stage)]
            held += sum(blocks[s] for k, s in parts if k == ActionKind.FORWARD)
            most = max(most, held)
            held -= sum(blocks[s] for k, s in parts if k in frees)
    return most


def _inference_memory_bytes(req: PlanRequest, layout: Layout) -> int:
    """Weights and KV cache of an inference rank (see the module docstring)."""
    from commsched.workloads.program import dtype_of

    model, params = _model(req)
    element_bytes = dtype_of(req.dtype).itemsize
    experts = model.n_layers * 3 * model.dim * model.ffn_dim * model.n_experts
    weights = ((params - experts) / layout.tp + experts / (layout.tp * layout.ep)) * element_bytes
    sequences = local_batch(req, layout)  # per replica group; under EP every rank is one
    heads = model.n_kv_heads // layout.tp
    cache = sequences * model.n_layers * 2 * heads * model.head_dim * (req.kv // layout.cp) * element_bytes
    return int(weights + cache)


def step_lower_bound_s(req: PlanRequest, layout: Layout, peak_flops: float, hardware: Any = None) -> float:
    """Seconds the step takes at least on a device of ``peak_flops`` (the fastest dtype the layout uses): its
    compute (with ``hardware``, plan's :func:`commsched.plan.search.plan_hardware`, its kernels as the cost model
    times them at best, :func:`kernel_lower_bound_s`, where that is longer) and a pipeline's bubble (the published
    one, or with ``hardware`` the schedule run on those kernels, :func:`pipeline_kernel_bound_s`, where longer), or
    the CP ring's communication (:func:`cp_ring_lower_bound_s`) where that is longer (a step overlaps the two at
    best)."""
    model = _model(req)[0]
    if req.inference:
        return 2 * model.n_layers * model.block_active_params() * req.tokens_per_step / req.gpus / peak_flops
    tokens_per_gpu = req.batch * req.seq / req.gpus
    compute_s = model.model_flops_per_token(req.seq) * tokens_per_gpu / peak_flops
    if hardware is not None:
        compute_s = max(compute_s, kernel_lower_bound_s(req, layout, hardware))
    if layout.pp > 1 and layout.pp_schedule not in ZERO_BUBBLE:
        compute_s *= 1 + (layout.pp - 1) / (layout.stages_per_rank * layout.microbatches)
    if hardware is None:
        return compute_s
    compute_s = max(compute_s, pipeline_kernel_bound_s(req, layout, hardware))
    return max(compute_s, cp_ring_lower_bound_s(req, layout, hardware))


class KernelSeconds(NamedTuple):
    """Seconds per token (of the whole model width, before TP or CP split it) of one block's and of the output head's
    kernels at the fastest rates the cost model gives them: forward, input gradient (with the recompute), weight
    gradient."""

    block: tuple[float, float, float]
    head: tuple[float, float, float]


def kernel_seconds(req: PlanRequest, layout: Layout, hardware: Any) -> KernelSeconds | None:
    """The parts :func:`kernel_lower_bound_s` adds up (None where it claims nothing)."""
    model = _model(req)[0]
    if req.inference or model.is_moe or hardware.table_path:
        return None
    c = hardware.compute
    peak = c.peak_flops_for(req.dtype)  # float32's where the profile has no entry, as the cost model takes it
    matmul = c.efficiency.matmul * c.efficiency.sustained_matmul
    dense_rate = peak * matmul
    block_rate = dict(c.peak_flops).get("float8_e4m3fn", peak) * matmul if layout.float8 != "none" else dense_rate
    linears = [n_in * n_out for n_in, n_out in _linears(model)]  # parameters: 2 FLOPs each per token and pass
    attention = 4.0 * model.n_heads * model.head_dim * req.seq  # forward FLOPs per token and layer
    fwd_rate = min(peak * c.efficiency.attention * 2, dense_rate)
    bwd_rate = min(peak * c.efficiency.attention * 3, dense_rate)
    gemms_s = 2.0 * sum(linears) / block_rate  # one pass (forward, grad-input or grad-weight) of the seven
    recompute_s = 0.0
    if layout.ac == "full":
        recompute_s = gemms_s + attention / fwd_rate
    elif layout.ac == "selective-op":  # every second matmul; under float8 every linear (a float8 GEMM is no ``mm``)
        recompute_s = gemms_s if layout.float8 != "none" else 2.0 * sum(sorted(linears)[:3]) / block_rate
    head_s = 2.0 * model.vocab_size * model.dim / dense_rate
    block = (gemms_s + attention / fwd_rate, gemms_s + 2 * attention / bwd_rate + recompute_s, gemms_s)
    return KernelSeconds(block=block, head=(head_s, head_s, head_s))


def kernel_lower_bound_s(req: PlanRequest, layout: Layout, hardware: Any) -> float:
    """Seconds a training rank's compute stream works at least, as the cost model times its kernels
    (:func:`commsched.cost.compute.kernel_times`): its share (1 / GPUs: TP, CP, PP and the batch split them evenly) of
    the model's GEMMs and flash attention passes, each at the fastest rate the model gives its class.

    - A GEMM (``2 x M x N x K`` FLOPs: forward, grad-input and grad-weight of each linear, the output head's too) runs
      at most at its dtype's peak x ``matmul`` x ``sustained_matmul`` (a training step runs power-saturated; the
      shape term is at most 1). Under float8 the blocks' seven linears at the float8 peak (the head stays in the
      compute dtype, torchtitan's ``filter_fqns``).
    - A flash attention forward (``4 x heads x head_dim x seq`` FLOPs per token and layer, the masked blocks counted)
      at most at peak x ``attention`` x 2: causality at most halves its time; its backward (twice the FLOPs) at
      most x 3 (the masked share of its waves at most two thirds). Neither faster than a GEMM.
    - Recompute: full AC runs every block's forward again; selective-op AC at least the three smallest of a block's
      seven forward GEMMs (it recomputes every second matmul: wk, wo, w3 in torchtitan's order), all seven under
      float8 (its save list names ``mm``, and a float8 linear's GEMM is ``_scaled_mm``).

    Everything else (norms, elementwise, the optimizer, FSDP's copies) is left out. 0 where nothing is claimed: a
    mixture of experts (its grouped GEMMs), a profile with a measured table, inference."""
    parts = kernel_seconds(req, layout, hardware)
    if parts is None:
        return 0.0
    tokens_per_gpu = req.batch * req.seq / req.gpus
    return tokens_per_gpu * (_model(req)[0].n_layers * sum(parts.block) + sum(parts.head))


def pipeline_kernel_bound_s(req: PlanRequest, layout: Layout, hardware: Any) -> float:
    """Seconds a pipeline's step takes at least: torch's schedule (its action lists, as the judge simulates them,
    :func:`commsched.pipeline.simulate_pipeline`) run with each stage's forward, input-gradient and weight-gradient
    kernels at their best rates (:func:`kernel_seconds` of its blocks, torchtitan's split, and of the head on the
    last stage) and free communication. Each rank runs its actions in a fixed order, each once its inputs are
    there, so the step is the longest path through them and no shorter with the judge's longer actions and
    transfers. 0 without PP or where :func:`kernel_seconds` claims nothing."""
    parts = kernel_seconds(req, layout, hardware) if layout.pp > 1 else None
    if parts is None:
        return 0.0
    tokens = local_batch(req, layout) // layout.microbatches * req.seq / (layout.tp * layout.cp)
    return _pipeline_step_s(layout.pp_schedule, layout.pp, layout.microbatches, layout.stages_per_rank,
                            _model(req)[0].n_layers, tuple(tokens * x for x in parts.block),
                            tuple(tokens * x for x in parts.head))  # fmt: skip


@functools.lru_cache(maxsize=4096)
def _pipeline_step_s(schedule: str, pp: int, microbatches: int, stages_per_rank: int, layers: int,
                     block: tuple[float, float, float], head: tuple[float, float, float]) -> float:  # fmt: skip
    import numpy as np

    from commsched.pipeline import StageCosts, simulate_pipeline
    from commsched.pipeline.split import stages_of

    stages = stages_of(pp * stages_per_rank, layers)
    costs = np.array([[len(st.layers) * b + (h if st.last else 0.0) for b, h in zip(block, head, strict=True)]
                      for st in stages])  # fmt: skip
    stage_costs = StageCosts(forward_s=costs[:, 0], backward_input_s=costs[:, 1], backward_weight_s=costs[:, 2])
    return simulate_pipeline(schedule, pp, microbatches, stages_per_rank, stage_costs, free_comm=True).step_s


def cp_ring_lower_bound_s(req: PlanRequest, layout: Layout, hardware: Any) -> float:
    """Seconds a training rank's CP group spends communicating at least: per layer the rank holds and micro-batch,
    the ring's K/V all_gather in the forward and again in the backward (the whole sequence's K and V of the rank's
    KV heads, in the compute dtype) and the ``cp`` permutes of the float32 dK/dV that travel with them
    (:mod:`commsched.workloads.context_parallel`, torchtitan's "allgather" rotation, plan's only one), each at its
    own time on the CP group (:func:`commsched.cost.collectives.plan_collective`, stride TP, as the cost model
    times the traced ones). The group's collectives run one at a time (its FIFO stream), none faster than alone
    (sharing a link only slows them), so the step is at least their sum; a recomputed forward's all_gather is left
    out. 0 without CP, for inference, or on a profile with a measured table (which may time them otherwise)."""
    if layout.cp == 1 or req.inference or hardware.table_path:
        return 0.0
    micro = local_batch(req, layout) // max(layout.microbatches, 1)
    repeats = (_model(req)[0].n_layers // layout.pp) * (layout.microbatches if layout.pp > 1 else 1)
    return _ring_per_layer_s(req, hardware, layout.cp, layout.tp, micro) * repeats


@functools.lru_cache(maxsize=4096)
def _ring_per_layer_s(req: PlanRequest, hardware: Any, cp: int, tp: int, micro: int) -> float:
    """One layer's ring for one micro-batch of ``micro`` sequences (see :func:`cp_ring_lower_bound_s`; a plan bounds
    tens of thousands of layouts with a few dozen of these)."""
    from commsched.cost.collectives import plan_collective
    from commsched.workloads.program import dtype_of

    model = _model(req)[0]
    heads = model.n_kv_heads // tp
    kv_elements = micro * heads * req.seq * model.head_dim * 2  # K and V of the whole sequence
    gather = plan_collective("all_gather", kv_elements * dtype_of(req.dtype).itemsize, cp, hardware, stride=tp)
    permute = plan_collective("sendrecv", kv_elements // cp * 4, cp, hardware, stride=tp)
    return 2 * gather.time_s + cp * permute.time_s


def optimised_step_lower_bound_s(row: dict[str, Any]) -> float:
    """The least step at full depth ``optimize`` can give a layout, from ``row``: its first round (the framework's
    order, :func:`commsched.plan.judge.judge_task` without ``optimize``). 0 when nothing can be claimed.

    Judged at ``K`` and ``2K`` layers, the optimised step at depth is :func:`commsched.plan.judge.optimised_at_depth`'s
    ``F - h x E``: ``F`` and ``E`` the framework's step and exposed communication scaled to the depth, ``h = (F_2K -
    O_2K) / E_2K`` the share of ``E_2K`` the search hid at 2K layers (``h = 0`` when ``E_2K = 0``). The search only
    orders the same graph on one stream with the same costs, so its step ``O_2K`` is at least the simulated lower
    bound ``B_2K`` of any order of that graph (:mod:`commsched.sim.bounds`), hence ``h <= (F_2K - B_2K) / E_2K`` and,
    ``E >= 0``, ``F - h x E >= F - max(0, (F_2K - B_2K) / E_2K) x E``: this bound. Each step of it is monotone in
    floating point too (a rounded difference, quotient or product keeps the order of exact ones), so it is never
    above the estimate as computed. Judged at every layer (one point), the search's own step is the estimate, at
    least ``B``. The same costs: plan's judge has ``optimize`` cost the graph as the framework round does (fused
    when the request compiles, eager otherwise)."""
    points = row["points"]
    if len(points) == 1:
        return row["lower_bound_s"]
    deeper = points[-1]
    exposed_s = deeper["framework_exposed_s"]
    share = max(0.0, (deeper["framework_step_s"] - deeper["lower_bound_s"]) / exposed_s) if exposed_s > 0 else 0.0
    return row["framework_step_s"] - share * row["framework_exposed_s"]

"""Every layout of a :class:`~commsched.plan.layout.PlanRequest` that torchtitan and the zoo can run.

Degrees divide the GPU count; TP stays inside a node and divides the heads, the KV heads and the MLP width; CP
needs sequences that split into ``2 x cp`` head-tail chunks; EP (mixture-of-experts presets) divides the experts and
FSDP's shard group; PP stages run at least two blocks each; the global batch
splits evenly over the data-parallel replicas and, under PP, into ``M`` equal micro-batches. FSDP's
``reshard_after_forward=False`` is a choice of FSDP / HSDP layouts without PP (under PP the stages never reshard,
torchtitan's default); async TP one of TP + SP layouts, compiled, on hardware that runs symmetric-memory copies
(:func:`commsched.cost.symm_mem.copy_engine_refusal`). Options a pipeline job cannot take yet (``PipelineJob``'s
fields decide: :func:`pipeline_options`) are not enumerated under PP.

Inference (``mode`` prefill or decode, :func:`inference_layouts`): what the zoo traces for it
(:data:`commsched.workloads.mesh.INFERENCE_PARALLELISMS`: TP with and without SP, EP, one rank), replicated over the
GPUs left: TP degrees as above, CP (prefill only, with TP, whose zoo plan hosts it) on the same head-tail rule and
dividing the KV cache, SP where the step's tokens split over TP, EP under no TP; no FSDP, AC, float8 or PP.
"""

from __future__ import annotations

import dataclasses
import functools
import itertools
import math
from collections.abc import Iterator

from commsched.plan.layout import Layout, PlanRequest

MAX_MICROBATCH_CHOICES = 3
"""micro-batch counts tried per pipeline schedule: the largest divisors of the local batch (smaller bubbles)"""
MIN_LAYERS_PER_STAGE = 2
"""each pipeline stage runs at least two blocks (one block per stage only adds P2P and bubbles)"""
MAX_MICROBATCHES_PER_RANK = 4
"""M at most 4 P: beyond it the bubble ((P - 1) / M of the step at most) is under 1/4 and smaller micro-batches
only lose matmul efficiency; torch's own checks of (P, M, V) run when a layout is judged (a refusal is a failed
row)"""


def divisors(n: int) -> list[int]:
    return [d for d in range(1, n + 1) if n % d == 0]


@functools.cache
def pipeline_options() -> frozenset[str]:
    """The step options a pipeline job takes today (the fields of ``PipelineJob``): ``ac``, ``float8``,
    ``dp_replicate`` and ``cp_size`` are enumerated under PP only once it has them."""
    from commsched.pipeline.job import PipelineJob

    return frozenset(f.name for f in dataclasses.fields(PipelineJob))


def tp_degrees(req: PlanRequest, gpus_per_node: int) -> list[int]:
    """TP degrees inside one node that divide the heads, the KV heads and the MLP width."""
    m = req.model()
    common = math.gcd(math.gcd(m.n_heads, m.n_kv_heads), m.ffn_dim)
    return [t for t in divisors(req.gpus) if gpus_per_node % t == 0 and common % t == 0]


@functools.cache
def async_tp_runs(req: PlanRequest, gpus_per_node: int, tp: int) -> bool:
    """Whether ``req``'s hardware runs async TP's symmetric-memory copies for a TP group of ``tp`` ranks (TP is
    innermost: consecutive ranks)."""
    from commsched.cost.symm_mem import copy_engine_refusal
    from commsched.hardware import get, nodes_for_world

    hw = get(req.hardware)
    return copy_engine_refusal(hw.with_nodes(nodes_for_world(req.gpus, gpus_per_node), gpus_per_node), tp) is None


def enumerate_layouts(req: PlanRequest, gpus_per_node: int, float8_ok: bool) -> Iterator[Layout]:
    """Every layout of ``req`` (unpruned), in a fixed order. ``float8_ok``: the hardware has float8 tensor cores."""
    if req.inference:
        yield from inference_layouts(req, gpus_per_node)
        return
    model = req.model()
    float8s = [f for f in req.float8_recipes if f == "none" or float8_ok]
    for tp in tp_degrees(req, gpus_per_node):
        async_ok = tp > 1 and req.compile and True in req.async_tp and async_tp_runs(req, gpus_per_node, tp)
        for sp in (True, False) if tp > 1 else (False,):
            for pp in divisors(req.gpus // tp):
                if pp > 1 and (pp * MIN_LAYERS_PER_STAGE > model.n_layers or (req.max_pp or pp) < pp):
                    continue
                base = Layout(dp_shard=1, tp=tp, sp=sp, pp=pp)
                yield from _inner(req, base, float8s, async_ok and sp)


def _fsdp_options(req: PlanRequest, layout: Layout, async_ok: bool) -> Iterator[Layout]:
    """``layout`` with each FSDP reshard-after-forward value (FSDP / HSDP without PP) and each async TP value
    (``async_ok``: TP + SP that the hardware micro-pipelines; under PP once ``PipelineJob`` takes it) asked for;
    a layout an option does not apply to takes its default."""
    reshards = req.reshard_after_forward if layout.fsdp > 1 and layout.pp == 1 else (True,)
    asyncs = req.async_tp if async_ok and (layout.pp == 1 or "async_tp" in pipeline_options()) else (False,)
    for reshard in reshards:
        for async_tp in asyncs:
            yield dataclasses.replace(layout, reshard_after_forward=reshard, async_tp=async_tp)


def _inner(req: PlanRequest, base: Layout, float8s: list[str], async_ok: bool) -> Iterator[Layout]:
    """The data-parallel and context-parallel splits of what TP x PP leave, with every step option."""
    under_pp = base.pp > 1
    allowed = pipeline_options()
    for cp in divisors(req.gpus // (base.tp * base.pp)):
        if cp > 1 and (req.seq % (2 * cp) or (under_pp and "cp_size" not in allowed)):
            continue
        rest = req.gpus // (base.tp * base.pp * cp)
        for replicate in divisors(rest):
            layout = dataclasses.replace(base, cp=cp, dp_replicate=replicate, dp_shard=rest // replicate)
            if not _data_parallel_ok(req, layout, allowed):
                continue
            for ac in req.ac_policies if not under_pp or "ac" in allowed else ("none",):
                for f8 in float8s if not under_pp or "float8" in allowed else ("none",):
                    for lay in _expert_parallel(req, dataclasses.replace(layout, ac=ac, float8=f8)):
                        for opt in _fsdp_options(req, lay, async_ok):
                            yield from _pipelined(req, opt)


def _data_parallel_ok(req: PlanRequest, layout: Layout, allowed: frozenset[str]) -> bool:
    """The batch splits over the replicas; HSDP shards inside each replica; DDP without TP / CP / PP."""
    if req.batch % layout.dp:
        return False
    if layout.dp_replicate > 1:
        if layout.fsdp == 1:
            return layout.tp == 1 and layout.pp == 1  # DDP
        return layout.pp == 1 or "dp_replicate" in allowed
    return True


def _expert_parallel(req: PlanRequest, layout: Layout) -> Iterator[Layout]:
    """``layout`` and, for a mixture-of-experts model under plain FSDP (the zoo's ``fsdp+ep``: no TP, CP, PP or
    HSDP beside it), each EP degree >= 2 dividing both the shard group and the experts (EP borrows its ranks from
    ``dp_shard``, as torchtitan's ``ParallelDims`` does)."""
    yield layout
    experts = req.model().n_experts
    if experts and layout.tp == layout.pp == layout.cp == layout.dp_replicate == 1:
        for ep in divisors(math.gcd(layout.dp_shard, experts))[1:]:
            yield dataclasses.replace(layout, ep=ep)


def _pipelined(req: PlanRequest, layout: Layout) -> Iterator[Layout]:
    """``layout`` itself without PP; with PP, each schedule with its V and up to three micro-batch counts."""
    if layout.pp == 1:
        yield layout
        return
    local = req.batch // layout.dp
    for schedule in req.pp_schedules:
        v = 1 if schedule in ("GPipe", "1F1B") else 2
        if layout.pp * v * MIN_LAYERS_PER_STAGE > req.model().n_layers:
            continue
        counts = (m for m in reversed(divisors(local)) if layout.pp <= m <= MAX_MICROBATCHES_PER_RANK * layout.pp)
        kept = list(itertools.islice(counts, MAX_MICROBATCH_CHOICES))
        for m in reversed(kept):
            yield dataclasses.replace(layout, pp_schedule=schedule, microbatches=m, stages_per_rank=v)


def inference_layouts(req: PlanRequest, gpus_per_node: int) -> Iterator[Layout]:
    """Every inference layout of ``req`` (see the module docstring): ``dp_replicate`` replicas of ``tp x cp`` ranks
    (TP, CP in prefill), or of ``ep`` ranks; the concurrent sequences split evenly over the replicas."""
    for tp in tp_degrees(req, gpus_per_node):
        for cp in divisors(req.gpus // tp) if tp > 1 and req.mode == "prefill" else [1]:
            if cp > 1 and (req.seq % (2 * cp) or req.kv % cp):
                continue
            replicas = req.gpus // (tp * cp)
            if req.batch % replicas:
                continue
            tokens = req.batch // replicas * (1 if req.mode == "decode" else req.seq // cp)
            for sp in (True, False) if tp > 1 and tokens % tp == 0 else (False,):
                yield Layout(dp_shard=1, dp_replicate=replicas, tp=tp, sp=sp, cp=cp)
    experts = req.model().n_experts
    if experts and req.batch % req.gpus == 0:
        for ep in divisors(math.gcd(req.gpus, experts))[1:]:
            yield Layout(dp_shard=1, dp_replicate=req.gpus, ep=ep)

"""plan's enumeration and lower bounds (no tracing): every layout is one torchtitan and the zoo can run, the bounds
order as memory and time must, and impossible requests are one line naming the smallest memory any layout needs."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.plan import Layout, PlanRequest
from commsched.plan.enumerate import enumerate_layouts
from commsched.plan.prune import memory_lower_bound_bytes, step_lower_bound_s
from commsched.plan.search import plan


def assert_valid_layout(req: PlanRequest, layout: Layout, gpus_per_node: int) -> None:
    """The invariants every enumerated layout keeps."""
    model = req.model()
    assert layout.world_size == req.gpus
    assert gpus_per_node % layout.tp == 0 and model.n_heads % layout.tp == 0 and model.n_kv_heads % layout.tp == 0
    assert not (layout.sp and layout.tp == 1)
    assert req.batch % layout.dp == 0
    assert req.seq % (2 * layout.cp) == 0 or layout.cp == 1
    if layout.pp > 1:
        local = req.batch // layout.dp
        assert layout.microbatches >= layout.pp and local % layout.microbatches == 0
        assert layout.pp * layout.stages_per_rank * 2 <= model.n_layers
        assert (layout.stages_per_rank == 1) == (layout.pp_schedule in ("GPipe", "1F1B"))
    else:
        assert layout.pp_schedule is None and layout.microbatches == 1
    if layout.dp_replicate > 1 and layout.fsdp == 1:
        assert layout.tp == 1 and layout.pp == 1  # DDP
    if layout.ep > 1:  # the zoo's fsdp+ep: EP borrows from FSDP's shard group, nothing else beside it
        assert model.n_experts % layout.ep == 0 and layout.dp_shard % layout.ep == 0
        assert layout.tp == layout.pp == layout.cp == layout.dp_replicate == 1 and layout.parallel() == "fsdp+ep"


@settings(max_examples=25, deadline=None)
@given(st.sampled_from(["llama3-8b", "llama3-70b", "llama-tiny", "mixtral-8x7b"]), st.integers(0, 9),
       st.sampled_from([4, 8]), st.sampled_from([None, 1, 2, 4]))  # fmt: skip
def test_every_layout_is_valid_and_distinct(preset: str, log_gpus: int, gpus_per_node: int, batch_per_gpu) -> None:
    gpus = 1 << log_gpus
    if gpus > gpus_per_node and gpus % gpus_per_node:
        return
    req = PlanRequest(preset=preset, gpus=gpus, seq_len=1024, global_batch=None if batch_per_gpu is None else
                      batch_per_gpu * gpus, ac_policies=("none", "full"))  # fmt: skip
    layouts = list(enumerate_layouts(req, gpus_per_node, float8_ok=True))
    assert layouts, "a power-of-two world always has FSDP over every GPU"
    assert len(set(layouts)) == len(layouts)
    for layout in layouts:
        assert_valid_layout(req, layout, gpus_per_node)
    assert Layout(dp_shard=gpus, ac="none") in layouts or gpus == 1


@pytest.mark.parametrize("gpus", [8, 16, 64])
def test_moe_presets_get_every_ep_degree_dividing_experts_and_world(gpus: int) -> None:
    req = PlanRequest(preset="mixtral-8x7b", gpus=gpus, ac_policies=("full",), float8_recipes=("none",), max_pp=1)
    layouts = list(enumerate_layouts(req, 8, float8_ok=True))
    experts = req.model().n_experts
    assert {lay.ep for lay in layouts if lay.ep > 1} == {e for e in range(2, experts + 1) if experts % e == 0
                                                          and gpus % e == 0}  # fmt: skip
    dense = PlanRequest(preset="llama3-8b", gpus=gpus, ac_policies=("full",), float8_recipes=("none",), max_pp=1)
    assert all(lay.ep == 1 for lay in enumerate_layouts(dense, 8, float8_ok=True))


def test_without_float8_tensor_cores_no_float8_layout() -> None:
    req = PlanRequest(preset="llama3-8b", gpus=8)
    assert all(lay.float8 == "none" for lay in enumerate_layouts(req, 8, float8_ok=False))
    assert any(lay.float8 == "tensorwise" for lay in enumerate_layouts(req, 8, float8_ok=True))


def test_memory_bound_orders_as_memory_must() -> None:
    """More shards and more recompute never raise the bound; a layout's bound holds its static state at least."""
    req = PlanRequest(preset="llama3-70b", gpus=256, seq_len=8192)
    base = Layout(dp_shard=32, tp=8, sp=True, ac="none")
    full = dataclasses.replace(base, ac="full")
    assert memory_lower_bound_bytes(req, full) < memory_lower_bound_bytes(req, base)
    assert memory_lower_bound_bytes(req, Layout(dp_shard=256, ac="full")) < memory_lower_bound_bytes(
        req, Layout(dp_shard=64, dp_replicate=4, ac="full"))  # fmt: skip
    static = req.model().total_params() * 12 / 256
    assert memory_lower_bound_bytes(req, full) > static


@settings(max_examples=30, deadline=None)
@given(schedule=st.sampled_from(["GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble", "InterleavedZeroBubble",
                                 "DualPipeV"]),
       pp=st.integers(2, 4), times=st.integers(1, 3), extra_layers=st.integers(0, 9))  # fmt: skip
def test_a_pipeline_rank_holds_the_blocks_the_engine_counts(schedule, pp, times, extra_layers) -> None:
    """The memory bound's blocks in flight per rank (from torch's action lists alone) are exactly the pipeline
    engine's peak with each stage's activations its block count (any costs: a rank's order fixes what it holds)."""
    import numpy as np

    from commsched.pipeline import StageCosts, simulate_pipeline
    from commsched.pipeline.split import stages_of
    from commsched.plan.prune import pipeline_live_layers

    v = 1 if schedule in ("GPipe", "1F1B") else 2
    microbatches = pp * times * (2 if schedule == "DualPipeV" else 1)
    layers = 2 * pp * v + extra_layers
    blocks = np.array([len(s.layers) for s in stages_of(pp * v, layers)])
    costs = StageCosts(forward_s=1e-3, backward_input_s=1.5e-3, backward_weight_s=0.5e-3, activation_bytes=blocks)
    result = simulate_pipeline(schedule, pp, microbatches, v, costs, free_comm=True)
    assert pipeline_live_layers(schedule, pp, microbatches, v, layers) == result.peak_memory_bytes


def test_the_memory_bound_holds_a_pipelines_blocks_in_flight() -> None:
    """GPipe holds every micro-batch's activations on each rank, 1F1B at most P on the first: at M = 2P the GPipe
    layout's bound is the higher."""
    req = PlanRequest(preset="llama3-8b", gpus=8, seq_len=8192, global_batch=32)
    one_f1b = Layout(dp_shard=2, pp=4, pp_schedule="1F1B", microbatches=8)
    gpipe = dataclasses.replace(one_f1b, pp_schedule="GPipe")
    from commsched.plan.prune import pipeline_live_layers

    assert pipeline_live_layers("1F1B", 4, 8, 1, 32) < pipeline_live_layers("GPipe", 4, 8, 1, 32)
    assert memory_lower_bound_bytes(req, one_f1b) < memory_lower_bound_bytes(req, gpipe)


def test_step_bound_counts_the_bubble_of_non_zero_bubble_schedules() -> None:
    req = PlanRequest(preset="llama3-8b", gpus=8, seq_len=8192)
    flat = step_lower_bound_s(req, Layout(dp_shard=8), 1e15)
    one_f1b = Layout(dp_shard=2, pp=4, pp_schedule="1F1B", microbatches=4, stages_per_rank=1)
    zbv = dataclasses.replace(one_f1b, pp_schedule="ZBVZeroBubble", stages_per_rank=2)
    assert step_lower_bound_s(req, one_f1b, 1e15) == pytest.approx(flat * (1 + 3 / 4))
    assert step_lower_bound_s(req, zbv, 1e15) == pytest.approx(flat)


@pytest.mark.parametrize(("req", "message"), [
    (PlanRequest(preset="llama3-8b", gpus=12), "--gpus 12: expected a multiple of the 8 GPUs per node"),
    (PlanRequest(preset="llama3-405b", gpus=8, hbm_gib=80.0), "the smallest any layout needs is"),
    (PlanRequest(preset="llama3-8b", gpus=8, ac_policies=("sometimes",)), "ac="),
    (PlanRequest(preset="llama3-8b", gpus=8, pp_schedules=("1f1b",)), "pp_schedules: '1f1b'"),
    (PlanRequest(preset="llama3-8b", gpus=0), "gpus=0"),
])  # fmt: skip
def test_impossible_requests_are_one_line(req: PlanRequest, message: str) -> None:
    with pytest.raises(ValueError, match=message.replace("(", r"\(")) as info:
        plan(req, jobs=1)
    assert "\n" not in str(info.value)


def test_the_cluster_has_every_node_and_the_asked_hbm() -> None:
    """Layouts whose groups cross nodes are placed on the whole cluster, never refused as off one node."""
    from commsched.plan.search import plan_hardware

    hw = plan_hardware(PlanRequest(preset="llama3-70b", gpus=512, hbm_gib=70.0))
    assert (hw.num_nodes, hw.gpus_per_node, hw.compute.hbm_capacity_bytes) == (64, 8, 70 << 30)
    assert plan_hardware(PlanRequest(preset="llama3-8b", gpus=16, gpus_per_node=4)).num_nodes == 4

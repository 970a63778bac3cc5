"""plan's kernel bound (:func:`commsched.plan.prune.kernel_lower_bound_s`): the rates it assumes are the fastest the
cost model gives each class on every profile, its FLOPs are no more than a traced step's (on a device where every
kernel runs at its class's best rate, the step's compute work is at least the bound, and not far above it), it is
never above a step plan judges, and it prunes about half of llama3-70b's layouts on 512 GPUs (docs/plan.md)."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.cost import estimate_costs
from commsched.cost.compute import (
    attention_shape_efficiency,
    causal_attention_factor,
    forward_attention_factor,
    gemm_shape_efficiency,
)
from commsched.hardware import for_graph, get, list_profiles
from commsched.ir import OpKind
from commsched.plan import Layout, PlanRequest
from commsched.plan.enumerate import enumerate_layouts
from commsched.plan.judge import judge_task
from commsched.plan.layout import step_config
from commsched.plan.prune import (
    kernel_lower_bound_s,
    memory_lower_bound_bytes,
    pipeline_kernel_bound_s,
    step_lower_bound_s,
)
from commsched.plan.search import plan_hardware
from commsched.plan.traced import traced

PROFILES = sorted(list_profiles())
REQ = PlanRequest(preset="llama-tiny", gpus=8, layers=2, seq_len=256, layers_scale=0)
LAYOUTS = {
    "fsdp 8": Layout(dp_shard=8),
    "fsdp 4 x tp 2 (sp), full AC": Layout(dp_shard=4, tp=2, sp=True, ac="full"),
    "fsdp 2 x cp 4, selective-op": Layout(dp_shard=2, cp=4, ac="selective-op"),
    "fsdp 8, float8": Layout(dp_shard=8, float8="tensorwise"),
    "fsdp 4 x tp 2 (sp), float8, selective-op": Layout(
        dp_shard=4, tp=2, sp=True, float8="tensorwise", ac="selective-op"
    ),
    "hsdp 2 x 2 x cp 2, full AC": Layout(dp_shard=2, dp_replicate=2, cp=2, ac="full"),
}
SIZES = st.sampled_from([1, 3, 16, 64, 100, 128, 257, 1024, 4096, 8192, 65536])


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(PROFILES), m=SIZES, n=SIZES, k=SIZES, batch=st.sampled_from([1, 2, 8, 64]))
def test_no_gemm_beats_the_matmul_efficiency(name, m, n, k, batch) -> None:
    eff = gemm_shape_efficiency(np.array([m]), np.array([n]), np.array([k]), np.array([batch]), get(name))
    assert 0 < eff[0] <= 1.0


@settings(max_examples=60, deadline=None)
@given(name=st.sampled_from(PROFILES), batch_heads=st.sampled_from([1, 4, 16, 64, 256, 2048]), q=SIZES,
       extra_kv=st.sampled_from([0, 0, 64, 1000, 8192]), causal=st.booleans())  # fmt: skip
def test_causality_at_most_halves_a_forward_and_saves_two_thirds_of_a_backward(name, batch_heads, q, extra_kv,
                                                                             causal) -> None:  # fmt: skip
    """Per counted FLOP (the masked blocks counted), a flash forward runs at most 2x and a backward at most 3x the
    profile's attention efficiency (a CPU backward's rate is 1, a GPU's 0.86: 1 is the worst case here)."""
    hw = get(name)
    row = np.array([[batch_heads, q, q + extra_kv, 0]], float)
    assert forward_attention_factor(row, np.array([causal]), hw)[0] <= 2.0
    backward = attention_shape_efficiency(row[:, 0], row[:, 1], row[:, 2], hw)
    if causal:
        backward = backward / causal_attention_factor(row, hw)
    assert backward[0] <= 3.0


def _ideal(hw):
    """``hw`` with every kernel at its class's best rate: one unit, unit tiles, no K, launch or memory cost."""
    compute = dataclasses.replace(hw.compute, num_units=1, launch_overhead_s=0.0, hbm_bandwidth_bytes_per_s=1e30,
                                  matmul_tiles=((1, 1, 1.0),), matmul_k_half=0.0, memory_half_bytes=0.0,
                                  matmul_memory_half_bytes=0.0, attention_tile=1, cache_bytes=0.0)  # fmt: skip
    return dataclasses.replace(hw, compute=compute)


@pytest.mark.parametrize("name", list(LAYOUTS))
def test_bound_is_below_the_traced_steps_compute_at_the_best_rates(cache_dir, name) -> None:
    """On the ideal device the traced step's compute work (every kernel but the collectives, as plan costs it) is
    what the bound counts plus what it leaves out (the causal attention's saving, norms and elementwise work there
    cost nothing): at least the bound, at most 1.2x it (measured 1.04-1.08). With the profile's own costs, the
    judged step is above it."""
    layout, hw = LAYOUTS[name], plan_hardware(REQ)
    config = step_config(REQ, layout, None)
    g = traced(config, True, hw, REQ.gpus_per_node)
    ideal = for_graph(_ideal(hw), g)
    costs = estimate_costs(g, ideal, fusion=REQ.compile)
    work_s = float(costs.node_s[np.isin(g.kinds, (OpKind.COMPUTE, OpKind.OTHER))].sum())
    bound_s = kernel_lower_bound_s(REQ, layout, ideal)
    assert bound_s <= work_s * (1 + 1e-9)
    assert work_s <= 1.2 * bound_s, (work_s, bound_s)
    row = judge_task({"request": dataclasses.asdict(REQ), "hardware": hw, "optimize": True,
                      "layouts": [layout.to_dict()]})[0]  # fmt: skip
    assert row["error"] is None
    assert 0 < kernel_lower_bound_s(REQ, layout, hw) <= step_lower_bound_s(REQ, layout, 1e30, hw)
    assert step_lower_bound_s(REQ, layout, 1e30, hw) <= min(row["framework_step_s"], row["step_s"])


def test_bound_is_below_a_pipelined_step(cache_dir) -> None:
    """Under 1F1B the bound is the rank's share of the kernels and the published bubble on it, or the schedule run
    on the stages' kernels where longer: below the step the pipeline's simulation gives."""
    hw = plan_hardware(REQ)
    layout = Layout(dp_shard=4, pp=2, pp_schedule="1F1B", microbatches=2, ac="full")
    row = judge_task({"request": dataclasses.asdict(REQ), "hardware": hw, "layouts": [layout.to_dict()]})[0]
    assert row["error"] is None
    bound_s = step_lower_bound_s(REQ, layout, 1e30, hw)
    published_s = kernel_lower_bound_s(REQ, layout, hw) * (1 + 1 / 2)
    assert bound_s == pytest.approx(max(published_s, pipeline_kernel_bound_s(REQ, layout, hw)))
    assert 0 < bound_s <= row["step_s"]


def test_no_claim_for_a_mixture_of_experts_a_table_or_inference() -> None:
    hw = plan_hardware(REQ)
    assert kernel_lower_bound_s(dataclasses.replace(REQ, mode="prefill"), Layout(dp_shard=1, dp_replicate=8), hw) == 0
    moe = PlanRequest(preset="mixtral-8x7b", gpus=8, layers=2, seq_len=256)
    assert kernel_lower_bound_s(moe, Layout(dp_shard=8), plan_hardware(moe)) == 0
    assert kernel_lower_bound_s(REQ, Layout(dp_shard=8), dataclasses.replace(hw, table_path="t.csv")) == 0


def test_70b_on_512_the_bound_prunes_about_half_the_layouts() -> None:
    """llama3-70b on 512 H100 at seq 8192 (plan's speed benchmark; docs/plan.md "Prune"): of the 21,388 layouts
    that pass the memory bound, 13,013 have a step bound above plan's best step there (5.995 s), the peak-FLOPs
    bound alone none; the winner's own bound is 4.30 s. Every bf16 layout with full AC is bound above it."""
    req = PlanRequest(preset="llama3-70b", gpus=512, hardware="h100-sxm", seq_len=8192)
    hw = plan_hardware(req)
    peaks = dict(hw.compute.peak_flops)
    peak = max(peaks["float8_e4m3fn"], peaks["bfloat16"])
    fits = [lay for lay in enumerate_layouts(req, hw.gpus_per_node, True)
            if memory_lower_bound_bytes(req, lay) <= hw.compute.hbm_capacity_bytes]  # fmt: skip
    assert len(fits) == 21_388
    best_s = 5.995
    assert sum(step_lower_bound_s(req, lay, peak) > best_s for lay in fits) == 0
    above = [lay for lay in fits if step_lower_bound_s(req, lay, peak, hw) > best_s]
    assert len(above) == 13_013
    assert all(lay in above for lay in fits if lay.ac == "full" and lay.float8 == "none")
    winner = Layout(dp_shard=64, dp_replicate=4, tp=2, sp=True, ac="full", float8="tensorwise",
                    reshard_after_forward=False, async_tp=True)  # fmt: skip
    assert kernel_lower_bound_s(req, winner, hw) == pytest.approx(4.30, abs=0.005)


@settings(max_examples=40, deadline=None)
@given(
    schedule=st.sampled_from(["GPipe", "1F1B", "Interleaved1F1B", "ZBVZeroBubble", "InterleavedZeroBubble"]),
    pp=st.integers(2, 4),
    times=st.integers(1, 3),
    costs=st.lists(st.integers(1, 50), min_size=24, max_size=24),
    longer=st.lists(st.integers(0, 30), min_size=24, max_size=24),
)
def test_a_schedule_never_ends_sooner_with_longer_actions(schedule, pp, times, costs, longer) -> None:
    """What :func:`commsched.plan.prune.pipeline_kernel_bound_s` rests on: torch's schedule, simulated with free
    communication, never ends sooner when any stage's forward, input or weight gradient takes longer."""
    from commsched.pipeline import StageCosts, simulate_pipeline

    v = 1 if schedule in ("GPipe", "1F1B") else 2
    n = pp * v

    def step_s(add: list[int]) -> float:
        us = [1e-6 * (c + a) for c, a in zip(costs, add, strict=True)]
        stage = StageCosts(forward_s=us[:n], backward_input_s=us[8 : 8 + n], backward_weight_s=us[16 : 16 + n])
        return simulate_pipeline(schedule, pp, pp * times, v, stage, free_comm=True).step_s

    assert step_s(longer) >= step_s([0] * 24)

"""plan's layer scaling against full-depth traces (issue 40: the winner re-simulated at the full layer count is
within 2 % of the scaled estimate): llama-tiny at 8 layers, judged by plan's task at 2 and 4 layers scaled and at
all 8. The framework's order scales linearly; the optimised order (``optimize``'s search result at each depth) does
not yet (benchmarks/RESULTS.md, "plan: full-depth check")."""

from __future__ import annotations

import dataclasses

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commsched.plan import Layout, PlanRequest
from commsched.plan.judge import judge_task
from commsched.plan.scale import extrapolate
from commsched.plan.search import plan_hardware

REQ = PlanRequest(preset="llama-tiny", gpus=4, layers=8, global_batch=8, layers_scale=2)
TP_SP_FULL_AC = Layout(dp_shard=2, tp=2, sp=True, ac="full")
LINEAR = ("framework_step_s", "framework_peak_bytes", "framework_exposed_s", "recompute_s")
"""the row fields that scale within 2 % on this layout (the framework's order, simulated; its peak does not on
every layout: llama-tiny fsdp 4 +4.2 %, 405B -19 %, RESULTS.md)"""


@pytest.fixture(scope="module")
def judged(tmp_path_factory) -> tuple[dict, dict]:
    """(the row scaled from 2 and 4 layers, the row judged at all 8), optimised, as plan's task gives them."""
    spec = {"request": dataclasses.asdict(REQ), "hardware": plan_hardware(REQ), "optimize": True,
            "layouts": [TP_SP_FULL_AC.to_dict()]}  # fmt: skip
    with pytest.MonkeyPatch.context() as mp:
        mp.setenv("COMMSCHED_CACHE_DIR", str(tmp_path_factory.mktemp("verify_cache")))
        scaled, full = judge_task(spec)[0], judge_task({**spec, "layers": [None]})[0]
    assert scaled["error"] is None and full["error"] is None
    assert scaled["how"] == "2 and 4 layers scaled" and full["how"] == "all layers"
    return scaled, full


def test_the_framework_order_scales_within_2_percent(judged) -> None:
    scaled, full = judged
    for name in LINEAR:
        assert scaled[name] == pytest.approx(full[name], rel=0.02), name
    assert scaled["exposed_comm_s"] >= 0.0


@pytest.mark.xfail(strict=True, reason="optimize's result under the 1.05 x traced-peak budget is not linear in the "
                   "depth: +5.6 % at 8 layers (benchmarks/RESULTS.md, 'plan: full-depth check')")  # fmt: skip
def test_the_optimised_step_scales_within_2_percent(judged) -> None:
    scaled, full = judged
    assert scaled["optimized_step_s"] == pytest.approx(full["optimized_step_s"], rel=0.02)


@given(a=st.floats(0, 1e3), b=st.floats(0, 1e3), k=st.integers(1, 16), extra=st.integers(0, 200))
def test_extrapolation_is_exact_on_a_line_and_never_negative(a: float, b: float, k: int, extra: int) -> None:
    layers = k + extra
    y = extrapolate(a, b, k, layers)
    assert y >= 0.0
    assert y == pytest.approx(max(0.0, a + (layers - k) / k * (b - a)), rel=1e-12, abs=1e-12)
    assert extrapolate(a, b, k, k) == pytest.approx(a) and extrapolate(a, b, k, 2 * k) == pytest.approx(b)

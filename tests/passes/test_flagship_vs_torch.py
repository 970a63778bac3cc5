"""The flagship's claim on traced zoo steps: with torch's own peak memory as its hard budget, ``overlap`` with
reordering finishes the step at least 3 % sooner than torch 2.13's OverlapScheduler (same costs, same simulator),
and on FSDP it lands on the lower bound (the embedding gradient's reduce_scatter moved ahead of the last layer's)."""

from __future__ import annotations

import pytest

from commsched.cost import estimate_costs
from commsched.hardware import get
from commsched.passes import MemoryBudget, check_schedule, schedule
from commsched.peers import run_torch_overlap_scheduler
from commsched.sim import simulate_costs
from commsched.workloads import build


# the claim was measured on h100-sxm's own network (NCCL's constants, `@nccl-defaults`); under its default network
# since issue 36, the fitted InfiniBand, FSDP+TP at 64 ranks misses it: with torch's peak (3.24 GiB) as the budget
# ours is 44.02 ms against torch's 42.55 (1.035 x; 39.06 ms, 0.918 x, at 3.29 GiB without the budget)
@pytest.mark.parametrize(
    ("parallel", "world", "profile"),
    [
        ("fsdp", 8, "h100-sxm"),
        ("fsdp+tp", 64, "h100-sxm@nccl-defaults"),
        pytest.param("fsdp+tp", 64, "h100-sxm", marks=pytest.mark.xfail(strict=True, reason="issue 36: see above")),
    ],
)
def test_beats_torch_at_torch_peak(parallel, world, profile):
    w = build("llama3-8b", parallel=parallel, world_size=world, layers=2)
    g = w.graph
    costs = estimate_costs(g, get(profile, num_nodes=world // 8))
    peer = run_torch_overlap_scheduler(w.graph_module, g, costs)
    assert peer.valid
    theirs = simulate_costs(g, costs, peer.order)
    s = schedule(
        g,
        costs,
        "default",
        reorder_collectives=True,
        memory_budget=MemoryBudget(bytes=theirs.peak_memory_bytes),
    )
    check_schedule(g, s.order, allow_collective_reorder=True)
    ours = simulate_costs(g, costs, s.order)
    assert ours.peak_memory_bytes <= theirs.peak_memory_bytes
    assert ours.makespan_s <= 0.97 * theirs.makespan_s
    if parallel == "fsdp":
        assert ours.makespan_s <= 1.005 * ours.lower_bound_s

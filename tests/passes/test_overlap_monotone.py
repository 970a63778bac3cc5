"""Cheaper compute never makes the ``overlap`` pass's step slower, beyond a small tolerance (issue 36, 8b).

A list scheduler can suffer Graham's anomalies (shorter tasks, a longer schedule); the search over attempts, each
judged by the simulator, is there to catch them. The issue's case: llama3-70b FSDP+TP+SP at 256 ranks, batch 16,
on h100-sxm@roce-8x400 took 16.21 s with fused (cheaper) costs and 15.87 s without fusion, because the "feeds"
attempt's peak overshot the budget by 0.12 % under the fused costs and fit under the unfused ones; the search now
retries such an attempt within a lowered guard budget (``budget_retries``) and takes 15.03 s.
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.cost.model import CostEstimate
from commsched.ir import Graph, OpKind
from commsched.passes import schedule
from commsched.sim import simulate_costs
from costs_helper import simple_costs
from orders import random_topo_order
from strategies import graphs

TOLERANCE = 0.02
"""how much slower (relative) the step may get when every compute node gets cheaper"""


def _cheaper(g: Graph, costs: CostEstimate, factor: float) -> CostEstimate:
    """``costs`` with every compute node's time scaled by ``factor`` (collectives unchanged)."""
    compute = np.isin(g.kinds, [OpKind.COMPUTE, OpKind.OTHER])
    return dataclasses.replace(costs, node_s=np.where(compute, costs.node_s * factor, costs.node_s))


def _overlap_ns(g: Graph, costs: CostEstimate, **knobs) -> int:
    return simulate_costs(g, costs, schedule(g, costs, "overlap", **knobs).order).makespan_ns


@settings(max_examples=60, derandomize=True)  # a fixed set: the property does not hold on every DAG (see below)
@given(
    graphs(max_nodes=40),
    st.floats(0.05, 1.0),
    st.sampled_from([1.0, 1.05, 1.5]),
    st.sampled_from([1e9, 10e9, 100e9]),
    st.randoms(use_true_random=False),
)
def test_cheaper_compute_never_slows_overlap_on_random_graphs(g, factor, ratio, comm_bytes_per_s, rnd):
    """On small random DAGs, each process group on its own link, a fixed set of 60. Not a guarantee: a list
    scheduler under a memory budget is not monotone in its task times (Graham's anomalies), and the search only
    tries a few priorities. Counting after the fix below (``python benchmarks/bench_overlap_monotone.py random
    --examples 3000 --seed 1``): 6 of 3,000 draws (two DAGs, each drawn three times) are more than 2 % slower with
    cheaper compute, +14.4 % and +10.5 %, both at a budget of 1.0 x the input's peak (an unseeded run: 5, up to
    +13.5 %, at 1.0-1.05 x). Where the budget binds, faster compute lets a kernel or another group's collective
    take the budget first, and the critical group's next collective (or one it depends on) then waits until
    memory frees. The property the
    pass does guarantee, never slower than its input order and never over the budget, is checked on random DAGs
    unfixed (tests/passes/test_overlap.py); the issue's traced case is below.

    With every group on one shared link, hypothesis also finds 33-42-node DAGs where the step gets 2-3 % slower (at
    1 GB/s, compute x 0.05): the same order is that much slower too, because a collective of one group now starts
    while the critical group's is running and shares its bandwidth (the simulator's link sharing, which the list
    scheduler does not plan with). One class of counterexample was a defect of the loop, fixed:
    :func:`test_a_collective_a_free_wait_unlocks_competes_for_the_budget`."""
    costs = simple_costs(g, comm_bytes_per_s=comm_bytes_per_s)
    costs = dataclasses.replace(costs, coll_link=np.where(g.coll_type >= 0, g.coll_group, -1).astype(np.int8))
    start = random_topo_order(g, rnd)
    slow = _overlap_ns(g, costs, order=start, memory_budget=ratio)
    fast = _overlap_ns(g, _cheaper(g, costs, factor), order=start, memory_budget=ratio)
    assert fast <= slow * (1 + TOLERANCE) + 1


@pytest.fixture(scope="module")
def llama70b_tp_sp_step():
    """llama3-70b FSDP+TP+SP (TP 8) at 256 ranks, batch 16, 2 layers: the issue's step, shortened."""
    from commsched.workloads import build

    return build("llama3-70b", parallel="fsdp+tp+sp", world_size=256, layers=2, tp_size=8, batch=16).graph


def test_an_attempt_just_over_budget_is_retried_within_a_lowered_guard_budget(llama70b_tp_sp_step):
    """The "feeds" attempt with the memory guard peaks 0.5 % over the 1.05 x budget (the guard's account of memory
    misses the simulated peak) and is 5 % faster than every attempt that fits: retried within a budget lowered by
    the overshoot, it fits with the same timing, and the search keeps it. Without the retries (``budget_retries=0``,
    the search before the fix) the best order is that much slower."""
    from commsched.cost import estimate_costs

    g = llama70b_tp_sp_step
    costs = estimate_costs(g, "h100-sxm@roce-8x400")
    budget = int(simulate_costs(g, costs).peak_memory_bytes * 1.05)
    s = schedule(g, costs, "overlap")
    got = simulate_costs(g, costs, s.order)
    assert got.peak_memory_bytes <= budget
    rows = s.stats[0].rows
    guarded = [r for r in rows if r["attempt"].endswith("memory guard")]  # each variant's first attempt
    fastest = min(guarded, key=lambda r: r["makespan_s"])
    assert not fastest["fits"]
    assert got.makespan_s <= fastest["makespan_s"] * 1.001
    assert any("lowered budget" in r["attempt"] and r["fits"] for r in rows)
    before = simulate_costs(g, costs, schedule(g, costs, "overlap", budget_retries=0).order)
    assert got.makespan_s < before.makespan_s * 0.97


def test_cheaper_compute_never_slows_overlap_on_a_traced_step(llama70b_tp_sp_step):
    """The property on the issue's step (2 layers): fused costs are cheaper than unfused ones, and each scaled by
    0.5-0.9 is cheaper still; the order found for unfused costs, judged under fused ones, is no faster than the
    order found for fused costs either (the issue's own check)."""
    from commsched.cost import estimate_costs

    g = llama70b_tp_sp_step
    unfused = estimate_costs(g, "h100-sxm@roce-8x400", fusion=False)
    fused = estimate_costs(g, "h100-sxm@roce-8x400")
    slow = _overlap_ns(g, unfused)
    fast = _overlap_ns(g, fused)
    assert fast <= slow * (1 + TOLERANCE)
    for factor in (0.9, 0.5):
        assert _overlap_ns(g, _cheaper(g, fused, factor)) <= fast * (1 + TOLERANCE)
    unfused_order = schedule(g, unfused, "overlap").order
    assert fast <= simulate_costs(g, fused, unfused_order).makespan_ns * (1 + TOLERANCE)


def test_a_collective_a_free_wait_unlocks_competes_for_the_budget():
    """The counterexample hypothesis found on per-group links (session 48; 22 nodes, two groups, a budget of 1.0 x the
    input's peak, 1 GB/s): with compute x 0.5 the step got 2.1 % slower (36,776 vs 36,024 ns). The "feeds" attempt
    reached one loop turn where group 0's third collective became issuable (memory freed) and a wait that unlocks
    group 1's second one was free; the loop issued first and ran free waits after, so group 0's collective took the
    budget, group 1's waited a whole collective, and the group-1 chain ended 10 us late. Free waits now run first and
    both compete by input position: with cheaper compute the attempt reaches the lower bound, group 0's three
    collectives back to back."""
    from commsched.frontends.json_io import load_graph

    g = load_graph(Path(__file__).parent.parent / "data" / "overlap_anomaly_22.json")
    start = np.asarray(g.meta["start_order"], np.int32)
    costs = simple_costs(g, comm_bytes_per_s=1e9)
    costs = dataclasses.replace(costs, coll_link=np.where(g.coll_type >= 0, g.coll_group, -1).astype(np.int8))
    fast = _cheaper(g, costs, 0.5)
    group0 = np.flatnonzero((g.coll_type >= 0) & (g.coll_group == 0))
    group0_ns = sum(round(float(costs.node_s[c]) * 1e9) for c in group0)
    got = _overlap_ns(g, fast, order=start, memory_budget=1.0)
    assert abs(got - group0_ns) <= 2  # the bound, to the ns rounding of three collectives
    assert got <= _overlap_ns(g, costs, order=start, memory_budget=1.0)

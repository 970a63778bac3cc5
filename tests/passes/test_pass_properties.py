"""Property test of every registered pass on random DAGs with collectives on several process groups.

Each example runs every heuristic pass (and, on tiny graphs, the exact one) from a random valid start order, so
the default profile checks about 5,000 pass runs (``HYPOTHESIS_PROFILE=thorough``: 2,000 examples, 16,000):
valid topological order, every group's collective order unchanged, peak-memory budgets respected (full recompute),
and the flagship never worse than its input.
"""

from __future__ import annotations

import dataclasses

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.ir.order import collective_chains
from commsched.memory import memory_profile
from commsched.passes import PASSES, check_schedule, schedule
from commsched.passes.budget import MemoryBudget
from commsched.sim import simulate_costs
from costs_helper import simple_costs
from orders import random_topo_order
from strategies import graphs

HEURISTIC = sorted(p for p in PASSES if p != "exact")
BUDGET_KNOB = {
    "reorder_communication_preserving_peak_memory": "memory_budget",
    "sink_waits_iterative": "memory_budget",
    "overlap": "memory_budget",
}


@settings(max_examples=max(600, settings().max_examples))  # the thorough profile's count where it is larger
@given(graphs(max_nodes=48), st.sampled_from([0.0, 0.05, 0.5]), st.randoms(use_true_random=False))
def test_every_pass_on_random_graphs(g, budget, rnd):
    costs = simple_costs(g, comm_bytes_per_s=rnd.choice([1e9, 20e9, 400e9]))
    start = random_topo_order(g, rnd)
    base_peak = memory_profile(g, start).peak_bytes
    want = collective_chains(g, start)
    for name in HEURISTIC + (["exact"] if len(g) <= 14 else []):
        knobs = {}
        if name in BUDGET_KNOB:
            knobs[BUDGET_KNOB[name]] = 1.0 + budget if name == "overlap" else MemoryBudget(ratio=1.0 + budget)
        if name == "exact":
            knobs = {"time_limit_s": 5.0, "memory_budget": None}
        s = schedule(g, costs, [name], order=start, **knobs)
        check_schedule(g, s.order, start)
        got = collective_chains(g, s.order)
        assert all(np.array_equal(want[k], got[k]) for k in want), name
        if name in BUDGET_KNOB:
            limit = int(base_peak * (1.0 + budget)) if name == "overlap" else base_peak + int(base_peak * budget)
            assert memory_profile(g, s.order).peak_bytes <= limit, name
        if name == "overlap":
            assert simulate_costs(g, costs, s.order).makespan_s <= simulate_costs(g, costs, start).makespan_s


@settings(max_examples=300)
@given(graphs(max_nodes=48), st.sampled_from([0.0, 0.05, 0.5]), st.randoms(use_true_random=False))
def test_overlap_with_reordering_on_random_graphs(g, budget, rnd):
    """Reordering within groups (Jackson rounds, promotions, moves of the most exposed collective): still a valid
    order, within the hard budget, never worse than its input, and the same order on a second run (every rank
    computes it for itself)."""
    costs = simple_costs(g, comm_bytes_per_s=rnd.choice([1e9, 20e9, 400e9]))
    # CPU-like runs: compute and communication slow each other down
    costs = dataclasses.replace(costs, compute_slowdown=rnd.choice([1.0, 1.4]), comm_slowdown=rnd.choice([1.0, 2.0]))
    start = random_topo_order(g, rnd)
    base = simulate_costs(g, costs, start)
    s = schedule(g, costs, ["overlap"], order=start, reorder_collectives=True, memory_budget=1.0 + budget)
    check_schedule(g, s.order, start, allow_collective_reorder=True)
    res = simulate_costs(g, costs, s.order)
    assert res.peak_memory_bytes <= int(base.peak_memory_bytes * (1.0 + budget))
    assert res.makespan_ns <= base.makespan_ns
    again = schedule(g, costs, ["overlap"], order=start, reorder_collectives=True, memory_budget=1.0 + budget)
    assert np.array_equal(s.order, again.order)


@settings(max_examples=200)
@given(graphs(max_nodes=40, p_sync=0.5), st.randoms(use_true_random=False))
def test_overlap_reordering_with_synchronous_collectives_is_cycle_free(g, rnd):
    """Synchronous collectives with control dependencies on earlier collectives of their group: each group's
    rebuilt order is made consistent with the graph (no "ordering constraints have a cycle"), the result is a valid
    schedule, never worse than its input and the same on every run."""
    costs = simple_costs(g, comm_bytes_per_s=rnd.choice([1e9, 20e9, 400e9]))
    start = random_topo_order(g, rnd)
    s = schedule(g, costs, ["overlap"], order=start, reorder_collectives=True)
    check_schedule(g, s.order, start, allow_collective_reorder=True)
    assert simulate_costs(g, costs, s.order).makespan_ns <= simulate_costs(g, costs, start).makespan_ns
    again = schedule(g, costs, ["overlap"], order=start, reorder_collectives=True)
    assert np.array_equal(s.order, again.order)

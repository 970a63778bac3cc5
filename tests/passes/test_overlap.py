"""The flagship ``overlap`` pass and the exact CP-SAT scheduler: optimality gap, budget, invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.ir.order import collective_chains
from commsched.memory import memory_profile
from commsched.passes import MemoryBudget, check_schedule, schedule
from commsched.passes.exact import solve_exact
from commsched.sim import simulate_costs
from costs_helper import simple_costs
from orders import random_topo_order
from programs import trace_pressure, trace_program
from strategies import graphs


def _makespan_s(g, costs, order):
    return simulate_costs(g, costs, np.asarray(order, np.int32)).makespan_s


@pytest.mark.parametrize(("layers", "comm_bytes_per_s", "compute_scale"), [(3, 50e9, 20), (3, 5e9, 1), (2, 20e9, 5)])
def test_overlap_within_3_percent_of_cp_sat_optimum(layers, comm_bytes_per_s, compute_scale):
    _, g = trace_program("fsdp_mlp", 8, layers=layers, dim=512)
    costs = simple_costs(g, comm_bytes_per_s=comm_bytes_per_s, compute_scale=compute_scale)
    budget = int(memory_profile(g).peak_bytes * 1.05)
    ours = schedule(g, costs, "default")
    exact = solve_exact(g, costs, memory_budget_bytes=budget, time_limit_s=30, hint=ours.order)
    assert exact.optimal
    # the extracted order reproduces the solver's makespan, and respects the budget
    assert _makespan_s(g, costs, exact.order) == pytest.approx(exact.makespan_s, rel=1e-4)
    assert memory_profile(g, exact.order).peak_bytes <= budget * 1.001
    ours_s = _makespan_s(g, costs, ours.order)
    assert ours_s <= exact.makespan_s * 1.03
    assert ours_s >= exact.lower_bound_s * (1 - 1e-4)  # nothing beats a proven bound


def test_overlap_hard_budget_and_clear_error():
    _, g = trace_pressure()
    costs = simple_costs(g, comm_bytes_per_s=1e9)
    base = memory_profile(g).peak_bytes
    tight = schedule(g, costs, "default", memory_budget=1.0)
    assert memory_profile(g, tight.order).peak_bytes <= base
    loose = schedule(g, costs, "default", memory_budget=3.0)
    assert _makespan_s(g, costs, loose.order) <= _makespan_s(g, costs, tight.order)
    with pytest.raises(ValueError, match="no order found within the memory budget"):
        schedule(g, costs, "default", memory_budget=MemoryBudget(bytes=base // 2))


@settings(max_examples=100)
@given(graphs(max_nodes=60), st.sampled_from([1.0, 1.05, 1.5]), st.randoms(use_true_random=False))
def test_overlap_on_random_graphs(g, ratio, rnd):
    costs = simple_costs(g, comm_bytes_per_s=rnd.choice([1e9, 10e9, 100e9]))
    start = random_topo_order(g, rnd)
    s = schedule(g, costs, "default", order=start, memory_budget=ratio)
    check_schedule(g, s.order, start)
    a, b = collective_chains(g, start), collective_chains(g, s.order)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    base = memory_profile(g, start).peak_bytes
    assert memory_profile(g, s.order).peak_bytes <= int(base * ratio)
    assert _makespan_s(g, costs, s.order) <= _makespan_s(g, costs, start) + 1e-12


def test_feeders_are_the_casts_right_before_the_busiest_groups_collectives():
    """The 'feeders' priority's set on a traced FSDP+TP step: what directly produces a collective of the busiest
    group (the gradient's cast before its reduce_scatter) is in it; the bulk of the compute is not."""
    from commsched.cost import estimate_costs
    from commsched.hardware import get
    from commsched.passes.overlap_prep import base_arrays, feeders
    from commsched.workloads import build

    g = build("llama3-8b", parallel="fsdp+tp", world_size=64, layers=1).graph
    costs = estimate_costs(g, get("h100-sxm", num_nodes=8))
    dur, _, _ = base_arrays(g, costs)
    flag = np.asarray(feeders(g, dur, np.arange(len(g))))
    is_coll = g.coll_type >= 0
    comm = np.bincount(g.coll_group[is_coll], weights=dur[is_coll])
    busiest = int(np.argmax(comm))
    timed_preds = 0
    for c in np.flatnonzero(is_coll & (g.coll_group == busiest)).tolist():
        for q in g.predecessors(c).tolist():
            if dur[q] > 0:
                timed_preds += 1
                assert flag[q], g.names[q]
    assert timed_preds > 0
    kernels = (dur > 0) & ~is_coll
    assert flag[kernels].mean() < 0.3


def test_late_waits_sit_just_before_first_use_and_cost_no_time():
    """waits="late" on a traced FSDP step: no slower in simulation (it is kept only then), and every wait directly
    precedes its first user or keeps its place (never earlier than with the default placement)."""
    from commsched.cost import estimate_costs
    from commsched.hardware import get
    from commsched.workloads import build

    g = build("llama3-8b", parallel="fsdp", world_size=8, layers=2).graph
    costs = estimate_costs(g, get("h100-sxm"))
    early = schedule(g, costs, "default", memory_budget=None)
    late = schedule(g, costs, "default", memory_budget=None, waits="late")
    check_schedule(g, late.order)
    assert simulate_costs(g, costs, late.order).makespan_ns <= simulate_costs(g, costs, early.order).makespan_ns

    def just_before_first_use(order) -> int:
        pos = np.empty(len(g), np.int64)
        pos[order] = np.arange(len(g))
        count = 0
        for w in np.flatnonzero(g.wait_of >= 0).tolist():
            users = g.successors(w)
            if users.size:
                first = int(pos[users].min())
                assert pos[w] < first
                count += int(pos[w] == first - 1)
        return count

    assert just_before_first_use(late.order) > just_before_first_use(early.order)


def test_unknown_wait_placement_is_refused_before_any_work():
    g = trace_program("fsdp_mlp", 8)[1]
    with pytest.raises(ValueError, match="waits='soon'"):
        schedule(g, simple_costs(g), "default", waits="soon")

"""Lower bounds: Jackson's preemptive rule against a brute-force unit-step schedule, forced idle time, and the
whole bound against the best orders the schedulers and random search find."""

from __future__ import annotations

import random

import numpy as np
from hypothesis import given
from hypothesis import strategies as st

from commsched.cost.model import CostEstimate
from commsched.passes import schedule
from commsched.sim import simulate_costs
from commsched.sim.bounds import forced_idle_ns, preemptive_jackson_ns
from orders import random_topo_order
from strategies import graphs


def brute_force(release, work, delivery):
    """Unit-step preemptive schedule: at every step run the released job with the longest delivery time."""
    n, rem, t, best, done = len(work), list(work), 0, 0, 0
    while done < n:
        ready = [j for j in range(n) if release[j] <= t and rem[j] > 0]
        if not ready:
            t = min(release[j] for j in range(n) if rem[j] > 0)
            continue
        j = max(ready, key=lambda j: (delivery[j], -j))
        rem[j] -= 1
        t += 1
        if rem[j] == 0:
            done += 1
            best = max(best, t + delivery[j])
    return best


jobs = st.integers(1, 8).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 12), min_size=n, max_size=n),
        st.lists(st.integers(1, 6), min_size=n, max_size=n),
        st.lists(st.integers(0, 12), min_size=n, max_size=n),
    )
)


@given(jobs)
def test_jackson_matches_brute_force(job):
    release, work, delivery = job
    assert preemptive_jackson_ns(release, work, delivery) == brute_force(release, work, delivery)


def test_jackson_charges_head_and_tail():
    # one job released at 5 with 3 units of work and 4 after it: nothing can finish before 12
    assert preemptive_jackson_ns([5], [3], [4]) == 12
    # a long tail job preempts a short-tail one as soon as it is released
    assert preemptive_jackson_ns([0, 1], [4, 1], [0, 10]) == 12


def test_forced_idle_counts_only_work_available_before_each_time():
    # kernels available at 0 (2 ns), 10 (5 ns) and 10 (1 ns): [0, 10] has at least 10 - 1.5 * 2 = 7 ns idle
    assert forced_idle_ns([10, 0, 10], [5, 2, 1], 1.5) == [(10, 7.0)]
    # enough early work: no forced idle
    assert forced_idle_ns([0, 4], [8, 1], 1.0) == []


@st.composite
def tight_scenarios(draw):
    """Small random DAGs with interference, and orders that are as good as the schedulers make them."""
    g = draw(graphs(max_nodes=14, max_groups=2, p_collective=0.35))
    n = len(g)
    us = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    node_s = np.asarray(us, float) * 1e-6
    costs = CostEstimate(
        node_s=node_s,
        coll_latency_s=node_s * 0.25,
        coll_link=np.zeros(n, np.int8),
        compute_slowdown=draw(st.sampled_from([1.0, 1.2, 2.0, 4.0])),
    )
    return g, costs, draw(st.integers(0, 2**31))


@given(tight_scenarios())
def test_no_schedule_beats_the_bound(scenario):
    """The bound holds for the best orders we can find: every scheduler's and many random topological orders."""
    g, costs, seed = scenario
    orders = [random_topo_order(g, random.Random(seed + k)) for k in range(40)]
    for passes, knobs in ((["overlap"], {"memory_budget": None}), (["sink_waits"], {}), (["raise_comms"], {})):
        orders.append(schedule(g, costs, passes, **knobs).order)
    bound = simulate_costs(g, costs).lower_bound_s
    for order in orders:
        assert simulate_costs(g, costs, order).makespan_s >= bound * (1 - 1e-9)


def test_forced_idle_raises_the_bound_on_a_traced_multi_node_fsdp_step():
    """Across 32 nodes the first all_gather (the embedding) cannot be hidden: the bound charges it, above the plain
    interference term ``W + (1 - 1/s) C``."""
    from commsched.cost import estimate_costs
    from commsched.hardware import get
    from commsched.workloads import build

    g = build("llama3-8b", parallel="fsdp", world_size=256, layers=2).graph
    costs = estimate_costs(g, get("h100-sxm", num_nodes=32))
    b = simulate_costs(g, costs).bound
    plain = b.compute_s + (1 - 1 / costs.compute_slowdown) * max(b.comm_s.values())
    assert b.interference_s > plain + 1e-3
    assert b.value_s >= b.interference_s

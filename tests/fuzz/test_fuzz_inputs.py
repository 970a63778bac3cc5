"""Issue 20's fuzz suite, bounded for ``make test`` (``benchmarks/bench_fuzz.py`` runs it longer): mutated graph
files, cost tables, hardware profiles and Chrome traces end in ``ok`` or the documented one-line error naming the
file, never a crash, a hang (each case runs under a time limit) or a wrong number; random DAGs with synchronous
collectives and control dependencies, with extreme but possible costs, simulate and schedule to numbers that obey
the bounds (makespan >= the critical path and >= every stream's busy time, utilisation in [0, 1])."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.cost import CostEstimate
from commsched.passes import check_schedule, schedule
from commsched.sim import simulate_costs
from commsched.sim.model import HORIZON_NS
from fuzz_inputs import KINDS, check_simulation, mutated_case, run_case, time_limit
from strategies import graphs

CASES = settings(max_examples=40, deadline=None, database=None)


@pytest.mark.parametrize("kind", KINDS)
@CASES
@given(seed=st.integers(0, 2**32 - 1))
def test_mutated_input_files(tmp_path_factory, kind, seed):
    data, how = mutated_case(random.Random(seed), kind)
    outcome, detail = run_case(kind, data, tmp_path_factory.mktemp(kind), limit_s=10.0)
    assert outcome in ("ok", "error"), f"{kind} ({how}, seed {seed}): {outcome}: {detail}"


def _costs(g, draw) -> CostEstimate:
    """Per-node costs from a ns to far beyond a real step, with slowdowns and a sync, within the horizon."""
    n = len(g)
    scale = draw(st.sampled_from([1e-9, 1e-6, 1e-3, 1.0, 1e3]))
    node_s = np.asarray(draw(st.lists(st.floats(0, 1), min_size=n, max_size=n)), np.float64) * scale
    is_coll = g.coll_type >= 0
    latency = np.where(is_coll, node_s * draw(st.floats(0, 1)), 0.0)
    return CostEstimate(
        node_s=node_s,
        coll_latency_s=latency,
        coll_link=np.where(is_coll, draw(st.integers(0, 1)), -1).astype(np.int8),
        compute_slowdown=draw(st.sampled_from([1.0, 1.3, 4.0])),
        comm_slowdown=draw(st.sampled_from([1.0, 2.0])),
        stream_sync_s=draw(st.sampled_from([0.0, 1e-6, 1e-3])),
    )


@settings(max_examples=60, deadline=None, database=None)
@given(g=graphs(max_nodes=30, p_sync=0.4), data=st.data())
def test_random_dags_simulate_to_right_numbers(g, data):
    costs = _costs(g, data.draw)
    streams = data.draw(st.sampled_from([None, "two"]))
    with time_limit(10.0):
        assert check_simulation(g, costs) is None
        if streams:
            res = simulate_costs(g, costs, streams=np.arange(len(g)) % 2)
            assert res.makespan_s * (1 + 1e-9) + 1e-9 >= res.bound.critical_path_s
            assert int(res.stream_busy_ns.max(initial=0)) <= res.makespan_ns


@settings(max_examples=25, deadline=None, database=None)
@given(g=graphs(max_nodes=25, p_sync=0.4), data=st.data())
def test_random_dags_schedule_to_valid_orders(g, data):
    costs = _costs(g, data.draw)
    with time_limit(15.0):
        sched = schedule(g, costs)
        check_schedule(g, sched.order)
        assert check_simulation(g, costs) is None


@settings(max_examples=30, deadline=None, database=None)
@given(g=graphs(max_nodes=20, p_sync=0.4), factor=st.sampled_from([1.0, 10.0, 1e6, 1e300]))
def test_costs_beyond_the_horizon_are_named_errors(g, factor):
    timed = np.isin(g.kinds, (1, 2, 5))
    if not timed.any():
        return
    node_s = np.where(timed, HORIZON_NS * 1e-9 * factor, 0.0)
    with time_limit(5.0), pytest.raises(ValueError, match=r"node '.+' takes .* expected a step under"):
        simulate_costs(g, CostEstimate.from_times(node_s))

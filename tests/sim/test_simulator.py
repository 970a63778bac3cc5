"""Simulator semantics on traced graphs (hand-derived cases) and invariants on random DAGs."""

from __future__ import annotations

import sys
from unittest import mock

import numpy as np
import pytest
from hypothesis import given
from hypothesis import strategies as st

from commsched.cost import CostEstimate, LinkClass
from commsched.ir import GraphError, OpKind
from commsched.memory import memory_profile
from commsched.sim import simulate_costs
from commsched.sim.jit import ENABLED as JIT_ENABLED
from programs import trace_program
from sim_helpers import assert_valid_simulation, eager_wait_order, layer_costs, simple_costs, trace_two_group_layer
from strategies import graphs

US = 1e-6


@pytest.fixture(scope="module")
def traced():
    return {kind: trace_program(kind, 8)[1] for kind in ("fsdp_mlp", "every_collective", "inplace")}


@pytest.fixture(scope="module")
def layer():
    return trace_two_group_layer()


# ---------------------------------------------------------------- closed forms on traced graphs
@pytest.mark.parametrize("kind", ["fsdp_mlp", "every_collective", "inplace"])
def test_zero_comm_cost_makespan_is_compute_sum(traced, kind):
    g = traced[kind]
    costs = simple_costs(g, compute_slowdown=1.5, comm_scale=0.0)
    res = simulate_costs(g, costs)
    kernels = np.isin(g.kinds, (OpKind.COMPUTE, OpKind.OTHER))
    assert res.makespan_ns == res.standalone_ns[kernels].sum()
    assert res.exposed_comm_s == 0
    assert_valid_simulation(res)


@pytest.mark.parametrize("kind", ["fsdp_mlp", "every_collective", "inplace"])
@pytest.mark.parametrize("sync_us", [0.0, 3.0])
def test_waits_right_after_collectives_serialise_everything(traced, kind, sync_us):
    g = traced[kind]
    costs = simple_costs(g, compute_slowdown=1.7, stream_sync_s=sync_us * US)
    order = eager_wait_order(g)
    res = simulate_costs(g, costs, order)
    # nothing overlaps, so interference never applies; each collective pays one sync to start and one to be waited
    expected = int(res.standalone_ns.sum()) + 2 * round(sync_us * 1e3) * len(g.collectives)
    assert res.makespan_ns == expected
    assert res.overlap_ratio == 0.0
    assert_valid_simulation(res)


INTER, INTRA = LinkClass.INTER_NODE, LinkClass.INTRA_NODE


@pytest.mark.parametrize(
    ("case", "kw", "makespan_us", "exposed_ag_us", "ag_end_us"),
    [
        # compute 0-5 (mm, relu) hides 5 of the all_gather's 10 us; the all_reduce (other link) ends at 6
        ("alone", {"link_ag": INTER, "link_ar": INTRA}, 14, 5, 10),
        # same link: both at half bandwidth; the all_reduce ends at 12, the all_gather (4 us left alone) at 16
        ("shared link", {"link_ag": INTRA, "link_ar": INTRA}, 20, 11, 16),
        # interference 1.5x: mm takes 6, relu 1.5 (comm still running), so the wait holds 10 - 7.5
        ("interference", {"link_ag": INTER, "link_ar": INTRA, "slowdown": 1.5}, 14, 2.5, 10),
        # 2 us latency then 8 us bandwidth: all_reduce alone 0-2, shared 2-10; all_gather shared 2-10, alone 10-14
        ("latency", {"link_ag": INTRA, "link_ar": INTRA, "lat_ag": 2.0}, 18, 9, 14),
        # 1 us sync: the all_gather runs 1-11 and the wait unblocks at 12
        ("sync", {"link_ag": INTER, "link_ar": INTRA, "sync_s": 1 * US}, 16, 7, 11),
        # comm 2x slower while kernels run: 2.5 of the all_gather's 10 us done by 5, the rest alone until 12.5
        ("comm slowdown", {"link_ag": INTER, "link_ar": INTRA, "comm_slowdown": 2.0}, 16.5, 7.5, 12.5),
        # both ways: mm runs 4 x 1.5 = 6 (comm 3 us), relu 1.5 (0.75): 3.75 done by 7.5, the rest until 13.75
        ("both", {"link_ag": INTER, "link_ar": INTRA, "slowdown": 1.5, "comm_slowdown": 2.0}, 17.75, 6.25, 13.75),
    ],
)
def test_hand_derived_exposure_on_traced_layer(layer, case, kw, makespan_us, exposed_ag_us, ag_end_us):
    g = layer
    res = simulate_costs(g, layer_costs(g, **kw))
    events = simulate_costs(g, layer_costs(g, **kw), engine="events")
    assert np.array_equal(res.end_ns, events.end_ns), case
    ag = g.id_of("all_gather_into_tensor")
    assert res.makespan_s == pytest.approx(makespan_us * US, abs=1e-12), case
    assert res.exposed_comm_by_collective_s["all_gather_into_tensor"] == pytest.approx(exposed_ag_us * US, abs=1e-12)
    assert res.exposed_comm_by_collective_s["all_reduce"] == 0
    assert res.end_ns[ag] == round(ag_end_us * 1e3)
    assert_valid_simulation(res)


def test_overlap_ratio_and_utilisation_by_hand(layer):
    res = simulate_costs(layer, layer_costs(layer, INTER, INTRA))
    # comm runs over [0, 10] (union of both collectives); compute over [0, 5] and [10, 14]
    assert res.overlap_ratio == pytest.approx(0.5)
    util = res.stream_utilization
    assert util["compute:0"] == pytest.approx(9 / 14)
    assert util["comm:0"] == pytest.approx(10 / 14) and util["comm:1"] == pytest.approx(6 / 14)
    # critical path: all_gather (10), its wait, mm_1 (3), add (1): this schedule is optimal
    assert res.lower_bound_s == pytest.approx(14 * US)
    assert res.bound_ratio == pytest.approx(1.0)
    assert res.bound.binding == "critical path"
    assert res.peak_memory_bytes == memory_profile(layer).peak_bytes


def test_synchronous_collective_blocks_its_stream(layer):
    # turn the all_gather into a synchronous one by dropping its wait semantics in a copy of the arrays
    g = layer
    costs = layer_costs(g, INTER, INTRA)
    g.coll_sync[g.id_of("all_gather_into_tensor")] = True
    try:
        res = simulate_costs(g, costs)
    finally:
        g.coll_sync[g.id_of("all_gather_into_tensor")] = False
    ag = g.id_of("all_gather_into_tensor")
    assert res.blocked_ns[ag] == 10_000  # the issuing stream waited the whole collective
    assert res.start_ns[g.id_of("mm")] == 10_000


def test_multi_stream_cross_stream_dependency_pays_sync(layer):
    g = layer
    costs = layer_costs(g, INTER, INTRA, sync_s=1 * US)
    streams = np.zeros(len(g), np.int64)
    streams[[g.id_of("t"), g.id_of("mm")]] = 1  # mm (and the view it reads) on stream 1, relu (its user) on 0
    res = simulate_costs(g, costs, streams=streams)
    assert res.start_ns[g.id_of("mm")] == 0
    assert res.start_ns[g.id_of("relu")] == 5_000  # mm ends at 4, plus 1 us cross-stream sync
    assert res.stream_names[:2] == ("compute:0", "compute:1")
    assert_valid_simulation(res)


def test_bad_inputs_are_named(layer):
    g = layer
    costs = layer_costs(g, INTER, INTRA)
    order = list(g.names)
    order[3], order[g.id_of("wait_tensor")] = order[g.id_of("wait_tensor")], order[3]
    with pytest.raises(GraphError, match="before its predecessor"):
        simulate_costs(g, costs, order)
    with pytest.raises(GraphError, match="no node named"):
        simulate_costs(g, costs, ["nope", *order[1:]])
    with pytest.raises(ValueError, match="streams"):
        simulate_costs(g, costs, streams=[0, 1])
    with pytest.raises(ValueError, match="entries"):
        simulate_costs(g, CostEstimate.from_times(np.zeros(3)))


def test_order_by_name_equals_order_by_id(traced):
    g = traced["fsdp_mlp"]
    costs = simple_costs(g, compute_slowdown=1.2)
    order = eager_wait_order(g)
    a = simulate_costs(g, costs, order)
    b = simulate_costs(g, costs, [g.names[i] for i in order])
    assert np.array_equal(a.start_ns, b.start_ns) and np.array_equal(a.end_ns, b.end_ns)


# ---------------------------------------------------------------- properties on random DAGs
@st.composite
def scenarios(draw, p_sync: float = 0.0):
    g = draw(graphs(max_nodes=40, max_groups=3, p_sync=p_sync))
    n = len(g)
    us = draw(st.lists(st.integers(0, 50), min_size=n, max_size=n))
    node_s = np.asarray(us, float) * US
    lat_frac = draw(st.lists(st.sampled_from([0.0, 0.25, 1.0]), min_size=n, max_size=n))
    link = np.asarray(draw(st.lists(st.sampled_from([0, 1]), min_size=n, max_size=n)), np.int8)
    costs = CostEstimate(
        node_s=node_s,
        coll_latency_s=node_s * np.asarray(lat_frac),
        coll_link=link,
        compute_slowdown=draw(st.sampled_from([1.0, 1.25, 2.0])),
        stream_sync_s=draw(st.sampled_from([0.0, 1e-6, 2.5e-7])),
        comm_slowdown=draw(st.sampled_from([1.0, 1.0, 1.5, 3.0])),
    )
    # a random topological order: Kahn with random picks
    seed = draw(st.integers(0, 2**31))
    rng = np.random.default_rng(seed)
    ptr, idx = g.successors_csr()
    indeg = np.diff(g.predecessors_csr()[0]).tolist()
    ready = [i for i in range(n) if indeg[i] == 0]
    order = []
    while ready:
        v = ready.pop(int(rng.integers(len(ready))))
        order.append(v)
        for s in idx[ptr[v] : ptr[v + 1]].tolist():
            indeg[s] -= 1
            if indeg[s] == 0:
                ready.append(s)
    num_streams = draw(st.integers(1, 3))
    streams = rng.integers(0, num_streams, n)
    return g, costs, np.asarray(order), streams


@given(scenarios())
def test_invariants_on_random_dags(scenario):
    g, costs, order, streams = scenario
    res = simulate_costs(g, costs, order, streams)
    assert_valid_simulation(res)
    assert res.makespan_s >= res.lower_bound_s - 1e-12
    assert 0.0 <= res.overlap_ratio <= 1.0
    assert res.peak_memory_bytes == memory_profile(g, order).peak_bytes


@given(scenarios())
def test_single_stream_loop_equals_event_loop(scenario):
    g, costs, order, _ = scenario
    fast = simulate_costs(g, costs, order)
    events = simulate_costs(g, costs, order, engine="events")
    for field in ("start_ns", "end_ns", "issue_ns", "blocked_ns"):
        assert np.array_equal(getattr(fast, field), getattr(events, field)), field


@pytest.mark.skipif(not JIT_ENABLED, reason="numba is a dependency; COMMSCHED_JIT=0 turns the compiled loop off")
@given(st.one_of(scenarios(), scenarios(p_sync=0.3)))
def test_compiled_single_stream_loop_equals_python_loop(scenario):
    """The compiled single-stream loop (commsched.sim.engine_jit) times every node as the Python loop does (also
    with synchronous collectives)."""
    g, costs, order, _ = scenario
    fast = simulate_costs(g, costs, order)
    with mock.patch.object(sys.modules["commsched.sim.simulate"], "JIT_ENABLED", False):
        slow = simulate_costs(g, costs, order)
    for field in ("start_ns", "end_ns", "issue_ns", "blocked_ns"):
        assert np.array_equal(getattr(fast, field), getattr(slow, field)), field

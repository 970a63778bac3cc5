"""The ``multi_stream`` pass: node policies, upward ranks, earliest-finish placement, the verdict against the input
(never applied when not faster), the memory budget, SPMD safety, and the zoo acceptance criterion."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.cost import estimate_costs
from commsched.hardware import get as get_hardware
from commsched.ir import CollType, GraphBuilder, OpKind
from commsched.ir.order import collective_chains
from commsched.memory import memory_profile
from commsched.passes import check_schedule, schedule
from commsched.passes.multi_stream import contention_ns, evaluate
from commsched.passes.multi_stream_heft import make_plan, place, rank_priority, upward_ranks
from commsched.passes.multi_stream_policy import (
    ROLE_COMM,
    ROLE_COMPUTE,
    ROLE_HYBRID,
    node_roles,
    resolve_stream_map,
)
from commsched.passes.pipeline import inputs_first
from commsched.sim import simulate_costs
from commsched.sim.model import StreamModel
from commsched.workloads import build
from costs_helper import simple_costs
from orders import random_topo_order
from programs import trace_pressure, trace_program
from strategies import graphs


def _costs(g, *, comm_bytes_per_s=50e9, slowdown=1.15, sync_s=2e-6, compute_scale=1.0):
    base = simple_costs(g, comm_bytes_per_s=comm_bytes_per_s, compute_scale=compute_scale)
    return dataclasses.replace(base, compute_slowdown=slowdown, stream_sync_s=sync_s)


def _predicted_ns(g, costs, order, streams, alpha):
    return evaluate(g, costs, np.asarray(order, np.int32), streams, alpha).predicted_ns


def _assert_valid_result(g, costs, start, s, knobs):
    """What every multi_stream result satisfies, applied or not."""
    check_schedule(g, s.order, start, streams=s.streams)
    want, got = collective_chains(g, start), collective_chains(g, s.order)
    assert all(np.array_equal(want[k], got[k]) for k in want)
    row_stats = s.stats[-1]
    if s.streams is None:  # not applied: the input, unchanged, and the stats say why
        assert np.array_equal(s.order, inputs_first(g, start))  # the pipeline puts inputs first
        assert row_stats.notes and row_stats.notes[-1].startswith("not applied")
        return
    alpha = knobs.get("compute_interference", 1.0) if knobs.get("interference", True) else 0.0
    assert _predicted_ns(g, costs, s.order, s.streams, alpha) < _predicted_ns(g, costs, start, None, 0.0)
    ratio = knobs.get("memory_budget", 1.05)
    if ratio is not None:
        assert memory_profile(g, s.order).peak_bytes <= int(memory_profile(g, start).peak_bytes * ratio)
    # collectives all issued from the comm stream; every other node on a compute stream
    smap = resolve_stream_map(knobs.get("compute_streams", 2), knobs.get("role_streams"))
    colls = g.coll_type >= 0
    assert len(np.unique(s.streams[colls])) <= 1
    assert set(s.streams[~colls].tolist()) <= set(range(smap.num_streams))


KNOB_SETS = [
    {},
    {"compute_streams": 1},
    {"compute_streams": 3, "compute_interference": 0.0},
    {"compute_streams": 2, "interference": False, "stream_sync_s": 0.0},
    {"compute_streams": 2, "role_streams": {"comm": (0,)}, "compute_interference": 0.3},
    {"compute_streams": 2, "memory_budget": None, "compute_interference": 0.0},
    {"compute_streams": 2, "memory_budget": 1.0, "compute_interference": 0.5},
]


@settings(max_examples=100)
@given(graphs(max_nodes=50), st.sampled_from(KNOB_SETS), st.randoms(use_true_random=False))
def test_multi_stream_on_random_graphs(g, knobs, rnd):
    costs = _costs(g, comm_bytes_per_s=rnd.choice([1e9, 20e9, 400e9]), sync_s=rnd.choice([0.0, 2e-6, 50e-6]))
    start = random_topo_order(g, rnd)
    s = schedule(g, costs, ["multi_stream"], order=start, **knobs)
    _assert_valid_result(g, costs, start, s, knobs)
    again = schedule(g, costs, ["multi_stream"], order=start, **knobs)  # deterministic in (graph, costs, order)
    assert np.array_equal(again.order, s.order)


@pytest.mark.parametrize(
    ("preset", "parallel", "world", "mode"),
    [
        ("llama3-8b", "fsdp", 64, "train"),
        ("llama3-70b", "tp", 8, "train"),
        ("llama3-70b", "tp+sp", 8, "train"),
        ("mixtral-8x7b", "ep", 8, "train"),
        ("llama3-8b", "ddp", 16, "train"),
        ("llama3-70b", "tp", 8, "decode"),
        ("mixtral-8x7b", "ep", 8, "decode"),
    ],
)
def test_zoo_never_worse_than_single_stream(preset, parallel, world, mode):
    """The acceptance criterion on the zoo (h100-sxm): after ``overlap``, multi_stream's prediction is never worse
    than the single-stream order it was given, for the conservative default and the optimistic setting."""
    g = build(preset, parallel=parallel, world_size=world, layers=2, mode=mode).graph
    costs = estimate_costs(g, get_hardware("h100-sxm", num_nodes=max(1, world // 8)))
    single = schedule(g, costs, ["overlap"])
    base_ns = simulate_costs(g, costs, single.order).makespan_ns
    for knobs in ({}, {"compute_interference": 0.0}):
        s = schedule(g, costs, ["overlap", "multi_stream"], **knobs)
        _assert_valid_result(g, costs, single.order, s, knobs)
        alpha = knobs.get("compute_interference", 1.0)
        assert _predicted_ns(g, costs, s.order, s.streams, alpha) <= base_ns
    # with no contention assumed, a second compute stream finds a gain on every one of these steps
    assert s.streams is not None, s.stats[-1].notes


def _chain_graph(durations_s, *, fork=False):
    """in -> k0 -> k1 -> ... -> out; with ``fork`` every kernel reads the input only (independent kernels)."""
    b = GraphBuilder({"source": "test"})
    buf = ((4, 4), "float32", 64, None)
    x = b.add_node("x", "placeholder", OpKind.INPUT, buffers=[buf])
    prev, outs = x, []
    for k in range(len(durations_s)):
        src = x if fork else prev
        prev = b.add_node(f"k{k}", "aten.mm.default", OpKind.COMPUTE, [src], buffers=[buf], flops=1.0)
        outs.append(prev)
    b.add_node("output", "output", OpKind.OUTPUT, outs if fork else [prev], side_effect=True)
    g = b.build()
    node_s = np.zeros(len(g))
    node_s[1 : 1 + len(durations_s)] = durations_s
    from commsched.cost.model import CostEstimate

    return g, CostEstimate.from_times(node_s, stream_sync_s=1e-6)


def test_upward_rank_is_the_longest_path_with_sync_edges():
    g, costs = _chain_graph([3e-6, 5e-6, 7e-6])
    order = np.arange(len(g))
    dur = np.rint(costs.node_s * 1e9).astype(np.int64)
    plan = make_plan(g, order, dur, node_roles(g), np.zeros(0, np.int32), np.zeros(0, np.int32))
    one = upward_ranks(plan, order, resolve_stream_map(1, None), 1000)
    assert one[1:4] == [15000, 12000, 7000]  # one compute stream: no edge can cross streams
    two = upward_ranks(plan, order, resolve_stream_map(2, None), 1000)
    assert two[1:4] == [15000 + 2000 + 1000, 12000 + 1000 + 1000, 7000 + 1000]  # each kernel edge may sync
    assert list(rank_priority(plan, two)) == [0, 1, 2, 3, 4]


def test_earliest_finish_spreads_independent_kernels_only_without_contention():
    g, costs = _chain_graph([10e-6] * 4, fork=True)
    order = np.arange(len(g))
    dur = np.rint(costs.node_s * 1e9).astype(np.int64)
    plan = make_plan(g, order, dur, node_roles(g), np.zeros(0, np.int32), np.zeros(0, np.int32))
    smap = resolve_stream_map(2, None)
    free = place(plan, order, smap, StreamModel(sync_ns=0), 0.0)
    assert sorted(free.stream[1:5].tolist()) == [0, 0, 1, 1]
    assert free.makespan_ns == 20_000
    shared = place(
        plan, order, smap, StreamModel(sync_ns=0), 1.0
    )  # full contention: overlapping buys nothing, so no overlap
    assert shared.stream[1:5].tolist() == [0, 0, 0, 0]
    assert shared.makespan_ns == 40_000
    # the verdict charges contention: the spread placement is not faster than one stream at full contention
    spread = evaluate(g, costs, order.astype(np.int32), free.stream, 1.0)
    assert spread.sim.makespan_ns == 20_000 + 1000  # the output joins stream 1 (one sync)
    assert spread.contention_ns == 20_000
    assert spread.predicted_ns > simulate_costs(g, costs, order).makespan_ns


def test_contention_counts_extra_running_kernels():
    g, costs = _chain_graph([10e-6, 4e-6, 6e-6], fork=True)
    streams = np.array([0, 0, 1, 2, 0])
    sim = simulate_costs(g, costs, np.arange(len(g)), streams)
    # k0 [0, 10) on stream 0, k1 [0, 4) on stream 1, k2 [0, 6) on stream 2: 2 extra during [0, 4), 1 during [4, 6)
    assert contention_ns(sim, g) == 2 * 4000 + 1 * 2000
    assert contention_ns(simulate_costs(g, costs), g) == 0


def _hybrid_graph():
    """A collective and an independent fused all_gather + matmul (async-TP) kernel."""
    b = GraphBuilder({"source": "test"})
    grp = b.group("tp", 8)
    buf = ((64, 64), "bfloat16", 8192, None)
    x = b.add_node("x", "placeholder", OpKind.INPUT, buffers=[buf])
    y = b.add_node("y", "placeholder", OpKind.INPUT, buffers=[buf])
    c = b.add_node("ar", "_c10d_functional.all_reduce.default", OpKind.COLLECTIVE, [x], buffers=[buf], side_effect=True)
    b.set_collective(c, CollType.ALL_REDUCE, grp, "sum", 8192, 8192)
    h = b.add_node("fused", "symm_mem.fused_all_gather_matmul.default", OpKind.COMPUTE, [y], buffers=[buf], flops=1e9)
    w = b.add_node("w", "_c10d_functional.wait_tensor.default", OpKind.WAIT, [c], buffers=[buf], side_effect=True)
    b.set_wait(w, c)
    m = b.add_node("mm", "aten.mm.default", OpKind.COMPUTE, [w, h], buffers=[buf], flops=1e9)
    b.add_node("output", "output", OpKind.OUTPUT, [m], side_effect=True)
    g = b.build()
    node_s = np.zeros(len(g))
    node_s[[c, h, m]] = [20e-6, 30e-6, 5e-6]
    from commsched.cost.model import CostEstimate

    return g, CostEstimate.from_times(node_s, stream_sync_s=0.0), (c, h, w, m)


def test_hybrid_kernels_hold_a_compute_stream_and_the_interconnect():
    g, costs, (c, h, _w, m) = _hybrid_graph()
    roles = node_roles(g)
    assert roles[c] == ROLE_COMM and roles[h] == ROLE_HYBRID and roles[m] == ROLE_COMPUTE
    assert node_roles(g, hybrid_targets=())[h] == ROLE_COMPUTE  # classification is by target, configurable
    order = np.arange(len(g))
    dur = np.rint(costs.node_s * 1e9).astype(np.int64)
    plan = make_plan(g, order, dur, roles, np.zeros(0, np.int32), np.zeros(0, np.int32))
    placed = place(plan, order, resolve_stream_map(2, None), StreamModel(), 0.0)
    comm_start, comm_end = placed.end_ns[c] - dur[c], placed.end_ns[c]
    # never beside a collective: the fused kernel starts after the all_reduce's transfer ends
    assert placed.start_ns[h] >= comm_end or placed.end_ns[h] <= comm_start
    assert placed.stream[h] in (0, 1) and placed.stream[c] == 2
    assert placed.makespan_ns == 20_000 + 30_000 + 5_000
    as_compute = make_plan(
        g, order, dur, node_roles(g, hybrid_targets=()), np.zeros(0, np.int32), np.zeros(0, np.int32)
    )
    assert place(as_compute, order, resolve_stream_map(2, None), StreamModel(), 0.0).makespan_ns == 30_000 + 5_000


def test_not_applied_at_a_lower_bound_or_when_not_faster():
    g, costs = _chain_graph([10e-6, 10e-6, 10e-6])  # a chain: already at its critical path
    s = schedule(g, costs, ["multi_stream"])
    assert s.streams is None and np.array_equal(s.order, np.arange(len(g)))
    assert "already meets a lower bound" in s.stats[-1].notes[-1]
    g, costs = _chain_graph([10e-6, 10e-6], fork=True)
    costs = dataclasses.replace(costs, stream_sync_s=50e-6)  # a second stream costs more than it saves
    s = schedule(g, costs, ["multi_stream"], compute_interference=0.5)
    assert s.streams is None and np.array_equal(s.order, np.arange(len(g)))
    assert s.stats[-1].refused == {"not faster": 1}
    assert "not faster" in s.stats[-1].notes[-1]
    assert any(r["streams_used"] > 1 for r in s.stats[-1].rows)  # a two-stream candidate was tried and rejected


def test_memory_budget_is_hard():
    _, g = trace_pressure()
    costs = _costs(g, comm_bytes_per_s=1e9)
    start = schedule(g, costs, ["overlap"], memory_budget=1.0).order
    base_peak = memory_profile(g, start).peak_bytes
    loose = schedule(g, costs, ["multi_stream"], order=start, memory_budget=None, compute_interference=0.0)
    peaks = [r["peak_bytes"] for r in loose.stats[-1].rows]
    assert max(peaks) > base_peak  # some candidate issues the all_gather across the peak
    tight = schedule(g, costs, ["multi_stream"], order=start, memory_budget=1.0, compute_interference=0.0)
    assert memory_profile(g, tight.order).peak_bytes <= base_peak
    assert tight.stats[-1].refused.get("memory budget", 0) >= 1


def test_traced_fsdp_step_gains_with_a_second_stream():
    _, g = trace_program("fsdp_mlp", 8, layers=4, dim=512)
    costs = _costs(g, comm_bytes_per_s=20e9, compute_scale=20)
    single = schedule(g, costs, ["overlap"])
    s = schedule(g, costs, ["overlap", "multi_stream"], compute_interference=0.0)
    assert s.streams is not None
    _assert_valid_result(g, costs, single.order, s, {"compute_interference": 0.0})
    assert s.stats[-1].notes[-1].startswith("applied")


def test_bad_config_is_a_clear_error():
    _, g = trace_program("fsdp_mlp", 8, layers=1, dim=64)
    costs = simple_costs(g)
    with pytest.raises(ValueError, match=r"role_streams\['comm'\].*exactly one stream"):
        schedule(g, costs, ["multi_stream"], role_streams={"comm": (1, 2)})
    with pytest.raises(ValueError, match="contiguous"):
        schedule(g, costs, ["multi_stream"], role_streams={"compute": (0,), "comm": (5,)})
    with pytest.raises(ValueError, match="unknown role"):
        schedule(g, costs, ["multi_stream"], role_streams={"gpu": (0,)})
    with pytest.raises(ValueError, match="compute_streams=0"):
        schedule(g, costs, ["multi_stream"], compute_streams=0)
    with pytest.raises(ValueError, match=r"memory_budget=0\.5"):
        schedule(g, costs, ["multi_stream"], memory_budget=0.5)
    with pytest.raises(ValueError, match="compute_interference=-1"):
        schedule(g, costs, ["multi_stream"], compute_interference=-1.0)


def test_synchronous_collective_is_available_when_it_ends():
    """A collective without a wait (e.g. dtensor's shard_dim_alltoall) blocks its issuing stream, and its users
    start after it ends, as in the simulator."""
    from commsched.cost.model import CostEstimate

    b = GraphBuilder({"source": "test"})
    grp = b.group("ep", 8)
    buf = ((64, 64), "bfloat16", 8192, None)
    x = b.add_node("x", "placeholder", OpKind.INPUT, buffers=[buf])
    c = b.add_node("a2a", "_dtensor.shard_dim_alltoall.default", OpKind.COLLECTIVE, [x], buffers=[buf])
    b.set_collective(c, CollType.ALL_TO_ALL, grp, None, 8192, 8192, sync=True)
    k = b.add_node("mm", "aten.mm.default", OpKind.COMPUTE, [c], buffers=[buf], flops=1e9)
    b.add_node("output", "output", OpKind.OUTPUT, [k], side_effect=True)
    g = b.build()
    costs = CostEstimate.from_times(np.array([0.0, 20e-6, 5e-6, 0.0]), stream_sync_s=1e-6)
    order = np.arange(len(g))
    dur = np.rint(costs.node_s * 1e9).astype(np.int64)
    plan = make_plan(g, order, dur, node_roles(g), np.zeros(0, np.int32), np.zeros(0, np.int32))
    smap = resolve_stream_map(1, None)
    assert upward_ranks(plan, order, smap, 1000)[c] == 20_000 + 1000 + 5000
    placed = place(plan, order, smap, StreamModel(sync_ns=1000), 0.0)
    # issue at 0 from the comm stream, transfer [1 us, 21 us), the kernel on stream 0 after one more sync
    assert placed.end_ns[c] == 21_000
    assert placed.start_ns[k] == 22_000
    sim = simulate_costs(g, costs, order, placed.stream)
    assert sim.start_ns[k] == placed.start_ns[k]

"""The stream model is written once: the simulator, the overlap list scheduler and HEFT all follow sim/model.py."""

from __future__ import annotations

import dataclasses
import sys

import numpy as np
import pytest
from tests.costs_helper import simple_costs
from tests.programs import trace_program

from commsched.ir import OpKind
from commsched.passes import schedule
from commsched.passes.multi_stream_heft import make_plan, place
from commsched.passes.multi_stream_policy import node_roles, resolve_stream_map
from commsched.passes.overlap_list import schedule_once
from commsched.passes.overlap_prep import input_chains, prepare, prepare_graph
from commsched.sim import simulate_costs
from commsched.sim.model import StreamModel, durations_ns, latency_ns


@pytest.fixture(scope="module")
def step():
    """A traced FSDP step (all-gathers, reduce-scatters, matmuls) with interference and stream sync, and an order
    of it that overlaps communication with compute (the overlap pass's)."""
    _, g = trace_program("fsdp_mlp", 4, layers=4)
    costs = dataclasses.replace(simple_costs(g, comm_bytes_per_s=50e9), compute_slowdown=1.5, stream_sync_s=3e-6)
    overlapped = schedule(g, costs, "default").order
    assert simulate_costs(g, costs, overlapped).exposed_comm_s < simulate_costs(g, costs).exposed_comm_s
    return g, costs, overlapped


def _three_timings(g, costs, overlapped) -> tuple[int, int, int]:
    """(simulated makespan of ``overlapped``, the list scheduler's planned end, HEFT's planned makespan)."""
    order = np.arange(len(g))
    sim = simulate_costs(g, costs, overlapped).makespan_ns
    none = np.zeros(0, np.int64)
    p = prepare(prepare_graph(g, order, costs, none, none), input_chains(g, order))
    a = schedule_once(p, 1 << 62)
    planned = max(max(a.at[v] + p.dur_ns[v] for v in range(len(g))), max(a.comm_end.values()))
    plan = make_plan(g, order, durations_ns(g, costs), node_roles(g), none, none)
    heft = place(plan, order, resolve_stream_map(2, None), StreamModel.from_costs(costs), 0.0).makespan_ns
    return sim, planned, heft


def test_durations_follow_the_kinds(step):
    g, costs, _ = step
    dur = durations_ns(g, costs)
    timed = np.isin(g.kinds, (OpKind.COMPUTE, OpKind.OTHER, OpKind.COLLECTIVE))
    assert (dur[~timed] == 0).all() and (dur[timed] == np.rint(costs.node_s[timed] * 1e9)).all()
    lat = latency_ns(g, costs, dur)
    assert (lat <= dur).all() and (lat[g.coll_type < 0] == 0).all() and lat[g.coll_type >= 0].min() > 0


@pytest.mark.parametrize(
    "rule",
    [
        # kernels three times slower than the configured slowdown while communication is in flight
        ("kernel_wall_ns", lambda self, work, busy: work * 3 * self.compute_slowdown if busy else work),
        # a wait releases its stream 50 us after its collective ends
        ("wait_release_ns", lambda self, end: end + 50_000),
        # a collective starts 40 us after its issue
        ("comm_start_ns", lambda self, issue, free: max(issue + 40_000, free)),
    ],
    ids=["interference", "wait release", "fifo start"],
)
def test_one_rule_changed_in_the_model_changes_all_three(step, monkeypatch, rule):
    # the pure-Python loops call the model's methods; the compiled ones (which compile the model's rule functions)
    # are checked equal to them in tests/sim/test_simulator.py and tests/passes/test_overlap_jit.py
    monkeypatch.setattr(sys.modules["commsched.sim.simulate"], "JIT_ENABLED", False)
    monkeypatch.setattr(sys.modules["commsched.passes.overlap_list"], "JIT_ENABLED", False)
    g, costs, overlapped = step
    before = _three_timings(g, costs, overlapped)
    name, fn = rule
    monkeypatch.setattr(StreamModel, name, fn)
    if name == "kernel_wall_ns":  # its inverse, so the model stays consistent
        monkeypatch.setattr(
            StreamModel, "kernel_work_ns", lambda self, wall, busy: wall / (3 * self.compute_slowdown) if busy else wall
        )
    after = _three_timings(g, costs, overlapped)
    assert all(b > a for a, b in zip(before, after, strict=True)), (name, before, after)


def test_kernel_rate_rule_is_its_own_inverse():
    model = StreamModel(compute_slowdown=1.25, comm_slowdown=2.0, sync_ns=7)
    for busy in (False, True):
        assert model.kernel_work_ns(model.kernel_wall_ns(1000.0, busy), busy) == pytest.approx(1000.0)
    assert model.kernel_end_ns(100, 1000.0, True) == 100 + 1250
    assert model.comm_divisor(3, True) == 6.0 and model.comm_divisor(3, False) == 3.0
    assert model.comm_start_ns(10, 0) == 17 and model.comm_start_ns(10, 30) == 30
    assert model.latest_issue_ns(model.comm_start_ns(10, 0)) == 10
    assert model.wait_release_ns(5) == 12

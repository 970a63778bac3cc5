"""The compiled loops of the ``overlap`` pass give what the pure-Python ones give, bit for bit: every list-scheduling
attempt (order, times, collective starts and ends), every tightened order, the keyed topological sort. On a traced
zoo step and on random DAGs (synchronous collectives, interference, a cross-stream sync, memory budgets, held-back
nodes)."""

from __future__ import annotations

import dataclasses
import sys
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.ir.transform import kahn_order
from commsched.memory import memory_profile
from commsched.passes.overlap_list import PRIORITIES, ListScheduler, _schedule_once_compiled
from commsched.passes.overlap_orders import _tighten_compiled, tighten_reference
from commsched.passes.overlap_prep import input_chains, prepare, prepare_graph
from commsched.sim.jit import ENABLED
from costs_helper import simple_costs
from orders import random_topo_order
from strategies import graphs

pytestmark = pytest.mark.skipif(not ENABLED, reason="numba is a dependency; COMMSCHED_JIT=0 turns the loops off")


def _prep(g, costs, order):
    """The Prep of ``order`` (compiled levels), checked field by field against the pure-Python one."""
    none = np.zeros(0, np.int64)
    gp = prepare_graph(g, order, costs, none, none)
    p = prepare(gp, input_chains(g, order))
    with mock.patch.object(sys.modules["commsched.passes.overlap_prep"], "JIT_ENABLED", False):
        want = prepare(gp, input_chains(g, order))
    for name in ("succ_ptr", "succ_idx", "indeg", "bottom", "feeds", "chains"):
        assert getattr(p, name) == getattr(want, name), name
    return p


def assert_same_attempts(p, budget: int, not_before: dict[int, int]) -> int:
    """Both forms of every variant agree (attempt and tightened order); returns how many attempts were compared."""
    count = 0
    for priority in PRIORITIES:
        for guard in (False, True):
            want = ListScheduler(p, budget, not_before, priority, guard).run()
            got = _schedule_once_compiled(p, budget, not_before, priority, guard)
            assert got.order == want.order
            assert got.at == want.at
            assert list(got.comm_start.items()) == list(want.comm_start.items())
            assert list(got.comm_end.items()) == list(want.comm_end.items())
            assert _tighten_compiled(p, got) == tighten_reference(p, want)
            # the compiled tightening also takes an attempt made by the Python loop
            assert _tighten_compiled(p, want) == tighten_reference(p, want)
            count += 1
    return count


def test_compiled_attempts_equal_python_on_a_traced_step():
    from commsched.cost import estimate_costs
    from commsched.hardware import get
    from commsched.workloads import build

    g = build("llama3-8b", parallel="fsdp+tp", world_size=64, layers=1).graph
    costs = estimate_costs(g, get("h100-sxm", num_nodes=8))
    order = np.arange(len(g))
    p = _prep(g, costs, order)
    peak = memory_profile(g).peak_bytes
    held = {int(v): 1000 * k for k, v in enumerate(range(0, len(g), 23))}  # some nodes held back (peak repairs)
    for budget in (peak, int(peak * 1.05), 4 * peak):
        for not_before in ({}, held):
            assert_same_attempts(p, budget, not_before)


@settings(max_examples=150, deadline=None)
@given(
    graphs(max_nodes=50, p_sync=0.2),
    st.sampled_from([1.0, 1.05, 2.0]),
    st.sampled_from([(1.0, 1.0, 0.0), (1.3, 1.0, 0.0), (1.25, 1.5, 3e-6), (1.0, 2.0, 1e-6)]),
    st.randoms(use_true_random=False),
)
def test_compiled_attempts_equal_python_on_random_graphs(g, ratio, model, rnd):
    compute_slowdown, comm_slowdown, sync_s = model
    costs = simple_costs(g, comm_bytes_per_s=rnd.choice([1e9, 20e9, 400e9]))
    costs = dataclasses.replace(costs, compute_slowdown=compute_slowdown, comm_slowdown=comm_slowdown,
                                stream_sync_s=sync_s)  # fmt: skip
    start = random_topo_order(g, rnd)
    p = _prep(g, costs, start)
    budget = int(memory_profile(g, start).peak_bytes * ratio)
    held = {v: rnd.randrange(0, 200_000) for v in rnd.sample(range(len(g)), min(len(g), 5))}
    assert assert_same_attempts(p, budget, rnd.choice([{}, held])) == 2 * len(PRIORITIES)


@settings(max_examples=100, deadline=None)
@given(graphs(max_nodes=40), st.randoms(use_true_random=False))
def test_compiled_kahn_equals_python(g, rnd):
    from commsched.passes.overlap_jit import kahn_jit

    ptr, idx = g.successors_csr()
    indeg = np.diff(g.predecessors_csr()[0])
    key = np.asarray([rnd.choice([0.0, 0.5, 1.0, rnd.random()]) for _ in range(len(g))])
    want = kahn_order(ptr, idx, indeg, key)
    got = kahn_jit(ptr.astype(np.int64), idx.astype(np.int64), indeg.astype(np.int64), key).tolist()
    assert got == want

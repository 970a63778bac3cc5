"""reorder_communication_preserving_peak_memory and sink_waits_iterative: budgets, stop reasons, invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.ir import OpKind
from commsched.ir.order import collective_chains, positions
from commsched.memory import memory_profile
from commsched.passes import check_schedule, schedule
from commsched.passes.budget import MemoryBudget
from costs_helper import simple_costs
from orders import random_topo_order
from programs import trace_pressure, trace_program
from strategies import graphs

ITERATIVE = ["reorder_communication_preserving_peak_memory", "sink_waits_iterative"]


def test_reorder_stops_at_peak_memory_when_the_budget_binds():
    _, g = trace_pressure()
    ag = next(int(c) for c in g.collectives)
    base = memory_profile(g).peak_bytes
    name = ["reorder_communication_preserving_peak_memory"]
    free = schedule(g, simple_costs(g), name, memory_budget=MemoryBudget(ratio=11.0))
    tight = schedule(g, simple_costs(g), name, memory_budget=MemoryBudget(ratio=1.0))
    # with room, the all_gather climbs above the big matmul; with none, it stops below and says why
    mm = g.index["mm"]
    assert positions(free.order)[ag] < positions(free.order)[mm]
    assert positions(tight.order)[ag] > positions(tight.order)[mm]
    row = tight.stats[0].rows[0]
    assert row["limiting_factor"] == "peak memory" and tight.stats[0].refused["peak memory"] == 1
    assert memory_profile(g, tight.order).peak_bytes <= base
    assert memory_profile(g, free.order).peak_bytes > base


def test_sink_waits_iterative_moves_waits_past_independent_compute():
    _, g = trace_program("fsdp_mlp", 8, layers=4, dim=256)
    s = schedule(g, simple_costs(g), ["sink_waits_iterative"])
    rows = s.stats[0].rows
    assert len(rows) == int((g.kinds == OpKind.WAIT).sum())
    assert all(r["final_exposed_s"] <= r["initial_exposed_s"] for r in rows)
    improved = [r for r in rows if r["final_exposed_s"] < r["initial_exposed_s"]]
    assert improved, "no wait moved past compute"
    pos, base = positions(s.order), np.arange(len(g))
    moved = [g.index[r["wait"]] for r in improved]
    assert all(pos[w] > base[w] for w in moved)


def test_stats_on_traced_fsdp():
    _, g = trace_program("fsdp_mlp", 8, layers=4, dim=256)
    s = schedule(g, simple_costs(g), "torch")
    reorder = s.stats[0]
    assert len(reorder.rows) == len(g.collectives)
    for row in reorder.rows:
        assert row["limiting_factor"] in ("collective ordering", "start of graph", "peak memory") or row[
            "limiting_factor"
        ].startswith("data dependency")
        assert row["final_exposed_s"] <= row["initial_exposed_s"] + 1e-15
    assert sum(r["moves"] for r in reorder.rows) > 0


@settings(max_examples=150)
@given(
    graphs(max_nodes=60),
    st.sampled_from(ITERATIVE),
    st.sampled_from([0.0, 0.1, 1.0]),
    st.booleans(),
    st.randoms(use_true_random=False),
)
def test_iterative_passes_on_random_graphs(g, name, budget, estimates, rnd):
    start = random_topo_order(g, rnd)
    knobs = {"memory_budget": MemoryBudget(ratio=1.0 + budget), "use_runtime_estimations": estimates}
    s = schedule(g, simple_costs(g), [name], order=start, **knobs)
    check_schedule(g, s.order, start)
    a, b = collective_chains(g, start), collective_chains(g, s.order)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    base = memory_profile(g, start).peak_bytes
    assert memory_profile(g, s.order).peak_bytes <= base + int(base * budget)


@pytest.mark.parametrize("name", ITERATIVE)
def test_unsafe_reorder_is_reported_to_the_checker(name):
    _, g = trace_program("fsdp_mlp", 8, layers=2, dim=64)
    s = schedule(g, simple_costs(g), [name], unsafe_collectives_reorder=True)
    check_schedule(g, s.order, allow_collective_reorder=True)


@settings(max_examples=150)
@given(graphs(max_nodes=60), st.sampled_from([0.0, 0.05, 1.0]), st.booleans(), st.randoms(use_true_random=False))
def test_jumping_plain_runs_equals_one_swap_at_a_time(g, budget, estimates, rnd):
    start = random_topo_order(g, rnd)
    kw = {"memory_budget": MemoryBudget(ratio=1.0 + budget), "use_runtime_estimations": estimates}
    name = ["reorder_communication_preserving_peak_memory"]
    fast = schedule(g, simple_costs(g), name, order=start, **kw)
    slow = schedule(g, simple_costs(g), name, order=start, jump_plain_runs=False, **kw)
    assert np.array_equal(fast.order, slow.order)
    for a, b in zip(fast.stats[0].rows, slow.stats[0].rows):
        assert a["moves"] == b["moves"] and a["limiting_factor"] == b["limiting_factor"]
        assert a["final_exposed_s"] == pytest.approx(b["final_exposed_s"], abs=1e-15)


def test_jumping_equals_swapping_on_a_traced_llama():
    from commsched.cost import estimate_costs
    from commsched.hardware import get
    from commsched.workloads import build

    g = build("llama3-8b", parallel="fsdp", world_size=8, layers=2).graph
    costs = estimate_costs(g, get("h100-sxm"))
    name = ["reorder_communication_preserving_peak_memory"]
    fast = schedule(g, costs, name)
    slow = schedule(g, costs, name, jump_plain_runs=False)
    assert np.array_equal(fast.order, slow.order)
    assert [r["moves"] for r in fast.stats[0].rows] == [r["moves"] for r in slow.stats[0].rows]
    assert sum(r["moves"] for r in fast.stats[0].rows) > len(g)  # the seed's moves are quadratic here


@pytest.mark.parametrize("name", ITERATIVE)
def test_memory_budget_knob_takes_every_budget_spelling(name):
    _, g = trace_pressure()
    costs = simple_costs(g)
    default = schedule(g, costs, [name])
    for spelling in (1.2, "1.2x", MemoryBudget(ratio=1.2)):
        assert np.array_equal(schedule(g, costs, [name], memory_budget=spelling).order, default.order)
    with pytest.raises(ValueError, match=r"ratio=0\.2 must be >= 1"):  # torch's fraction is not a ratio
        schedule(g, costs, [name], memory_budget=0.2)

"""The AC policy family (issue 38): per-layer activation checkpointing chosen by the simulator under the memory budget.
Its search (a frontier of plans from per-block estimates, probed from where the estimate says they fit) is checked
on its own; on llama-tiny FSDP steps the family, alone in the registry, never returns a step slower than the input
one when that fits, never one over the budget when the lowest-memory plan fits, and says why of every plan it
probed."""

from __future__ import annotations

import functools
import itertools
import math

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

import commsched
from commsched.optimize.families import ac_policy
from commsched.optimize.families.ac_policy import Estimate, first_fitting, frontier, plan_policies
from commsched.passes import MemoryBudget
from commsched.workloads import resolve

LAYERS = 2
STEP = dict(parallel="fsdp", world_size=4, layers=LAYERS, seq_len=1024)


# ---------------------------------------------------------------- the search, alone
@settings(max_examples=200, deadline=None)
@given(st.integers(1, 40), st.data())
def test_first_fitting_finds_the_threshold_with_few_asks(count, data):
    """For any monotone predicate and any start, the smallest fitting index (None when none fits), asking at most
    about 2 log2(count) + 2 times and never the same index twice."""
    threshold = data.draw(st.integers(0, count), label="threshold")  # count: nothing fits
    start = data.draw(st.integers(0, count - 1), label="start")
    asked: list[int] = []

    def fits(k: int) -> bool:
        asked.append(k)
        return k >= threshold

    got = first_fitting(count, start, fits)
    assert got == (threshold if threshold < count else None)
    assert len(asked) == len(set(asked)) and all(0 <= k < count for k in asked)
    assert len(asked) <= 2 * math.ceil(math.log2(count + 1)) + 2, (count, start, threshold, asked)


@settings(max_examples=100, deadline=None)
@given(st.integers(1, 12), st.floats(0.01, 2.0), st.floats(0.1, 3.0), st.floats(0.01, 2.0), st.floats(0.1, 3.0))
def test_frontier_starts_at_no_recompute_and_trades_time_for_memory(layers, t_sel, m_sel, t_full, m_full):
    """Where recompute costs time, the frontier's first plan recomputes nothing; along it the estimated compute
    never falls and the estimated peak strictly falls; no plan off it is both faster and lower than one on it."""
    added = {"none": 0.0, "selective-op": t_sel, "full": t_full}
    saved = {"none": 0.0, "selective-op": m_sel, "full": m_full}
    est = Estimate(added, saved, 100, 100 - layers * max(m_sel, m_full))
    plans = frontier(layers, est)
    assert plans[0] == (0, 0)
    figures = [est.of(*fs) for fs in plans]
    assert all(a[0] <= b[0] and a[1] > b[1] for a, b in itertools.pairwise(figures))
    every = [est.of(f, s) for f in range(layers + 1) for s in range(layers + 1 - f)]
    for t, m in figures:
        assert not any(t2 < t and m2 < m for t2, m2 in every)
    for f, s in plans:
        policies = plan_policies(layers, f, s)
        assert len(policies) == layers and policies == tuple(sorted(policies, key=["full", "selective-op",
                                                                                   "none"].index))  # fmt: skip


# ---------------------------------------------------------------- the family on traced steps
@functools.cache
def _step(ac: str):
    """llama-tiny FSDP over 4 ranks, 2 layers of 1024 tokens (activations: half the no-AC peak), traced once per
    ``ac`` (the family's own cache)."""
    return ac_policy.traced(resolve("llama-tiny", ac=ac, **STEP))


@pytest.fixture
def alone(monkeypatch):
    """The AC policy family alone in the registry (the others' variants would only slow these tests)."""
    import commsched.optimize.search

    monkeypatch.setattr(commsched.optimize.search, "FAMILIES", {ac_policy.name: ac_policy})


@functools.cache
def _optimized(ac: str, budget_bytes: int):
    w = _step(ac)
    return commsched.optimize(w.graph_module, "h100-sxm", memory_budget=MemoryBudget(bytes=budget_bytes))


@functools.cache
def _lowest_fits(budget_bytes: int) -> bool:
    """Whether the lowest-memory plan (every block full) has an order within ``budget_bytes``."""
    from commsched.cost import estimate_costs
    from commsched.hardware import for_graph
    from commsched.optimize.protocol import Variant, schedule_variant

    g = _step("full").graph
    costs = estimate_costs(g, for_graph("h100-sxm", g))
    v = schedule_variant("", g, costs, {"reorder_collectives": True, "memory_budget": MemoryBudget(bytes=budget_bytes)})
    return isinstance(v, Variant) and v.sim.peak_memory_bytes <= budget_bytes


def _peak(ac: str) -> int:
    from commsched.cost import estimate_costs
    from commsched.hardware import for_graph
    from commsched.sim import simulate_costs

    g = _step(ac).graph
    return simulate_costs(g, estimate_costs(g, for_graph("h100-sxm", g))).peak_memory_bytes


POLICIES = ("none", "selective-op", "full")


@settings(max_examples=2, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.tuples(*[st.sampled_from(POLICIES)] * LAYERS), st.floats(0.0, 1.0))
def test_never_slower_than_the_input_never_over_a_budget_a_plan_fits(alone, policies, where):
    """Any input policy, any absolute budget from below the all-full step's peak to above the no-AC one's: the kept
    step is within the budget whenever the lowest-memory plan fits it, no slower than the input scheduled when
    that fits, and every plan the family probed has a verdict."""
    ac = policies[0] if len(set(policies)) == 1 else "per-layer:" + ",".join(policies)
    low, high = _peak("full"), _peak("none")
    budget = int(low * 0.97 + where * (high * 1.05 - low * 0.97))
    o = _optimized(ac, budget)
    rows = {t.label: t for t in o.tried}
    traced = rows["traced program, scheduled"]
    kept = next(t for t in o.tried if t.verdict.startswith("kept"))  # as judged (the module returned is re-costed)
    if _lowest_fits(budget):
        assert kept.peak_memory_bytes <= budget and o.after.peak_memory_bytes <= budget, o.summary()
    if traced.peak_memory_bytes is not None and traced.peak_memory_bytes <= budget:
        assert kept.makespan_s <= traced.makespan_s, o.summary()
    mine = [t for t in o.tried if t.label.startswith((ac_policy.LABEL, ac_policy.name))]
    assert mine and all(t.verdict for t in mine)


def test_over_budget_input_gets_the_least_recompute_that_fits(alone):
    """No AC, under a budget its step cannot meet but the all-full one can: the kept step is a per-layer plan
    within the budget; the plans probed and over it say so, with their peaks."""
    budget = (_peak("full") + _peak("none")) // 2
    assert _lowest_fits(budget)
    o = _optimized("none", budget)
    rows = {t.label: t for t in o.tried}
    assert rows["traced program, scheduled"].verdict.startswith("over the memory budget")
    assert o.label.startswith(ac_policy.LABEL) and o.after.peak_memory_bytes <= budget, o.summary()
    search = rows[f"{ac_policy.name} (search)"].verdict
    assert search.startswith("searched: ") and "probed" in search
    for t in o.tried:
        if t.label.startswith(ac_policy.LABEL) and t.verdict.startswith("over the memory budget in the probe"):
            assert t.peak_memory_bytes > budget
    kept = o.gm  # the module returned is the kept plan's retrace: more matmuls than the traced step
    n_mm = lambda gm: sum(str(n.target) == "aten.mm.default" for n in gm.graph.nodes)  # noqa: E731
    assert n_mm(kept) > n_mm(_step("none").graph_module)


def test_where_it_does_not_apply_it_says_why(alone):
    """A step with no recompute well within the budget (memory does not bind), a prefill, and a module the zoo did
    not trace: one verdict each, nothing traced."""
    from commsched.workloads import build

    w = _step("none")
    o = commsched.optimize(w.graph_module, "h100-sxm", memory_budget=2.0)
    (row,) = [t for t in o.tried if t.label == ac_policy.name]
    assert row.verdict.startswith("not applied: the traced step recomputes nothing and the best step leaves")
    prefill = build("llama-tiny", parallel="tp", world_size=2, layers=1, seq_len=16, mode="prefill")
    o = commsched.optimize(prefill.graph_module, "h100-sxm", group_sizes=prefill.graph.group_sizes())
    assert [t.verdict for t in o.tried if t.label == ac_policy.name] == [
        "not applied: a prefill step recomputes nothing (activation checkpointing is for training)"
    ]
    from commsched.rewrites.fxutil import copy_graph_module
    from commsched.workloads.trace import WORKLOAD_META

    other = copy_graph_module(w.graph_module)
    other.meta.pop(WORKLOAD_META, None)  # no longer known as a zoo step
    o = commsched.optimize(other, "h100-sxm", group_sizes=w.graph.group_sizes())
    assert next(t.verdict for t in o.tried if t.label == ac_policy.name).startswith("not applied: not a zoo step")

"""sink_waits, raise_comms, reorder_compute_for_overlap, decide_global_ordering_of_comms: behaviour and invariants."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.ir import OpKind
from commsched.ir.order import collective_chains, positions
from commsched.passes import PASSES, ScheduleError, check_schedule, schedule
from costs_helper import simple_costs
from orders import random_topo_order
from programs import trace_program
from strategies import graphs

LIST_PASSES = ["sink_waits", "raise_comms", "reorder_compute_for_overlap", "decide_global_ordering_of_comms"]


@pytest.fixture(scope="module")
def fsdp():
    _, g = trace_program("fsdp_mlp", 8, layers=4, dim=128)
    return g


def _ancestor_sets(g):
    bits = g.ancestor_bitsets()
    return [{j for j in range(len(g)) if bits[i] >> j & 1} for i in range(len(g))]


def test_raise_comms_issues_each_collective_as_early_as_dependencies_allow(fsdp):
    g = fsdp
    s = schedule(g, simple_costs(g), ["raise_comms"])
    pos = positions(s.order)
    anc = _ancestor_sets(g)
    colls = [int(c) for c in s.order if g.coll_type[c] >= 0]
    inputs = set(np.flatnonzero(g.kinds == OpKind.INPUT).tolist())  # the pipeline keeps inputs first
    needed: set[int] = set(inputs)
    for k, c in enumerate(colls):
        needed |= anc[c] | set(colls[:k])
        before = {int(x) for x in s.order[: pos[c]]}
        # exactly what this and the earlier collectives need runs before it, nothing else
        assert before == needed, f"collective {g.names[c]}"
    # it moved something: in the traced order the first all_gather's wait precedes the second all_gather
    assert not np.array_equal(s.order, np.arange(len(g)))


def test_sink_waits_puts_each_wait_as_late_as_users_allow(fsdp):
    g = fsdp
    s = schedule(g, simple_costs(g), ["sink_waits"])
    pos = positions(s.order)
    ptr, idx = g.predecessors_csr()
    for w in np.flatnonzero(g.kinds == OpKind.WAIT).tolist():
        p = pos[w]
        for x in s.order[p + 1 :].tolist():
            if g.kinds[x] == OpKind.WAIT:
                continue
            preds = idx[ptr[x] : ptr[x + 1]]
            # x was not ready when the wait ran: one of its inputs was still unscheduled
            assert len(preds) and pos[preds].max() >= p, f"{g.names[x]} could have run before {g.names[w]}"


def test_reorder_compute_for_overlap_puts_compute_under_collectives(fsdp):
    g = fsdp
    costs = simple_costs(g, comm_bytes_per_s=5e9)  # slow network: compute should move under each collective
    base = schedule(g, costs, "none")
    s = schedule(g, costs, ["reorder_compute_for_overlap"])
    pos = positions(s.order)

    def compute_between_colls_and_waits(order_pos):
        total = 0.0
        for c in g.collectives.tolist():
            w = int(g.waits_of(c)[0])
            between = [x for x in range(len(g)) if order_pos[c] < order_pos[x] < order_pos[w]]
            total += sum(costs.node_s[x] for x in between if g.coll_type[x] < 0)
        return total

    assert compute_between_colls_and_waits(pos) > compute_between_colls_and_waits(positions(base.order))


def test_global_ordering_constrains_later_passes(fsdp):
    g = fsdp
    s = schedule(g, simple_costs(g), ["decide_global_ordering_of_comms", "sink_waits", "raise_comms"])
    colls = [int(c) for c in s.order if g.coll_type[c] >= 0]
    assert colls == sorted(colls)  # the traced order of all collectives, across groups


def test_unknown_pass_and_knob(fsdp):
    with pytest.raises(ValueError, match="unknown pass 'nope'"):
        schedule(fsdp, simple_costs(fsdp), ["nope"])
    with pytest.raises(ValueError, match=r"unknown knob\(s\) \['colour'\]"):
        schedule(fsdp, simple_costs(fsdp), ["sink_waits"], colour=1)


def test_checker_rejects_bad_orders(fsdp):
    g = fsdp
    order = np.arange(len(g), dtype=np.int32)
    c = int(g.collectives[0])
    w = int(g.waits_of(c)[0])
    bad = order.copy()
    bad[c], bad[w] = bad[w], bad[c]
    with pytest.raises(ScheduleError, match="before its predecessor"):
        check_schedule(g, bad)
    # issuing the second all_gather before the first (both only read placeholders) breaks SPMD collective order
    c0, c1 = g.collectives.tolist()[:2]
    inputs = np.flatnonzero(g.kinds == OpKind.INPUT).tolist()
    assert set(g.predecessors(c0).tolist()) <= set(inputs) and set(g.predecessors(c1).tolist()) <= set(inputs)
    rest = [x for x in order.tolist() if x not in inputs and x not in (c0, c1)]
    swapped = np.asarray([*inputs, c1, c0, *rest], np.int32)
    with pytest.raises(ScheduleError, match=f"collective #0 is '{g.names[c1]}'"):
        check_schedule(g, swapped)
    check_schedule(g, swapped, allow_collective_reorder=True)
    with pytest.raises(ScheduleError, match="missing from the order"):
        check_schedule(g, np.concatenate([order[:-1], order[:1]]))


@settings(max_examples=100)
@given(graphs(max_nodes=60), st.sampled_from(LIST_PASSES), st.randoms(use_true_random=False))
def test_list_passes_on_random_graphs(g, name, rnd):
    costs = simple_costs(g)
    # start from a random valid order, not just the id order
    start = random_topo_order(g, rnd)
    s = schedule(g, costs, [name], order=start)
    check_schedule(g, s.order, start)
    a, b = collective_chains(g, start), collective_chains(g, s.order)
    assert all(np.array_equal(a[k], b[k]) for k in a)


def test_every_pass_registered_has_a_docstring():
    for spec in PASSES.values():
        assert spec.description, spec.name

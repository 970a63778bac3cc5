"""Rebuilt collective orders are made consistent with the graph's own constraints (overlap_chains)."""

from __future__ import annotations

import numpy as np

from commsched.ir import CollType, GraphBuilder, OpKind
from commsched.ir.order import collective_chains
from commsched.passes.overlap_chains import consistent_chains
from commsched.passes.overlap_prep import input_chains, prepare, prepare_graph
from costs_helper import simple_costs


def _two_groups_crossing():
    """a1 -> b2 and b1 -> a2 through data: orders [a2, a1] and [b2, b1] together form a cycle."""
    b = GraphBuilder()
    ga, gb = b.group("a", 8), b.group("b", 8)
    x = b.add_node("x", "placeholder", OpKind.INPUT, buffers=[((64,), "float32", 256, None)])

    def coll(name, src, grp):
        c = b.add_node(name, "c", OpKind.COLLECTIVE, [src], buffers=[((64,), "float32", 256, None)], side_effect=True)
        b.set_collective(c, CollType.ALL_REDUCE, grp, "sum", 256, 256, sync=True)
        return c

    a1, b1 = coll("a1", x, ga), coll("b1", x, gb)
    a2, b2 = coll("a2", b1, ga), coll("b2", a1, gb)
    b.add_node("output", "output", OpKind.OUTPUT, [a2, b2], side_effect=True)
    return b.build(), (a1, a2, b1, b2)


def test_consistent_orders_come_back_unchanged_and_crossing_ones_become_acyclic():
    g, (a1, a2, b1, b2) = _two_groups_crossing()
    order = np.arange(len(g))
    none = np.zeros(0, np.int64)
    gp = prepare_graph(g, order, simple_costs(g), none, none)
    chains = input_chains(g, order)
    assert consistent_chains(gp, chains) == chains
    ga, gb = int(g.coll_group[a1]), int(g.coll_group[b1])
    crossing = {ga: [a2, a1], gb: [b2, b1]}
    fixed = consistent_chains(gp, crossing)
    assert sorted(fixed[ga]) == sorted([a1, a2]) and sorted(fixed[gb]) == sorted([b1, b2])
    prepare(gp, fixed)  # no cycle left
    # the data forces a1 before b2 and b1 before a2: one group keeps its wish, the other gives it up
    assert fixed != crossing and (fixed[ga] == [a2, a1]) != (fixed[gb] == [b2, b1])
    assert collective_chains(g, order)[ga].tolist() == [a1, a2]

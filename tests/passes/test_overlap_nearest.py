"""The "nearest" priority (what issues a collective soonest) and Jackson's rule learning from its attempt."""

from __future__ import annotations

import numpy as np
from hypothesis import given, settings
from hypothesis import strategies as st

import commsched
from commsched.passes.overlap_prep import to_collective_ns
from strategies import graphs


def _brute_force_ns(g, dur: list[int], target: list[bool], v: int) -> int:
    """The least sum of durations over every path from ``v``'s successors to a target (the target's own excluded),
    by enumerating the paths."""
    sp, si = (a.tolist() for a in g.successors_csr())
    never = 1 << 62
    best = never

    def walk(u: int, acc: int) -> None:
        nonlocal best
        if target[u]:
            best = min(best, acc)
            return
        for w in si[sp[u] : sp[u + 1]]:
            walk(w, acc + dur[u])

    for u in si[sp[v] : sp[v + 1]]:
        walk(u, 0)
    return best


@settings(max_examples=60, deadline=None)
@given(graphs(max_nodes=18), st.randoms(use_true_random=False))
def test_to_collective_ns_is_the_shortest_path_to_a_collective(g, rnd):
    dur = [rnd.randrange(0, 1000) for _ in range(len(g))]
    is_coll = (g.coll_type >= 0).tolist()
    got = to_collective_ns(g, np.asarray(dur, np.int64), np.arange(len(g)), g.coll_type >= 0)
    for v in range(len(g)):
        want = _brute_force_ns(g, dur, is_coll, v)
        assert got[v] == want or (want == 1 << 62 and got[v] >= 1 << 62), v


def test_learning_from_the_nearest_attempt_unlocks_the_chunks_of_a_split_prefill():
    """llama3-8b TP+SP prefill split in two chunks: each chunk's norm sits between its reduce_scatter and its next
    all_gather. Jackson's rule learning only from the "feeds" attempt keeps the chunks in lock step; learning also
    from the "nearest" attempt (the norm ahead of the other chunk's matmuls) gives a faster order."""
    from commsched.cost import estimate_costs
    from commsched.frontends.fx import from_fx
    from commsched.hardware import for_graph
    from commsched.rewrites.split_batch import interleave_micro_batches
    from commsched.rewrites.split_sequence import split_zoo_sequence
    from commsched.workloads import build

    w = build("llama3-8b", parallel="tp+sp", world_size=8, layers=2, seq_len=2048, mode="prefill")
    g = w.graph
    gm = split_zoo_sequence(w.spec, 2).gm
    gm = interleave_micro_batches(gm, from_fx(gm, group_sizes=g.group_sizes(), meta=g.meta))
    g2 = from_fx(gm, group_sizes=g.group_sizes(), meta=g.meta)
    costs = estimate_costs(g2, for_graph("h100-sxm", g))
    both = commsched.schedule(g2, costs, "default", reorder_collectives=True)
    feeds_only = commsched.schedule(g2, costs, "default", reorder_collectives=True, jackson_also_from=())
    step_s = commsched.simulate_costs(g2, costs, both.order).makespan_s
    feeds_only_s = commsched.simulate_costs(g2, costs, feeds_only.order).makespan_s
    assert step_s < 0.95 * feeds_only_s
    assert "learned from nearest priority" in both.stats[0].notes[-1]
    assert any(r["attempt"] == "input collective order, nearest priority" for r in both.stats[0].rows)
    # the pruning rule: the "nearest" attempt itself is a little slower than the best order so far, so a zero
    # tolerance skips the round it would have learned from
    pruned = commsched.schedule(g2, costs, "default", reorder_collectives=True, jackson_also_within=0.0)
    assert not any("learned from nearest" in r["attempt"] for r in pruned.stats[0].rows)
    assert commsched.simulate_costs(g2, costs, pruned.order).makespan_s == feeds_only_s

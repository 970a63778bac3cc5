"""The ``framework`` reference order: FSDP2's one-unit prefetch and one reduce_scatter in flight, DDP's buckets
waited at the end of the backward, the input order for anything else; always a valid order."""

from __future__ import annotations

import itertools

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.cost import estimate_costs
from commsched.hardware import for_graph
from commsched.ir import CollType, OpKind
from commsched.ir.order import collective_chains, positions
from commsched.passes import check_schedule, schedule
from commsched.passes.baselines.framework import framework_label, framework_roles
from commsched.sim import simulate_costs
from commsched.workloads import build
from costs_helper import simple_costs
from strategies import graphs


def _framework(g):
    costs = estimate_costs(g, for_graph("h100-sxm", g))
    s = schedule(g, costs, "framework")
    check_schedule(g, s.order, allow_collective_reorder=True)
    return costs, s.order


@pytest.fixture(scope="module")
def fsdp_block():
    return build("llama3-8b", parallel="fsdp", world_size=64, layers=2, seq_len=2048, fsdp_bucket="block").graph


def test_fsdp2_prefetches_one_unit_and_keeps_one_reduce_scatter_in_flight(fsdp_block):
    g = fsdp_block
    costs, order = _framework(g)
    assert framework_label(g) == "FSDP2 eager"
    pos, traced = positions(order), np.arange(len(g), dtype=np.int32)
    (chain,) = collective_chains(g, traced).values()
    gathers = chain[g.coll_type[chain] == CollType.ALL_GATHER]
    scatters = chain[g.coll_type[chain] == CollType.REDUCE_SCATTER]
    assert len(gathers) >= 4 and len(scatters) >= 3
    compute = np.flatnonzero(g.kinds == OpKind.COMPUTE)
    for prev, coll in itertools.pairwise(gathers):
        # issued before the first compute that follows the previous unit's wait (that unit's layer)
        first = compute[compute > g.waits_of(int(prev)).max()]
        if len(first) and first[0] < coll:
            assert pos[coll] < pos[first[0]]
    for k, coll in enumerate(scatters[:-1]):
        # waited when the next one is issued: after the compute that makes the next unit's gradients
        last = compute[compute < scatters[k + 1]].max()
        assert pos[g.waits_of(int(coll))].min() > pos[last]
        # and before the next one's input buffer is allocated (FSDP2 reuses its memory for that copy-in)
        read = g.buf_storage[g.buf_ptr[g.inputs(int(scatters[k + 1]))[0]]]
        assert pos[g.waits_of(int(coll))].max() < pos[g.storage_owner[read]]
    before, after = simulate_costs(g, costs), simulate_costs(g, costs, order)
    assert after.exposed_comm_s < 0.75 * before.exposed_comm_s
    assert after.makespan_s < before.makespan_s


def test_ddp_waits_its_buckets_at_the_end_of_the_backward():
    g = build("llama3-8b", parallel="ddp", world_size=16, layers=2, seq_len=1024).graph
    costs, order = _framework(g)
    assert framework_label(g) == "DDP eager"
    pos = positions(order)
    last_compute = pos[g.kinds == OpKind.COMPUTE].max()
    waits = np.flatnonzero(g.wait_of >= 0)
    assert len(waits) and (pos[waits] > last_compute).all()
    assert simulate_costs(g, costs, order).exposed_comm_s < simulate_costs(g, costs).exposed_comm_s


@pytest.mark.parametrize(("preset", "parallel", "mode"), [("llama-tiny", "tp+sp", "prefill"),
                                                          ("llama-tiny", "tp", "train"),
                                                          ("mixtral-tiny", "ep", "decode")])  # fmt: skip
def test_anything_else_runs_as_traced(preset, parallel, mode):
    g = build(preset, parallel=parallel, world_size=8, layers=1, mode=mode).graph
    _, order = _framework(g)
    assert framework_roles(g) == (set(), set())
    assert framework_label(g) == "torch.compile default (as traced)"
    assert np.array_equal(order, np.arange(len(g)))


ROLES_ARGS = (graphs(max_nodes=48), st.booleans(), st.randoms(use_true_random=False))
"""the strategies of :func:`check_fsdp_and_ddp_roles`'s arguments (``benchmarks/bench_fuzz.py --framework N`` draws
many more of them than the suite)"""


@settings(max_examples=150, deadline=None, derandomize=True)  # a fixed set: CI is deterministic
@given(*ROLES_ARGS)
def test_random_graphs_with_fsdp_and_ddp_roles_give_valid_orders(g, ddp_too, rnd):
    check_fsdp_and_ddp_roles(g, ddp_too, rnd)


def check_fsdp_and_ddp_roles(g, ddp_too, rnd) -> None:
    """Any graph whose group 0 is called FSDP (and its last group DDP): the moves keep a valid order, each FSDP
    all_gather is issued one unit ahead, and DDP's waits come after every compute that does not need them."""
    g.meta.update(mode="train", parallel="fsdp", fsdp=2,
                  groups={"fsdp": {"name": g.groups[0].name}, "dp": {"name": g.groups[-1].name}},
                  **({"ddp_buckets": {"dp": [["p"]]}} if ddp_too and len(g.groups) > 1 else {}))  # fmt: skip
    costs = simple_costs(g, comm_bytes_per_s=rnd.choice([1e9, 400e9]))
    order = schedule(g, costs, "framework").order
    check_schedule(g, order, allow_collective_reorder=True)
    pos = positions(order)
    compute = np.flatnonzero(g.kinds == OpKind.COMPUTE)
    anc = g.ancestor_bitsets()
    gathers = [c for c in g.collectives if g.coll_group[c] == 0 and g.coll_type[c] == CollType.ALL_GATHER]
    for prev, coll in itertools.pairwise(gathers):
        # issued before the first compute after the previous all_gather's wait, unless it depends on it
        after = compute[compute > g.waits_of(int(prev)).max()]
        if len(after) and after[0] < coll and not anc[coll] >> int(after[0]) & 1:
            assert pos[coll] < pos[after[0]]
    _, ddp = framework_roles(g)
    held = [int(w) for c in g.collectives for w in g.waits_of(int(c))
            if (int(g.coll_group[c]) in ddp and g.coll_type[c] == CollType.ALL_REDUCE)
            or (g.coll_group[c] == 0 and g.coll_type[c] == CollType.REDUCE_SCATTER)]  # fmt: skip
    for c in g.collectives:
        if int(g.coll_group[c]) not in ddp or g.coll_type[c] != CollType.ALL_REDUCE:
            continue
        for w in g.waits_of(int(c)).tolist():
            if any(anc[a] >> w & 1 for a in gathers):
                continue  # an FSDP all_gather issued early pulls its ancestors with it
            # held back to the end: every compute that depends on no held-back wait runs before it
            free = [x for x in compute.tolist() if not any(anc[x] >> q & 1 for q in held)]
            assert all(pos[x] < pos[w] for x in free)


@settings(max_examples=60, deadline=None, derandomize=True)
@given(*ROLES_ARGS)
def test_the_compiled_key_loop_orders_as_the_python_one(g, ddp_too, rnd):
    """``order_by_moves``' compiled loop (plan's judge runs it per layout) gives its Python source's order."""
    from commsched.ir.order import positions as pos_of
    from commsched.passes.baselines import framework as fw

    g.meta.update(mode="train", parallel="fsdp", fsdp=2, groups={"fsdp": {"name": g.groups[0].name}})
    order = np.arange(len(g), dtype=np.int32)
    late, early, _ = fw.framework_moves(g, order)
    for i in rnd.sample(range(len(g)), min(len(g), 4)):  # any moves, not only FSDP's: waits held, nodes pulled
        late[i] += rnd.uniform(0, len(g))
        early[i] = rnd.uniform(0, len(g))
    compiled = fw.order_by_moves(g, late, early, pos_of(order))
    was, fw.JIT_ENABLED = fw.JIT_ENABLED, False
    try:
        python = fw.order_by_moves(g, late, early, pos_of(order))
    finally:
        fw.JIT_ENABLED = was
    assert was and np.array_equal(compiled, python)

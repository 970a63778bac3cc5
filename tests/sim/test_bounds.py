"""Lower bounds: Jackson's preemptive rule against a brute-force unit-step schedule, forced idle time, and the
whole bound against the best orders the schedulers and random search find."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.cost.model import CostEstimate
from commsched.passes import schedule
from commsched.sim import simulate_costs
from commsched.sim.bounds import forced_idle_ns, preemptive_jackson_ns
from orders import random_topo_order
from strategies import graphs


def brute_force(release, work, delivery):
    """Unit-step preemptive schedule: at every step run the released job with the longest delivery time."""
    n, rem, t, best, done = len(work), list(work), 0, 0, 0
    while done < n:
        ready = [j for j in range(n) if release[j] <= t and rem[j] > 0]
        if not ready:
            t = min(release[j] for j in range(n) if rem[j] > 0)
            continue
        j = max(ready, key=lambda j: (delivery[j], -j))
        rem[j] -= 1
        t += 1
        if rem[j] == 0:
            done += 1
            best = max(best, t + delivery[j])
    return best


jobs = st.integers(1, 8).flatmap(
    lambda n: st.tuples(
        st.lists(st.integers(0, 12), min_size=n, max_size=n),
        st.lists(st.integers(1, 6), min_size=n, max_size=n),
        st.lists(st.integers(0, 12), min_size=n, max_size=n),
    )
)


@given(jobs)
def test_jackson_matches_brute_force(job):
    release, work, delivery = job
    assert preemptive_jackson_ns(release, work, delivery) == brute_force(release, work, delivery)


def test_jackson_charges_head_and_tail():
    # one job released at 5 with 3 units of work and 4 after it: nothing can finish before 12
    assert preemptive_jackson_ns([5], [3], [4]) == 12
    # a long tail job preempts a short-tail one as soon as it is released
    assert preemptive_jackson_ns([0, 1], [4, 1], [0, 10]) == 12


def test_forced_idle_counts_only_work_available_before_each_time():
    # kernels available at 0 (2 ns), 10 (5 ns) and 10 (1 ns): [0, 10] has at least 10 - 1.5 * 2 = 7 ns idle
    assert forced_idle_ns([10, 0, 10], [5, 2, 1], 1.5) == [(10, 7.0)]
    # enough early work: no forced idle
    assert forced_idle_ns([0, 4], [8, 1], 1.0) == []


@st.composite
def tight_scenarios(draw):
    """Small random DAGs with interference, and orders that are as good as the schedulers make them."""
    g = draw(graphs(max_nodes=14, max_groups=2, p_collective=0.35))
    n = len(g)
    us = draw(st.lists(st.integers(0, 40), min_size=n, max_size=n))
    node_s = np.asarray(us, float) * 1e-6
    costs = CostEstimate(
        node_s=node_s,
        coll_latency_s=node_s * 0.25,
        coll_link=np.zeros(n, np.int8),
        compute_slowdown=draw(st.sampled_from([1.0, 1.2, 2.0, 4.0])),
    )
    return g, costs, draw(st.integers(0, 2**31))


@given(tight_scenarios())
def test_no_schedule_beats_the_bound(scenario):
    """The bound holds for the best orders we can find: every scheduler's and many random topological orders."""
    g, costs, seed = scenario
    orders = [random_topo_order(g, random.Random(seed + k)) for k in range(40)]
    for passes, knobs in ((["overlap"], {"memory_budget": None}), (["sink_waits"], {}), (["raise_comms"], {})):
        orders.append(schedule(g, costs, passes, **knobs).order)
    bound = simulate_costs(g, costs).lower_bound_s
    for order in orders:
        assert simulate_costs(g, costs, order).makespan_s >= bound * (1 - 1e-9)


def test_forced_idle_raises_the_bound_on_a_traced_multi_node_fsdp_step():
    """Across 32 nodes the first all_gather (the embedding) cannot be hidden: the bound charges it, above the plain
    interference term ``W + (1 - 1/s) C``."""
    from commsched.cost import estimate_costs
    from commsched.hardware import get
    from commsched.workloads import build

    g = build("llama3-8b", parallel="fsdp", world_size=256, layers=2).graph
    costs = estimate_costs(g, get("h100-sxm", num_nodes=32))
    b = simulate_costs(g, costs).bound
    plain = b.compute_s + (1 - 1 / costs.compute_slowdown) * max(b.comm_s.values())
    assert b.interference_s > plain + 1e-3
    assert b.value_s >= b.interference_s


@st.composite
def tp_chains(draw):
    """TP-like steps: layers of parallel kernels joined into one all_reduce whose result the next layer needs, with
    some kernels that no collective waits for (free to run beside one). The exposed-communication term binds here."""
    from commsched.ir import CollType, GraphBuilder, OpKind

    b = GraphBuilder({"source": "hypothesis"})
    grp = b.group("tp", 8)
    buf = ((16, 16), "float32", 1024, None)
    prev = b.add_node("x", "placeholder", OpKind.INPUT, buffers=[buf])
    side = []
    for layer in range(draw(st.integers(1, 4))):
        branches = [b.add_node(f"mm{layer}_{k}", "aten.mm.default", OpKind.COMPUTE, [prev], buffers=[buf], flops=1.0)
                    for k in range(draw(st.integers(1, 3)))]  # fmt: skip
        if draw(st.booleans()):  # a kernel only the output reads: free beside every later collective
            side.append(b.add_node(f"side{layer}", "aten.mm.default", OpKind.COMPUTE, [prev], buffers=[buf], flops=1.0))
        join = b.add_node(f"add{layer}", "aten.add.Tensor", OpKind.OTHER, branches, buffers=[buf])
        c = b.add_node(f"ar{layer}", "_c10d_functional.all_reduce.default", OpKind.COLLECTIVE, [join], buffers=[buf],
                       side_effect=True)  # fmt: skip
        b.set_collective(c, CollType.ALL_REDUCE, grp, "sum", 1024, 1024)
        prev = b.add_node(f"wait{layer}", "_c10d_functional.wait_tensor.default", OpKind.WAIT, [c], buffers=[buf],
                          side_effect=True)  # fmt: skip
        b.set_wait(prev, c)
    b.add_node("output", "output", OpKind.OUTPUT, [prev, *side], side_effect=True)
    g = b.build()
    us = draw(st.lists(st.integers(1, 40), min_size=len(g), max_size=len(g)))
    node_s = np.asarray(us, float) * 1e-6
    costs = CostEstimate(node_s=node_s, coll_latency_s=node_s * 0.25, coll_link=np.zeros(len(g), np.int8),
                         compute_slowdown=draw(st.sampled_from([1.0, 1.2, 2.0])))  # fmt: skip
    return g, costs, draw(st.integers(0, 2**31))


@given(tp_chains())
def test_exposed_comm_term_holds_and_charges_what_nothing_can_hide(scenario):
    """On TP-like chains the term is the work plus each all_reduce beyond the kernels free beside it, and no order
    (random or scheduled) beats it."""
    g, costs, seed = scenario
    sim = simulate_costs(g, costs)
    dur = sim.standalone_ns
    kernels = (g.coll_type < 0) & (dur > 0)
    work = int(dur[kernels].sum())
    side = int(sum(dur[i] for i in range(len(g)) if g.names[i].startswith("side")))
    colls = np.flatnonzero(g.coll_type >= 0)
    # every kernel but the side ones is before or after each all_reduce; a side kernel of layer l is free only
    # beside the all_reduces of layers >= l
    free = {int(c): sum(int(dur[i]) for i in range(len(g)) if g.names[i].startswith("side")
                        and int(g.names[i][4:]) <= int(g.names[c][2:])) for c in colls}  # fmt: skip
    want = work + sum(max(0, int(dur[c]) - free[int(c)]) for c in colls)
    assert (sim.bound.exposed_comm_s or {}).get("tp", work * 1e-9) == pytest.approx(want * 1e-9, abs=1e-12)
    assert side <= work
    orders = [random_topo_order(g, random.Random(seed + k)) for k in range(20)]
    orders.append(schedule(g, costs, ["overlap"], memory_budget=None).order)
    for order in orders:
        assert simulate_costs(g, costs, order).makespan_s >= sim.lower_bound_s * (1 - 1e-9)


def test_exposed_comm_term_compiled_and_python_agree():
    """The compiled loop and its Python source give the same per-collective work on a traced zoo step."""
    from commsched.cost import estimate_costs
    from commsched.hardware import get
    from commsched.sim import bounds_jit
    from commsched.workloads import build

    g = build("llama-tiny", parallel="tp", world_size=2, layers=2).graph
    dur = simulate_costs(g, estimate_costs(g, get("h100-sxm"))).standalone_ns
    colls = np.flatnonzero(g.coll_type >= 0)
    index = np.full(len(g), -1, np.int64)
    index[colls] = np.arange(len(colls))
    done = np.full(len(g), -1, np.int64)
    waits = np.flatnonzero(g.wait_of >= 0)
    done[waits] = index[g.wait_of[waits]]
    csr = [np.ascontiguousarray(a, np.int64) for a in (*g.predecessors_csr(), *g.successors_csr())]
    work = np.where((g.coll_type < 0) & (dur > 0), dur, 0).astype(np.int64)
    args = (*csr, index, done, work, len(colls))
    fn = bounds_jit.bound_compute_ns
    got = fn(*args)
    assert np.array_equal(got, getattr(fn, "py_func", fn)(*args))

    def reach(start: int, edges) -> set[int]:  # every node a path of ``edges`` leads to from ``start``
        seen, todo = set(), [start]
        while todo:
            for j in edges(todo.pop()).tolist():
                if j not in seen:
                    seen.add(j)
                    todo.append(j)
        return seen

    wait_of = {int(c): int(w) for w, c in zip(waits, g.wait_of[waits], strict=True)}
    for k, c in enumerate(colls.tolist()):  # by brute force: ancestors, and descendants of the collective's wait
        before = reach(c, g.predecessors)
        after = reach(wait_of[c], g.successors)
        assert got[0, k] == work[sorted(before)].sum() and got[1, k] == work[sorted(after)].sum()
    assert (got.sum(axis=0) > 0).all() and (got.sum(axis=0) <= work.sum()).all()


def test_bound_charges_a_tp_decode_step_its_exposed_all_reduces():
    """llama3-70b TP decode: every all_reduce sits between matmuls that need it, so the bound is about the whole
    step (the critical path and compute terms miss the all_reduces' serial time)."""
    from commsched.cost import estimate_costs
    from commsched.hardware import get
    from commsched.workloads import build

    g = build("llama3-70b", parallel="tp", world_size=8, layers=2, mode="decode").graph
    sim = simulate_costs(g, estimate_costs(g, get("h100-sxm")))
    b = sim.bound
    assert b.binding == "exposed comm:" + g.groups[0].name
    assert b.value_s > max(b.compute_s, b.critical_path_s, b.interference_s) * 1.05
    assert b.value_s <= sim.makespan_s <= b.value_s * 1.05


def test_bound_charges_ddp_gradients_that_cannot_start_before_the_backward():
    """llama3-8b DDP across 8 nodes: the gradient all_reduces start once the backward does, so the comm stream's
    heads-and-tails term is above the plain sums; the scheduled step is within 10 % of it."""
    from commsched.cost import estimate_costs
    from commsched.hardware import get
    from commsched.workloads import build

    g = build("llama3-8b", parallel="ddp", world_size=64, layers=2, seq_len=2048).graph
    costs = estimate_costs(g, get("h100-sxm", num_nodes=8))
    sim = simulate_costs(g, costs, schedule(g, costs, "default").order)
    b = sim.bound
    assert b.binding.startswith("comm heads and tails:")
    assert b.value_s > max(b.compute_s, *b.comm_s.values(), b.interference_s, b.heads_tails_s) * 1.05
    assert b.value_s <= sim.makespan_s <= b.value_s * 1.10


@settings(max_examples=60, deadline=None, derandomize=True)
@given(graphs(max_nodes=48, p_sync=0.3), st.randoms(use_true_random=False))
def test_compiled_heads_and_tails_are_the_python_ones(g, rnd):
    """The compiled head / tail loops (every simulation's lower bound) give the Python loops' integers."""
    from commsched.sim import bounds

    dur = np.array([rnd.randrange(0, 10**9) for _ in range(len(g))], np.int64)
    compiled = bounds.heads_and_tails(g, dur)
    was, bounds.JIT_ENABLED = bounds.JIT_ENABLED, False
    try:
        python = bounds.heads_and_tails(g, dur)
    finally:
        bounds.JIT_ENABLED = was
    assert was and compiled == python

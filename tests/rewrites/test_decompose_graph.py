"""The IR-level decomposed-TP rewrite (``decompose_graph``) builds exactly the graph ``from_fx`` imports from the FX
rewrite (``decompose_tp``): same nodes, names, order, edges, buffers, storages, flops and collectives, hence the same
costs, step time and peak. ``optimize`` judges decomposed-TP plans on the former and runs the latter, so any
difference would make it judge a program it does not run."""

from __future__ import annotations

import pytest
from test_bucket_graph import assert_same_graph

import commsched
from commsched.cost import estimate_costs
from commsched.frontends.fx import from_fx
from commsched.hardware import for_graph
from commsched.optimize.families.decomposed_tp import tp_plans
from commsched.rewrites import BucketConfig, apply_bucket_plan, plan_buckets
from commsched.rewrites.bucket_graph import bucket_graph, noncontiguous_inputs
from commsched.rewrites.decompose_graph import decompose_graph, fx_facts
from commsched.rewrites.decompose_tp import decompose_tp, find_tp_sites
from commsched.workloads import build

CASES = [  # (preset, parallel, world, mode, gpus per node): every site pattern, 1-D and 2-D meshes
    ("llama-tiny", "tp", 4, "train", 4),
    ("llama-tiny", "tp+sp", 4, "train", 4),
    ("llama-tiny", "tp+sp", 4, "prefill", 4),
    ("llama-tiny", "fsdp+tp", 8, "train", 4),
    ("llama-tiny", "fsdp+tp+sp", 8, "train", 4),
]


def _assert_same_program(fx, ir, hw) -> None:
    """Field by field, then what the search reads of it: the node multiset, costs, step time and peak."""
    assert_same_graph(fx, ir)
    ir.validate()
    assert sorted(zip(fx.names, fx.targets, strict=True)) == sorted(zip(ir.names, ir.targets, strict=True))
    c_fx, c_ir = estimate_costs(fx, hw), estimate_costs(ir, hw)
    assert c_fx.node_s.tolist() == c_ir.node_s.tolist()
    s_fx, s_ir = commsched.simulate_costs(fx, c_fx), commsched.simulate_costs(ir, c_ir)
    assert (s_fx.makespan_ns, s_fx.peak_memory_bytes) == (s_ir.makespan_ns, s_ir.peak_memory_bytes)


@pytest.mark.parametrize(("preset", "parallel", "world", "mode", "per_node"), CASES)
def test_decompose_graph_equals_the_fx_rewrite_reimported(preset, parallel, world, mode, per_node):
    w = build(preset, parallel=parallel, world_size=world, layers=2, mode=mode)
    g, gm = w.graph, w.graph_module
    hw = for_graph("h100-sxm", g, num_nodes=world // per_node, gpus_per_node=per_node)
    sites = find_tp_sites(gm)
    facts = fx_facts(gm, sites)
    plans = tp_plans(gm, sites)
    assert plans, "no TP site: the case tests nothing"
    for plan in plans:
        fx = from_fx(decompose_tp(gm, plan.splits, graph=g).gm, group_sizes=g.group_sizes(), meta=g.meta)
        _assert_same_program(fx, decompose_graph(g, plan.splits, sites, facts), hw)
        assert len(fx) > len(g)


@pytest.mark.parametrize("parallel", ["fsdp+tp", "fsdp+tp+sp"])
def test_decompose_graph_on_a_bucketed_program(parallel):
    """As ``optimize`` composes them: the split made on a bucketed program's IR (``bucket_graph``), its sites the
    traced ones whose collective the bucketing kept, equals the FX rewrite of the bucketed module, split in place."""
    w = build("llama-tiny", parallel=parallel, world_size=8, layers=2)
    g, gm = w.graph, w.graph_module
    hw = for_graph("h100-sxm", g, num_nodes=2, gpus_per_node=4)
    sites = find_tp_sites(gm)
    facts = fx_facts(gm, sites)
    plan = plan_buckets(g, estimate_costs(g, hw), None, hardware=hw, config=BucketConfig(overlap_aware=False))
    assert plan.merged
    g_b = bucket_graph(g, plan, None, noncontiguous_inputs(gm, g))
    kept = [s for s in sites if s.collective in g_b.index]
    assert kept and tp_plans(gm, kept), "no site left to split: the case tests nothing"
    for tp in tp_plans(gm, kept):
        gm_b = apply_bucket_plan(gm, g, plan, None, recompile=False).gm
        assert find_tp_sites(gm_b) == kept
        out = decompose_tp(gm_b, tp.splits, graph=g_b, recompile=False, copy=False).gm
        assert out is gm_b
        fx = from_fx(out, group_sizes=g.group_sizes(), meta=g.meta)
        _assert_same_program(fx, decompose_graph(g_b, tp.splits, kept, facts), hw)


@pytest.mark.parametrize("sp", [True, False])
def test_decompose_graph_folds_a_user_programs_extra_waits(sp):
    """A user program that waits twice on a collective's result (issue #36 item 12): every plan's IR rewrite equals
    the FX rewrite re-imported, which folds the second wait away (before: the IR rewrite refused two waits, and the
    FX rewrite left a wait on the concatenated chunks, which ``from_fx`` refused)."""
    from random_programs import trace
    from test_decompose_tp import _tp_layer

    world = 4
    gm, g = trace(_tp_layer(world, sp, True, False, extra_wait=True), world, [(8, 8), (8, 8), (8, 8), (8, 8)])
    sites = find_tp_sites(gm)
    assert {s.pattern for s in sites} == ({"ag_mm", "mm_rs"} if sp else {"mm_ar"})
    hw = for_graph("h100-sxm", g, num_nodes=1, gpus_per_node=world)
    facts = fx_facts(gm, sites)
    for plan in tp_plans(gm, sites):
        fx = from_fx(decompose_tp(gm, plan.splits, graph=g).gm, group_sizes=g.group_sizes(), meta=g.meta)
        _assert_same_program(fx, decompose_graph(g, plan.splits, sites, facts), hw)
        assert not any(n.startswith("wait_tensor") and n not in g.names for n in fx.names)

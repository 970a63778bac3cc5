"""Program transforms as ``optimize`` candidates: every plan is tried and judged by the simulator with a verdict,
the kept transform is the module returned, and steps without a TP site try none."""

from __future__ import annotations

import numpy as np
import pytest

import commsched
from commsched.frontends.fx import from_fx
from commsched.optimize.transforms import tp_plans
from commsched.rewrites.decompose_tp import TRANSFORM_META, find_tp_sites


@pytest.fixture(scope="module")
def tp_sp_prefill():
    from commsched.workloads import build

    return build("llama3-8b", parallel="tp+sp", world_size=8, layers=1, mode="prefill")


def test_transform_plans_are_tried_and_the_fastest_within_budget_is_kept(tp_sp_prefill):
    w = tp_sp_prefill
    o = commsched.optimize(w.graph_module, "h100-sxm", group_sizes=w.graph.group_sizes())
    plans = tp_plans(w.graph_module)
    tried = [t for t in o.tried if t.label.startswith("decomposed TP")]
    # every plan has one verdict: kept, slower (with its simulated step), pruned by its probe, or over the budget
    assert len(plans) >= 4 and len(tried) == len(plans)
    for t in tried:
        assert t.verdict == "kept" or t.verdict.startswith(("slower", "pruned", "over the memory budget")), t
        assert "mm->reduce_scatter" in t.label or "all_gather->mm" in t.label  # where it applies
    # on this step (8 ranks, 8192 tokens, h100-sxm) splitting the reduce_scatters in two wins by about 2 %
    assert o.label.startswith("decomposed TP"), o.summary()
    without = commsched.optimize(w.graph_module, "h100-sxm", group_sizes=w.graph.group_sizes(), transforms=False)
    assert not any(t.label.startswith("decomposed TP") for t in without.tried)
    assert o.after.makespan_s < without.after.makespan_s
    assert o.after.peak_memory_bytes <= o.budget_bytes
    # the module returned is the transformed program, in the kept order, and imports to the graph reported
    marked = [n for n in o.gm.graph.nodes if TRANSFORM_META in n.meta]
    assert marked and len(o.graph.collectives) > len(w.graph.collectives)
    g2 = from_fx(o.gm, group_sizes=w.graph.group_sizes(), meta=w.graph.meta)
    g2.validate()
    assert g2.names == o.graph.names
    np.testing.assert_array_equal(o.schedule.order, np.arange(len(g2)))


def test_a_step_without_tp_sites_tries_no_transform():
    from commsched.workloads import build

    w = build("llama-tiny", parallel="fsdp", world_size=2, layers=1, seq_len=16, batch=2)
    assert find_tp_sites(w.graph_module) == [] and tp_plans(w.graph_module) == []
    o = commsched.optimize(w.graph_module, "h100-sxm", group_sizes=w.graph.group_sizes())
    assert not any(t.label.startswith("decomposed TP") for t in o.tried)


def test_splits_are_also_tried_on_the_fastest_bucketed_program():
    from commsched.workloads import build

    w = build("llama3-8b", parallel="tp", world_size=8, layers=1, seq_len=2048)
    o = commsched.optimize(w.graph_module, "h100-sxm", group_sizes=w.graph.group_sizes())
    bucketed = [t for t in o.tried if t.label.startswith("bucketed") and t.makespan_s is not None]
    composed = [t for t in o.tried if "+ decomposed TP" in t.label]
    assert bucketed and composed
    # each composed program was fully scheduled and has a verdict against the kept one
    for t in composed:
        assert t.makespan_s is not None and t.collectives is not None
        assert t.verdict == "kept" or t.verdict.startswith(("slower", "over the memory budget")), t


def test_cli_lists_the_transforms_tried_and_can_turn_them_off(tmp_path):
    import json

    from typer.testing import CliRunner

    from commsched.cli import app

    args = ["optimize", "llama-tiny", "--parallel", "tp+sp", "--world-size", "4", "--layers", "1", "--mode", "prefill"]
    for flag, expected in (("--transforms", True), ("--no-transforms", False)):
        res = CliRunner().invoke(app, [*args, flag, "-o", str(tmp_path / flag)])
        assert res.exit_code == 0, res.output
        tried = json.loads((tmp_path / flag / "optimize.json").read_text())["tried"]
        assert any(t["label"].startswith("decomposed TP") and t["verdict"] for t in tried) == expected, flag

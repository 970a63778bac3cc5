"""Every graph commsched writes keeps the workload meta its reports read (issue 36, item 5): ``simulate --json`` of
it reports MFU at the traced dtype's peak and tokens/s, as of the traced step; a graph that cannot tell has none."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from commsched.cli import app
from commsched.frontends.json_io import load_graph, save_graph
from commsched.hardware import for_graph
from commsched.report.html import render_html
from commsched.report.rates import step_rates
from commsched.sim import simulate_costs
from commsched.workloads import build
from costs_helper import simple_costs
from programs import trace_program

runner = CliRunner()
ZOO = ["llama-tiny", "--parallel", "fsdp", "--world-size", "8", "--layers", "1"]

# each writer of a graph JSON: (its command line in ``d``, the graph file it writes)
WRITERS = {
    "trace -o": lambda d: (["trace", *ZOO, "-o", str(d / "g.json")], d / "g.json"),
    "optimize -o": lambda d: (["optimize", *ZOO, "-o", str(d / "opt")], d / "opt" / "graph.json"),
    "rewrite -o": lambda d: (["rewrite", *ZOO, "-o", str(d / "rw.json")], d / "rw.json"),
    "demo": lambda d: (["demo", "--out-dir", str(d / "demo"), "--preset", *ZOO], d / "demo" / "graph.json"),
}


def _same_workload(meta: dict, traced: dict) -> bool:
    """``meta`` has every field of the traced workload's ``traced``, the same, except the activation checkpointing an
    ``optimize`` variant may have chosen (the AC policy family retraces the step under another policy): then its
    ``ac`` is a policy the zoo parses and the workload's label names it."""
    from commsched.workloads.ac import parse_ac

    changed = {k for k in traced if meta.get(k) != traced[k]}
    if not changed:
        return True
    ac = meta.get("ac")
    return changed <= {"ac", "workload"} and parse_ac(ac) == ac and meta["workload"] == f"{traced['workload']}/ac {ac}"


def _simulate_json(path) -> dict:
    res = runner.invoke(app, ["simulate", str(path), "-H", "h100-sxm", "--json"])
    assert res.exit_code == 0, res.output
    return json.loads(res.stdout)


@pytest.fixture(scope="module")
def workload():
    return build("llama-tiny", parallel="fsdp", world_size=8, layers=1)


@pytest.mark.parametrize("writer", sorted(WRITERS))
def test_every_written_graph_keeps_the_workload_meta(writer, workload, tmp_path):
    args, path = WRITERS[writer](tmp_path)
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    traced_meta = json.loads(json.dumps(workload.meta))  # what the zoo records of the workload
    written = load_graph(path)
    assert _same_workload(written.meta, traced_meta)
    out = _simulate_json(path)
    hw = for_graph("h100-sxm", written)
    peak = hw.compute.peak_flops_for(workload.meta["dtype"])
    assert workload.meta["dtype"] == "bfloat16" and peak > hw.compute.peak_flops_for("float32")
    assert out["mfu"] == pytest.approx(written.flops.sum() / (out["makespan_s"] * peak))
    assert 0 < out["mfu"] < 1
    assert out["tokens_per_s"] == pytest.approx(workload.meta["tokens_per_step"] / out["makespan_s"])
    if writer == "trace -o":  # the traced program itself: the traced step's MFU exactly (the demo's is the kept one)
        g = workload.graph
        hw = for_graph("h100-sxm", g)
        from commsched.cost import estimate_costs

        assert out["mfu"] == pytest.approx(step_rates(simulate_costs(g, estimate_costs(g, hw)), hw).mfu)
        res = runner.invoke(app, ["schedule", str(path), "-H", "h100-sxm", "--json"])  # the same fields as simulate
        sched = json.loads(res.stdout)
        assert sched["mfu"] == pytest.approx(written.flops.sum() / (sched["makespan_s"] * peak))


def test_the_trace_cache_keeps_the_workload_meta(workload, tmp_path):
    from commsched.execute.cache import load_trace, store_trace

    store_trace("k", workload.graph, tmp_path)
    assert load_trace("k", tmp_path).meta == json.loads(json.dumps(workload.graph.meta))


def test_no_dtype_no_mfu(tmp_path):
    """A graph that names no dtype (or one the device has no peak for) has no MFU, never one at float32's peak."""
    _, g = trace_program("fsdp_mlp", 4)
    assert "dtype" not in g.meta
    path = tmp_path / "g.json"
    save_graph(g, path)
    out = _simulate_json(path)
    assert out["mfu"] is None and out["tokens_per_s"] is None
    hw = for_graph("h100-sxm", g)
    res = simulate_costs(g, simple_costs(g))
    assert step_rates(res, hw).mfu is None and "MFU (dtype unknown)" in render_html(res, hardware=hw)
    g.meta["dtype"] = "float4_e2m1fn_x2"  # h100-sxm lists no peak for it
    assert step_rates(res, hw).mfu is None
    g.meta["dtype"] = "float32"
    fp32 = hw.compute.peak_flops_for("float32")
    assert step_rates(res, hw).mfu == pytest.approx(g.flops.sum() / (res.makespan_s * fp32))


def test_optimize_of_a_zoo_module_keeps_the_workload_meta_in_every_graph_it_returns():
    """The zoo's module carries its workload meta (``ir.transform.MODULE_META_KEY``): ``optimize`` of the module alone
    (the Python API, as the demo calls it) returns a kept program and a traced one that both still have it."""
    import commsched
    from commsched.ir.transform import inheritable_meta

    w = build("llama-tiny", parallel="fsdp", world_size=8, layers=1)
    o = commsched.optimize(w.graph_module, "h100-sxm")
    want = inheritable_meta(w.graph.meta)
    for g in (o.graph, o.before.graph, o.after.graph):
        assert _same_workload(g.meta, want)
    assert step_rates(o.after).dtype == w.graph.meta["dtype"]

"""The command line: demo writes a graph, info reads it back, bad input exits 2 with a message."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from commsched.cli import app
from commsched.frontends.json_io import load_graph

runner = CliRunner()


def test_demo_then_info(tmp_path):
    res = runner.invoke(app, ["demo", "--out-dir", str(tmp_path), "--world-size", "8"])
    assert res.exit_code == 0, res.output
    g = load_graph(tmp_path / "graph.json")
    assert len(g.collectives) > 0
    # the demo schedules the traced workload and reports both orders
    from commsched.passes import check_schedule, load_schedule

    sched = load_schedule(g, tmp_path / "scheduled.json")
    check_schedule(g, sched.order)
    assert "overlap" in (tmp_path / "report.html").read_text()
    trace = json.loads((tmp_path / "trace.json").read_text())
    assert trace["traceEvents"]
    assert "traced order" in res.output and "reorder_collectives" in res.output
    res = runner.invoke(app, ["info", str(tmp_path / "graph.json"), "--json"])
    assert res.exit_code == 0, res.output
    summary = json.loads(res.output)
    assert summary["num_nodes"] == len(g)
    assert sum(r["count"] for r in summary["collectives"]) == len(g.collectives)
    assert summary["comm_bytes"] == int(g.comm_bytes.sum())


def test_info_bad_file(tmp_path):
    bad = tmp_path / "bad.json"
    bad.write_text(json.dumps({"format": "commsched.graph", "version": 7, "nodes": []}))
    res = runner.invoke(app, ["info", str(bad)])
    assert res.exit_code == 2
    assert "unknown schema version 7" in res.output

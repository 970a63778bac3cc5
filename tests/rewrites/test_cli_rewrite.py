"""``commsched rewrite``: decisions printed and written, the rewritten graph saved, bad input exits 2."""

from __future__ import annotations

import json

from typer.testing import CliRunner

from commsched.cli import app
from commsched.frontends.json_io import load_graph

runner = CliRunner()
TINY = ["llama-tiny", "--world-size", "2", "--layers", "2", "--seq-len", "16", "--batch", "2"]


def test_rewrite_buckets_and_reports(tmp_path):
    stats, out = tmp_path / "stats.json", tmp_path / "graph.json"
    res = runner.invoke(app, ["rewrite", *TINY, "--plan-on", "trace", "--stats", str(stats), "-o", str(out)])
    assert res.exit_code == 0, res.output
    assert "buckets on h100-sxm" in res.output and "step time" in res.output
    report = json.loads(stats.read_text())
    buckets = report["bucketing"]["buckets"]
    assert sum(b["members"] for b in buckets) == report["bucketing"]["summary"]["collectives"]
    assert all(b["closed_by"] for b in buckets)
    merged = report["bucketing"]["summary"]["collectives_merged"] - report["bucketing"]["summary"]["merged_buckets"]
    g = load_graph(out)
    assert len(g.collectives) == report["bucketing"]["summary"]["collectives"] - merged


def test_rewrite_lowers_all_reduces():
    res = runner.invoke(app, ["rewrite", *TINY[:1], "-p", "tp", *TINY[1:], "--no-bucket", "--lower-all-reduce"])
    assert res.exit_code == 0, res.output
    assert "one_shot" in res.output


def test_rewrite_bad_option_exits_2():
    res = runner.invoke(app, ["rewrite", *TINY, "--plan-on", "sideways"])
    assert res.exit_code == 2
    assert "--plan-on" in res.output

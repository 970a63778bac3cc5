"""``commsched estimate`` and ``commsched calibrate`` on the command line."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from commsched.cli import app
from commsched.frontends.json_io import save_graph
from programs import trace_program

runner = CliRunner()


@pytest.fixture(scope="module")
def graph_file(tmp_path_factory):
    _, g = trace_program("fsdp_mlp", 16, layers=3, dim=512)
    path = tmp_path_factory.mktemp("g") / "graph.json"
    save_graph(g, path)
    return path, g


def test_estimate_prints_totals_and_top_ops(graph_file):
    path, _ = graph_file
    res = runner.invoke(app, ["estimate", str(path), "--hardware", "h100-sxm", "--num-nodes", "2", "--top", "5"])
    assert res.exit_code == 0, res.output
    for text in ("most expensive ops", "collectives", "no overlap at all", "fusion regions"):
        assert text in res.output


def test_estimate_json(graph_file):
    path, g = graph_file
    res = runner.invoke(app, ["estimate", str(path), "-H", "a100-sxm-80g", "--num-nodes", "2", "--json"])
    assert res.exit_code == 0, res.output
    out = json.loads(res.stdout)  # stderr warns: the A100's network is not fitted (test below)
    assert out["hardware"] == "a100-sxm-80g" and out["num_nodes"] == 2
    assert out["compute_s"] > 0 and out["communication_s"] > 0
    assert out["serial_s"] == pytest.approx(out["compute_s"] + out["communication_s"])
    assert sum(r["count"] for r in out["collectives"]) == len(g.collectives)
    assert all(r["link"] == "inter_node" for r in out["collectives"])
    # eager charges more than fused
    eager = json.loads(runner.invoke(app, ["estimate", str(path), "-H", "a100-sxm-80g", "--num-nodes", "2",
                                           "--json", "--no-fusion"]).stdout)  # fmt: skip
    assert eager["compute_s"] >= out["compute_s"] and eager["fusion_regions"] == 0


def test_estimate_infers_the_nodes_from_the_world_size(graph_file):
    path, _ = graph_file  # 16 ranks: two nodes of 8 GPUs
    res = runner.invoke(app, ["estimate", str(path), "-H", "h100-sxm", "--json"])
    assert res.exit_code == 0, res.output
    assert json.loads(res.output)["num_nodes"] == 2
    res = runner.invoke(app, ["estimate", str(path), "-H", "h100-sxm", "--gpus-per-node", "4", "--json"])
    assert (json.loads(res.output)["num_nodes"], json.loads(res.output)["gpus_per_node"]) == (4, 4)


@pytest.mark.parametrize(
    ("profile", "warned"),
    [("h100-sxm", False), ("h100-sxm@ib-ndr-8x400", False), ("h100-sxm@nccl-defaults", True), ("a100-sxm-80g", True)],
)
def test_estimate_across_nodes_warns_once_of_a_network_with_no_fitted_data(graph_file, profile, warned):
    """Issue 36: h100-sxm's default network is the fitted InfiniBand (no warning); NCCL's constants (the A100's own
    network, or ``@nccl-defaults``) across nodes warn once, on stderr and under ``warnings`` in --json."""
    path, _ = graph_file  # 16 ranks: two nodes of 8
    res = runner.invoke(app, ["estimate", str(path), "-H", profile, "--json"])
    assert res.exit_code == 0, res.output
    lines = [line for line in res.stderr.splitlines() if "network is not fitted" in line]
    assert len(lines) == int(warned), res.stderr
    notes = [w for w in json.loads(res.stdout)["warnings"] if "network is not fitted" in w]
    assert len(notes) == int(warned) and all(profile in w and "2 nodes" in w for w in notes), notes
    one_node = runner.invoke(app, ["estimate", str(path), "-H", profile, "--gpus-per-node", "16", "--json"])
    assert one_node.exit_code == 0 and "network is not fitted" not in one_node.output  # one node: no network


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--hardware", "h900"], "unknown hardware profile 'h900'"),
        (["--hardware", "h100-sxm", "--num-nodes", "1"], "spans 2 nodes"),  # 16 ranks on one node of 8
        (["--hardware", "h100-sxm", "--num-nodes", "2", "--table", "/nonexistent.json"], "does not exist"),
    ],
)
def test_estimate_errors_exit_2(graph_file, args, message):
    path, _ = graph_file
    res = runner.invoke(app, ["estimate", str(path), *args])
    assert res.exit_code == 2 and message in res.output


def test_calibrate_bad_device():
    res = runner.invoke(app, ["calibrate", "--device", "tpu"])
    assert res.exit_code == 2 and "expected cpu or cuda" in res.output


def test_help_has_examples():
    for cmd in ("estimate", "calibrate"):
        res = runner.invoke(app, [cmd, "--help"])
        assert res.exit_code == 0 and "Example: commsched " + cmd in res.output

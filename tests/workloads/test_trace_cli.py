"""``commsched trace``: list, trace to JSON, clear errors."""

from __future__ import annotations

from typer.testing import CliRunner

from commsched.cli import app
from commsched.frontends.json_io import load_graph
from commsched.ir import CollType

runner = CliRunner()


def test_trace_list():
    res = runner.invoke(app, ["trace", "--list"])
    assert res.exit_code == 0, res.output
    for word in ("llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b", "fsdp+tp", "tp+sp", "decode"):
        assert word in res.output


def test_trace_writes_graph(tmp_path):
    out = tmp_path / "g.json"
    args = ["trace", "llama-tiny", "--parallel", "tp", "--world-size", "8", "--mode", "decode", "-o", str(out)]
    res = runner.invoke(app, args)
    assert res.exit_code == 0, res.output
    g = load_graph(out)
    assert g.meta["mode"] == "decode" and g.meta["world_size"] == 8
    types = {g.collective(int(c)).type for c in g.collectives}
    assert types == {CollType.ALL_REDUCE, CollType.ALL_GATHER}
    assert "all_reduce" in res.output


def test_trace_errors_exit_2():
    res = runner.invoke(app, ["trace", "llama3-8b", "--parallel", "tp", "--world-size", "64"])
    assert res.exit_code == 2 and "more TP ranks than heads" in res.output
    res = runner.invoke(app, ["trace"])
    assert res.exit_code == 2 and "--list" in res.output

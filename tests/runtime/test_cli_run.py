"""``commsched run``: help with an example, and bad input exits 2 with a one-line message before any rank starts."""

from __future__ import annotations

import pytest
from typer.testing import CliRunner

from commsched.cli import app
from commsched.runtime.netns import list_namespaces

runner = CliRunner()


def test_help_has_an_example():
    res = runner.invoke(app, ["run", "--help"])
    assert res.exit_code == 0
    assert "Example: commsched run llama-tiny" in res.output
    assert "--bandwidth" in res.output and "torchrun" in res.output


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["no-such-model"], "no-such-model"),
        (["llama-tiny", "--parallel", "pipeline"], "unknown parallelism 'pipeline'"),
        (["llama-tiny", "--costs", "guess"], "costs='guess'"),
        (["llama-tiny", "--variants", "original,original"], "distinct"),
        (["llama-tiny", "--backend", "mpi"], "--backend 'mpi'"),
        (["llama-tiny", "--bandwidth", "fast"], "bandwidth 'fast'"),
        (["llama-tiny", "--knob", "oops"], "NAME=VALUE"),
    ],
)
def test_bad_input_exits_2(args, message):
    before = set(list_namespaces())
    res = runner.invoke(app, ["run", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert set(list_namespaces()) == before  # nothing left behind


def test_bandwidth_under_torchrun_is_refused(monkeypatch):
    for var, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(var, value)
    res = runner.invoke(app, ["run", "llama-tiny", "--bandwidth", "1gbit"])
    assert res.exit_code == 2
    assert "under torchrun" in res.output

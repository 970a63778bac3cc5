"""``commsched run``: help with an example, and bad input exits 2 with a one-line message before any rank starts."""

from __future__ import annotations

import os

import pytest
from typer.testing import CliRunner

from commsched.cli import app
from commsched.runtime.netns import NAME_PREFIX, list_namespaces
from run_reports import small_run_report

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
        (["llama-tiny", "--knob", "no_such_knob=1"], "unknown knob(s) ['no_such_knob']"),
        (["llama-tiny", "--passes", "no_such_pass"], "unknown pass 'no_such_pass'"),
        (["llama-tiny", "--memory-budget", "0.5"], "memory budget ratio=0.5 must be >= 1"),
    ],
)
def test_bad_input_exits_2(args, message):
    ours = f"{NAME_PREFIX}{os.getpid()}-"  # another test process may be making its own namespaces meanwhile
    before = {n for n in list_namespaces() if n.startswith(ours)}
    res = runner.invoke(app, ["run", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output
    assert {n for n in list_namespaces() if n.startswith(ours)} == before  # nothing left behind


def test_bandwidth_under_torchrun_is_refused(monkeypatch):
    for var, value in {"RANK": "0", "WORLD_SIZE": "2", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": "1"}.items():
        monkeypatch.setenv(var, value)
    res = runner.invoke(app, ["run", "llama-tiny", "--bandwidth", "1gbit"])
    assert res.exit_code == 2
    assert "under torchrun" in res.output


def test_run_config_checks_before_any_rank_starts():
    from commsched.runtime import RunConfig
    from commsched.workloads import resolve

    spec = resolve("llama-tiny", parallel="fsdp", world_size=2, dtype="float32", attention="sdpa")
    with pytest.raises(ValueError, match="variants \\['mystery'\\]"):
        RunConfig(spec=spec, variants=("original", "mystery"))
    RunConfig(spec=spec, variants=("original", "mystery"), orders={"mystery": ("a",)})  # a given order is fine
    with pytest.raises(ValueError, match="unknown knob"):
        RunConfig(spec=spec, knobs={"no_such_knob": 1})
    with pytest.raises(ValueError, match="iters=0"):
        RunConfig(spec=spec, iters=0)
    with pytest.raises(ValueError, match="compute_nice=20"):
        RunConfig(spec=spec, compute_nice=20)


def test_a_rank_that_dies_tearing_down_keeps_the_results(tmp_path):
    import torch.multiprocessing as mp

    from commsched.runtime.launch import _report_after_exit

    exc = mp.ProcessExitedException("process 1 terminated with signal SIGABRT", 1, 42, -6, "SIGABRT")
    with pytest.raises(RuntimeError, match=r"a rank died:\n.*process 1 terminated"):
        _report_after_exit(tmp_path, exc)  # no report: the run itself failed
    raised = mp.ProcessRaisedException("Traceback ... RuntimeError: connection closed by peer", 1, 42)
    with pytest.raises(RuntimeError, match=r"a rank failed:\n.*connection closed"):
        _report_after_exit(tmp_path, raised)
    saved = small_run_report()
    saved.save(tmp_path / "report.json")
    for failure in (exc, raised):  # rank 0 saved it after the last gather: every rank had finished its steps
        report = _report_after_exit(tmp_path, failure)
        assert report.variants == saved.variants
        assert "after the run completed" in report.teardown_error
    assert "SIGABRT" in _report_after_exit(tmp_path, exc).teardown_error

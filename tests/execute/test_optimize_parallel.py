"""optimize's candidates judged on the local pool: the same kept variant, order and per-candidate figures as the
serial search (the Ray backends: test_ray.py)."""

from __future__ import annotations

import pytest
from optimize_helpers import optimized

from commsched.execute.local import LocalExecutor


@pytest.fixture(scope="module")
def serial() -> dict:
    return {p: optimized(p) for p in ("fsdp", "ddp")}


def test_the_searches_judge_enough_candidates(serial):
    fsdp, ddp = serial["fsdp"], serial["ddp"]
    searched = [
        t
        for t in fsdp["tried"]
        if not t["label"].startswith(("split batch", "split sequence"))  # the splits: not applicable
        and not t["label"].startswith("ac policy")  # the AC family: its retraced plans are judged in this process
        and "gathers kept" not in t["label"]
    ]  # the FSDP gathers kept for the backward: in this process
    assert len(searched) == 36 and sum(t["collectives"] is not None for t in searched) >= 20
    assert any("gathers kept" in t["label"] and t["collectives"] is not None for t in fsdp["tried"])
    assert sum(t["verdict"].startswith("pruned") for t in fsdp["tried"]) >= 10  # probes ranked, then pruned
    assert ddp["kept"].startswith("bucketed") and ddp["collectives"]["kept"] < ddp["collectives"]["traced"]


@pytest.mark.slow
def test_a_pool_of_workers_gives_the_serial_search(serial):
    with LocalExecutor(jobs=2, in_process=False) as ex:
        pooled = {p: optimized(p, ex) for p in ("fsdp", "ddp")}
    assert pooled == serial  # winner, order of the candidates, every figure and verdict; the DDP winner rebuilt


def _without_walls(data):
    """``data`` with every ``wall_s`` (the search's, each reference's) left out: the answer, not how long it took."""
    if isinstance(data, dict):
        return {k: _without_walls(v) for k, v in data.items() if k != "wall_s"}
    return [_without_walls(v) for v in data] if isinstance(data, list) else data


@pytest.mark.slow
def test_the_optimize_command_judges_on_a_pool_with_the_same_answer(tmp_path):
    """`commsched optimize --jobs 2`: the candidates run on two processes, and optimize.json (kept program, every
    variant's figures and verdict) is the one-process run's."""
    import json

    from typer.testing import CliRunner

    from commsched.cli import app

    args = ["optimize", "llama3-8b", "-p", "ddp", "-w", "8", "--layers", "1", "--seq-len", "256"]
    out = {}
    for jobs in ("1", "2"):
        res = CliRunner().invoke(app, [*args, "--jobs", jobs, "-o", str(tmp_path / jobs)])
        assert res.exit_code == 0, res.output
        data = json.loads((tmp_path / jobs / "optimize.json").read_text())
        out[jobs] = _without_walls(data)
    assert out["1"] == out["2"] and len(out["1"]["tried"]) >= 10 and out["1"]["references"]["torch"]

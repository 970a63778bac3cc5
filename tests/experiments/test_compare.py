"""commsched compare: every scheduler on one traced workload, simulated alike."""

from __future__ import annotations

import json

import pytest
from typer.testing import CliRunner

from commsched.cli import app
from commsched.cost import estimate_costs
from commsched.experiments.compare import PROGRAM_CONFIGS, compare_schedulers
from commsched.hardware import get
from commsched.workloads import build


def test_compare_rows_on_a_traced_workload():
    w = build("llama-tiny", parallel="fsdp", world_size=8, layers=1)
    costs = estimate_costs(w.graph, get("h100-sxm"))
    res = compare_schedulers(w.graph, costs, gm=w.graph_module, exact_time_limit_s=10)
    names = [r.scheduler for r in res.rows]
    for expected in (
        "input order",
        "sink_waits",
        "raise_comms",
        "reorder_compute_for_overlap",
        "reorder_communication_preserving_peak_memory",
        "sink_waits_iterative",
        "overlap (ours)",
        "torch OverlapScheduler",
    ):
        assert expected in names
    ours, base = res.row("overlap (ours)"), res.row("input order")
    assert ours.makespan_s <= base.makespan_s
    # the equal-memory row: ours with torch's peak as its hard budget
    theirs, same_memory = res.row("torch OverlapScheduler"), res.row("overlap (ours, reorder, torch's peak as budget)")
    assert same_memory.peak_memory_bytes <= theirs.peak_memory_bytes
    assert ours.peak_memory_bytes <= base.peak_memory_bytes * 1.05 + 1
    programs = {"optimize (ours)", *(name for name, _ in PROGRAM_CONFIGS)}  # other programs, other bounds
    for r in res.rows:
        if r.makespan_s is not None and r.scheduler not in programs:
            assert r.makespan_s >= res.lower_bound_s * (1 - 1e-9), r.scheduler
    # the program-changing rows: torch's bucketing configurations and optimize, each with its program's bound
    for name in programs:
        assert "collectives" in res.row(name).note or res.row(name).note.startswith("failed"), name
    opt = res.row("optimize (ours)")
    assert opt.makespan_s <= min(ours.makespan_s, res.row("overlap (ours, reorder_collectives)").makespan_s)
    assert opt.peak_memory_bytes <= base.peak_memory_bytes * 1.05 + 1
    if len(w.graph) <= 300:
        exact = res.row("exact (CP-SAT)")
        assert exact.makespan_s is not None or exact.note


def test_compare_cli_writes_json(tmp_path):
    out = tmp_path / "rows.json"
    res = CliRunner().invoke(
        app, ["compare", "llama-tiny", "-w", "8", "-l", "1", "--no-torch", "--exact-max-nodes", "0", "--json", str(out)]
    )
    assert res.exit_code == 0, res.output
    data = json.loads(out.read_text())
    assert {r["scheduler"] for r in data["rows"]} >= {"input order", "overlap (ours)"}
    assert data["lower_bound_s"] > 0


def test_compare_cli_takes_tp_size_seq_len_batch_and_prints_failures_whole(tmp_path):
    """Issue 19.8: ``compare`` on TP prefill needed --tp-size / --seq-len / --batch, and a scheduler's failure was
    cut off at 60 characters in the table; every failed row's whole reason is now printed below it."""
    from typer.testing import CliRunner

    from commsched.cli import app

    args = ["compare", "llama-tiny", "-p", "tp", "-m", "prefill", "-w", "4", "-l", "1", "--seq-len", "64", "--batch",
            "2", "--tp-size", "2", "--exact-max-nodes", "0", "--json", str(tmp_path / "rows.json")]  # fmt: skip
    res = CliRunner().invoke(app, args)
    assert res.exit_code == 0, res.output
    rows = json.loads((tmp_path / "rows.json").read_text())["rows"]
    failed = [r for r in rows if r["makespan_s"] is None]
    for r in failed:
        assert f"{r['scheduler']}: {r['note']}" in res.output  # the whole note, on one line


def _figures(out: list[dict]) -> list:
    """Every row's figures, without the pass wall times (which differ run to run)."""
    return [(o["target"], o.get("error"), [{k: v for k, v in r.items() if k != "wall_s"} for r in
             o.get("result", {}).get("rows", [])]) for o in out]  # fmt: skip


@pytest.mark.slow
def test_compare_many_sends_graphs_by_content_and_agrees_across_workers(tmp_path):
    from commsched.execute.local import LocalExecutor
    from commsched.experiments.compare import compare_many, result_from_dict
    from commsched.frontends.json_io import save_graph

    save_graph(build("llama-tiny", parallel="tp", world_size=4, layers=1).graph, tmp_path / "tp.json")
    targets = [str(tmp_path / "tp.json"), "llama-tiny", "llama-nope"]
    kw = {"hardware": "h100-sxm", "build": {"parallel": "fsdp", "world_size": 8, "layers": 1}, "torch_peer": False,
          "exact_max_nodes": 0}  # fmt: skip
    with LocalExecutor(jobs=1) as ex:
        here = compare_many(targets, executor=ex, **kw)
    with LocalExecutor(jobs=2, in_process=False) as ex:
        pooled = compare_many(targets, executor=ex, **kw)
    assert _figures(here) == _figures(pooled)
    assert [o["target"] for o in here] == targets and here[2]["error"].startswith("trace: ValueError: unknown preset")
    res = result_from_dict(here[1]["result"])
    assert res.meta["nodes"] > 0 and res.row("overlap (ours)").makespan_s <= res.row("input order").makespan_s
    (tmp_path / "tp.json").unlink()  # the graph went by content: the result does not need the file any more
    assert result_from_dict(pooled[0]["result"]).meta["target"] == targets[0]


def test_cli_compares_several_targets(tmp_path):
    out = tmp_path / "many.json"
    args = ["compare", "llama-tiny,llama-nope", "-w", "8", "-l", "1", "--no-torch", "--exact-max-nodes", "0", "-j", "1"]
    res = CliRunner().invoke(app, [*args, "--json", str(out)])
    assert res.exit_code == 0, res.output
    assert "llama-tiny (1 of 2 layers): " in res.output and "error llama-nope: trace: ValueError" in res.output
    assert [t["target"] for t in json.loads(out.read_text())["targets"]] == ["llama-tiny", "llama-nope"]

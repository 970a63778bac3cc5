"""``sweep`` over pipeline schedules (``experiments/sweep_pipeline.py``, ``commsched sweep --pp-size``): one row per
(schedule, M, V) with the step ``commsched pipeline`` simulates, torch's refusals as error rows; ``compare`` refuses
PP in one line."""

from __future__ import annotations

import itertools
import json

import pytest
from typer.testing import CliRunner

from commsched.cli import app
from commsched.experiments.sweep import PipelineSweep, run_sweep
from commsched.experiments.sweep_row import SweepRow
from commsched.pipeline.job import PipelineJob, simulate_job

runner = CliRunner()
JOB = {"parallel": "fsdp+tp", "world_size": 8, "tp_size": 2}
SCHEDULES, MICROBATCHES = ("1F1B", "Interleaved1F1B", "DualPipeV"), (2, 4)


@pytest.fixture(scope="module")
def rows():
    sweep = PipelineSweep(pp_sizes=(2,), schedules=SCHEDULES, microbatches=MICROBATCHES)
    return run_sweep("llama-tiny", parallel=JOB["parallel"], world_sizes=JOB["world_size"], hardware="h100-sxm",
                     tp_size=JOB["tp_size"], pipeline=sweep, processes=1, cache=False, resume=False)  # fmt: skip


def test_one_row_per_schedule_and_m_in_order_each_the_pipeline_command_s_step(rows):
    assert [(r.pp_schedule, r.microbatches) for r in rows] == list(itertools.product(SCHEDULES, MICROBATCHES))
    for r in (r for r in rows if r.ok):
        step = simulate_job(PipelineJob(preset="llama-tiny", pp_size=2, schedule=r.pp_schedule,
                                        microbatches=r.microbatches, **JOB), "h100-sxm")  # fmt: skip
        res = step.result
        assert r.step_time_s == step.step_s and r.tokens_per_s_per_gpu == step.tokens_per_s_per_gpu
        assert r.bubble_fraction == res.bubble_fraction and r.peak_memory_bytes == res.peak_memory_bytes
        assert r.exposed_comm_s == max(k.exposed_comm_s for k in res.per_rank)
        assert r.stages_per_rank == res.program.stages_per_rank and r.pp_size == 2 and r.num_nodes == 1
        assert r.tokens_per_step == r.microbatches * 64 * 2  # M sequences of 64 tokens per replica, fsdp 2 replicas


def test_a_combination_torch_refuses_is_a_row_with_its_one_line_reason(rows):
    bad = [r for r in rows if not r.ok]
    assert [(r.pp_schedule, r.microbatches) for r in bad] == [("DualPipeV", 2)]  # torch: M >= 2P stages
    assert bad[0].stages_per_rank == 2 and "\n" not in bad[0].error
    assert bad[0].error.startswith("pipeline: ValueError:") and "microbatches" in bad[0].error
    assert SweepRow.from_dict(bad[0].to_dict()) == bad[0] and SweepRow.from_dict(rows[0].to_dict()) == rows[0]


def test_more_micro_batches_shrink_the_bubble_and_interleaving_beats_1f1b(rows):
    by = {(r.pp_schedule, r.microbatches): r for r in rows}
    for name in ("1F1B", "Interleaved1F1B"):
        assert by[name, 4].bubble_fraction < by[name, 2].bubble_fraction
    assert by["Interleaved1F1B", 4].bubble_fraction < by["1F1B", 4].bubble_fraction


SWEEP = ["sweep", "llama-tiny", "-p", "fsdp+tp", "-w", "8", "--tp-size", "2", "-H", "h100-sxm", "--jobs", "1",
         "--no-cache", "--pp-size", "2"]  # fmt: skip


def test_the_command_prints_the_rows_and_its_json_has_them():
    args = [*SWEEP, "--pp-schedule", "1F1B,dualpipev", "--microbatches", "2,4"]
    table = runner.invoke(app, args)
    assert table.exit_code == 0, table.output
    assert "DualPipeV" in table.output and "tokens/s" in table.output and "bubble" in table.output
    assert "error fsdp+tp world 8 P=2 DualPipeV M=2 V=2 on h100-sxm: pipeline: ValueError" in table.output
    res = runner.invoke(app, [*args, "--json", "-"])
    assert res.exit_code == 0, res.output
    data = json.loads(res.stdout)
    assert data["version"] == 3 and data["schedule"] is None and len(data["rows"]) == 4
    ok = [r for r in data["rows"] if r["error"] is None]
    assert len(ok) == 3 and all(r["step_time_s"] > 0 and 0 < r["bubble_fraction"] < 1 for r in ok)
    assert [(r["pp_schedule"], r["microbatches"], r["stages_per_rank"]) for r in data["rows"]] == [
        ("1F1B", 2, 1), ("1F1B", 4, 1), ("DualPipeV", 2, 2), ("DualPipeV", 4, 2)]  # fmt: skip


@pytest.mark.parametrize("args, words", [
    (["--pp-schedule", "Zigzag"], ["schedule='Zigzag'", "1F1B"]),
    (["--optimize", "on"], ["optimize", "expected off"]),
    (["--kv-len", "128"], ["kv_len", "pipeline job"]),
    (["--out", "x.png"], ["--out", "--pp-size"]),
    (["--microbatches", "2,x"], ["--microbatches", "'x'"]),
])  # fmt: skip
def test_bad_pipeline_sweeps_exit_2_with_one_line_naming_the_option(args, words, tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    res = runner.invoke(app, [*SWEEP, *args])
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and lines[0].startswith("error: "), res.output
    assert all(w in lines[0] for w in words), lines[0]


def test_a_pipeline_option_without_pp_size_and_compare_with_pp_are_refused():
    res = runner.invoke(app, ["sweep", "llama-tiny", "--microbatches", "4"])
    assert res.exit_code == 2 and "--microbatches: a pipeline option; give --pp-size too" in res.stderr
    res = runner.invoke(app, ["compare", "llama-tiny", "--pp-size", "2"])
    lines = [line for line in res.stderr.splitlines() if line.strip()]
    assert res.exit_code == 2 and len(lines) == 1 and "commsched sweep" in lines[0] and "--pp-size" in lines[0]

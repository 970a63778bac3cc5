"""plan's caches change no result: the ranking with the trace cache cold, warm and off is the same; a warm plan traces
nothing (PP stages included); Ray ranks the same as the local pool."""

from __future__ import annotations

import collections
import dataclasses

import pytest

from commsched.plan import Layout, PlanRequest, judge, plan, traced
from commsched.plan.search import plan_hardware

REQ = PlanRequest(preset="llama-tiny", gpus=2, ac_policies=("none",), float8_recipes=("none",), max_pp=1,
                  layers_scale=0)  # fmt: skip


def _table(result) -> list[tuple]:
    return [(j.layout, j.step_s, j.framework_step_s, j.peak_memory_bytes, j.exposed_comm_s, j.recompute_s, j.kept)
            for j in result.ranked]  # fmt: skip


def _forget(monkeypatch) -> None:
    """This process forgets its traces, stage records and simulated jobs (an earlier test's, under another cache)."""
    import commsched.pipeline.cache as stage_cache

    monkeypatch.setattr(traced, "_MEMORY", collections.OrderedDict())
    monkeypatch.setattr(judge, "_JOBS", collections.OrderedDict())
    monkeypatch.setattr(stage_cache, "_TRACED", {})
    monkeypatch.setattr(stage_cache, "_RECORDS", {})


def _no_tracing(monkeypatch) -> None:
    """This process forgets its traces, and tracing anew fails the test."""
    import commsched.experiments.predict as predict
    import commsched.pipeline.cache as stage_cache

    def refuse(*args, **kwargs):
        raise AssertionError("a warm plan traced a program")

    _forget(monkeypatch)
    monkeypatch.setattr(predict, "trace", refuse)
    monkeypatch.setattr(stage_cache, "trace_stage", refuse)


@pytest.fixture(scope="module")
def uncached():
    return plan(REQ, jobs=1, cache=False, resume=False)


def test_the_ranking_is_the_same_with_the_cache_cold_warm_and_off(uncached, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COMMSCHED_CACHE_DIR", str(tmp_path))
    monkeypatch.setattr(traced, "_MEMORY", collections.OrderedDict())
    cold = plan(REQ, jobs=1, resume=False)
    assert len(list((tmp_path / "traces").glob("*.npz"))) == cold.candidates_judged  # one trace per layout
    _no_tracing(monkeypatch)
    warm = plan(REQ, jobs=1, resume=False)  # every row judged again, from the cached traces
    assert len(uncached.ranked) >= 3
    assert _table(cold) == _table(uncached) and _table(warm) == _table(uncached)


def test_a_pipeline_layout_judged_again_takes_its_stages_from_the_disk_cache(tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("COMMSCHED_CACHE_DIR", str(tmp_path))
    req = dataclasses.replace(REQ, layers=4, global_batch=4, max_pp=None)
    layout = Layout(dp_shard=1, pp=2, pp_schedule="1F1B", microbatches=2, stages_per_rank=1)
    spec = {"request": dataclasses.asdict(req), "hardware": plan_hardware(req), "layouts": [layout.to_dict()]}
    _forget(monkeypatch)  # what earlier tests left in this process must not spare the first judge its disk writes
    first = judge.judge_task(spec)[0]
    _no_tracing(monkeypatch)  # as another task in a fresh process: only the disk cache is left
    again = judge.judge_task(spec)[0]
    assert first["error"] is None and again["error"] is None
    assert {k: v for k, v in again.items() if k != "wall_s"} == {k: v for k, v in first.items() if k != "wall_s"}


def test_pipeline_layouts_of_one_job_are_simulated_once_with_the_same_rows(tmp_path, monkeypatch) -> None:
    """A task simulates each distinct PipelineJob once; each row equals the one judged alone in a fresh process."""
    import commsched.pipeline.job as job_module
    from commsched.plan.layout import pipeline_job

    monkeypatch.setenv("COMMSCHED_CACHE_DIR", str(tmp_path))
    req = dataclasses.replace(REQ, gpus=8, layers=4, global_batch=8, max_pp=None)
    layouts = [Layout(dp_shard=4, pp=2, pp_schedule=s, microbatches=2, stages_per_rank=v) for s, v in
               (("Interleaved1F1B", 2), ("ZBVZeroBubble", 2))]  # fmt: skip
    layouts += [dataclasses.replace(lay, dp_shard=2, dp_replicate=2) for lay in layouts]
    calls = []
    real = job_module.simulate_job
    monkeypatch.setattr(job_module, "simulate_job", lambda job, hw: calls.append(job) or real(job, hw))
    hw = plan_hardware(req)
    spec = {"request": dataclasses.asdict(req), "hardware": hw, "layouts": [lay.to_dict() for lay in layouts]}
    together = judge.judge_task(spec)
    assert len(calls) == len({pipeline_job(req, lay, None) for lay in layouts}) <= len(layouts)
    for lay, row in zip(layouts, together, strict=True):
        monkeypatch.setattr(judge, "_JOBS", collections.OrderedDict())
        alone = judge.judge_task({**spec, "layouts": [lay.to_dict()]})[0]
        assert row["error"] is None and {k: v for k, v in row.items() if k != "wall_s"} == {
            k: v for k, v in alone.items() if k != "wall_s"
        }


@pytest.mark.ray
@pytest.mark.slow
def test_ray_ranks_the_same_as_the_local_pool(uncached, tmp_path, monkeypatch) -> None:
    from commsched.execute.factory import ray_available

    if not ray_available():
        pytest.skip("Ray is not installed: pip install 'commsched[ray]'")
    monkeypatch.setenv("COMMSCHED_CACHE_DIR", str(tmp_path))
    on_ray = plan(REQ, ray_address="local", jobs=2, resume=False)
    assert _table(on_ray) == _table(uncached)

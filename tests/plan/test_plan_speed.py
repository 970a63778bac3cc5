"""plan's caches change no result: the ranking with the trace cache cold, warm and off is the same; a warm plan traces
nothing (PP stages included); Ray ranks the same as the local pool. The optimise round's prune is sound: its bound is
never above the optimised estimate, and a plan with it keeps the winner and every row it optimised as without it."""

from __future__ import annotations

import collections
import dataclasses

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.plan import Layout, PlanRequest, judge, plan, search, traced
from commsched.plan.prune import optimised_step_lower_bound_s
from commsched.plan.scale import extrapolate
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


def _point(step_s: float, exposed_s: float, bound_s: float, optimised_s: float | None, peak: float) -> dict:
    """One depth's fields as judge's ``_step`` gives them (the framework's; ``optimised_s`` the search's step)."""
    return {"framework_step_s": step_s, "framework_exposed_s": exposed_s, "lower_bound_s": bound_s,
            "framework_peak_bytes": peak, "optimized_peak_bytes": None if optimised_s is None else peak,
            "recompute_s": 0.0, "optimized_step_s": optimised_s}  # fmt: skip


seconds = st.floats(0.0, 20.0, allow_nan=False, allow_subnormal=False)
fractions = st.floats(0.0, 1.0, allow_nan=False, allow_subnormal=False)


@settings(max_examples=300, deadline=None)
@given(st.tuples(seconds, fractions, fractions), st.tuples(seconds, fractions, fractions), fractions,
       st.integers(1, 8), st.integers(4, 200))  # fmt: skip
def test_the_optimised_bound_is_never_above_the_estimate(k, k2, searched, k_layers, depth) -> None:
    """Any first round (framework step >= its simulated bound, exposed communication at most the step) and any search
    result between the bound and the framework step at 2K layers: the bound from the first round alone is at most
    the optimised step at depth that :func:`judge.optimised_at_depth` gives, and at most the row's step."""
    points = []
    for step_s, exposed, bound in (k, k2):
        points.append(_point(step_s, exposed * step_s, bound * step_s, None, 1.0))
    deeper = points[1]
    optimised_s = deeper["lower_bound_s"] + searched * (deeper["framework_step_s"] - deeper["lower_bound_s"])
    depth = max(depth, 2 * k_layers + 1)
    row = {name: extrapolate(points[0][name], deeper[name], k_layers, depth) for name in judge.SCALED
           if name != "optimized_peak_bytes"}  # fmt: skip
    bound = optimised_step_lower_bound_s({**row, "points": points})
    estimate = judge.optimised_at_depth({**deeper, "optimized_step_s": optimised_s},
                                        {**row, "optimized_peak_bytes": 1.0})["optimized_step_s"]  # fmt: skip
    assert bound <= estimate
    assert bound <= row["framework_step_s"]  # the row's step is the smaller of the two
    full = _point(deeper["framework_step_s"], deeper["framework_exposed_s"], deeper["lower_bound_s"], optimised_s, 1.0)
    assert optimised_step_lower_bound_s({**full, "points": [full]}) <= optimised_s  # every layer


PRUNED_REQ = PlanRequest(preset="llama-tiny", gpus=2, ac_policies=("none",), float8_recipes=("none",),
                         max_pp=1, layers=4, layers_scale=1, seq_len=256)  # fmt: skip


def _plain(layout: Layout) -> bool:
    """The degree mixes alone (FSDP, HSDP, CP, TP with and without SP), each traced in a second or two."""
    return layout.reshard_after_forward and not layout.async_tp


def test_the_optimise_rounds_prune_keeps_the_winner_and_every_row_it_optimised(tmp_path, monkeypatch) -> None:
    """Scaled from 1 and 2 layers: the plan with the prune against the same plan optimising every fitting layout.
    The winner and every row both optimised are identical; a row the prune spared ``optimize`` keeps its framework
    step, and optimised it would not have beaten the winner."""
    monkeypatch.setenv("COMMSCHED_CACHE_DIR", str(tmp_path))
    pruned = plan(PRUNED_REQ, jobs=1, resume=False, only=_plain)
    monkeypatch.setattr(search, "optimised_step_lower_bound_s", lambda row: float("-inf"))
    every = plan(PRUNED_REQ, jobs=1, resume=False, only=_plain)
    assert every.not_optimised == 0 < pruned.not_optimised
    assert _table(pruned)[0] == _table(every)[0]
    rows = {row[0]: row for row in _table(every)}
    spared = [row for row in _table(pruned) if row != rows[row[0]]]
    assert len(spared) <= pruned.not_optimised
    for layout, step_s, framework_step_s, *_ in spared:
        assert step_s == framework_step_s and rows[layout][1] > every.winner.step_s

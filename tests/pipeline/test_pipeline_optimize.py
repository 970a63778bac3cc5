"""Pipeline optimisation (issue 39): the stage cache and layer scaling, the search over schedule, M and V under a
memory budget, ``commsched pipeline --optimize``."""

from __future__ import annotations

import json

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from commsched.cli import app
from commsched.pipeline import StageCosts, lower_schedule
from commsched.pipeline import cache as stage_cache
from commsched.pipeline.job import PipelineJob
from commsched.pipeline.optimize import candidates, optimize_costs, optimize_pipeline
from commsched.pipeline.stages import stage_seconds, trace_stage

runner = CliRunner()


pytestmark = pytest.mark.usefixtures("own_stage_cache")  # each test a cold process (conftest)


def _spec(parallel: str = "tp+sp", layers: int = 4, preset: str = "llama-tiny"):
    job = PipelineJob(preset=preset, parallel="fsdp+" + parallel, world_size=8, tp_size=2, pp_size=2,
                      schedule="1F1B", microbatches=2, layers=layers, seq_len=512)  # fmt: skip
    return job.resolve().compute


# ---------------------------------------------------------------- the cache and layer scaling
@pytest.mark.parametrize(("preset", "parallel", "first", "last"), [("llama-tiny", "tp", True, False),
                         ("llama-tiny", "tp", False, True), ("llama3-8b", "tp+sp", False, False)])  # fmt: skip
def test_a_long_stage_from_two_short_traces_equals_its_full_trace(preset, parallel, first, last):
    """Layer scaling (pipeline/cache.py): F, B, I, W and the activation bytes of a 5-layer stage extrapolated from
    its 2- and 3-layer traces equal the 5-layer trace's to 1e-6 (the first, a middle and the last stage; with SP
    the blocks repeat to a ns of rounding each, so a block of real width is checked)."""
    spec = _spec(parallel, 5, preset)
    scaled = stage_cache.stage_record(spec, (first, 5, last), "h100-sxm", disk=False)
    assert scaled.traced_layers == (2, 3)
    full = trace_stage(spec, first, 5, last)
    secs = stage_seconds(full, "h100-sxm")
    for name in ("forward_s", "backward_s", "backward_input_s", "backward_weight_s"):
        assert getattr(scaled.times, name) == pytest.approx(getattr(secs, name), rel=1e-6, abs=1e-12), name
    assert scaled.activation_bytes == full.activation_bytes
    assert scaled.send_bytes == full.send_bytes


def test_a_second_process_reads_stages_costs_and_schedules_from_disk(monkeypatch):
    spec = _spec(layers=2)
    record = stage_cache.stage_record(spec, (True, 2, False), "h100-sxm")
    from commsched.pipeline.actions import PipelineProgram

    def lower(name, p, m, v, defer_recv):
        return lower_schedule(name, p, m, v, defer_recv=defer_recv)

    program = stage_cache.cached_program("Interleaved1F1B", 2, 4, 2, False, lower, PipelineProgram)
    stage_cache.clear_memory()

    def no_trace(*args, **kwargs):
        raise AssertionError("traced again: the disk cache missed")

    monkeypatch.setattr(stage_cache, "trace_stage", no_trace)
    again = stage_cache.stage_record(spec, (True, 2, False), "h100-sxm")
    assert again == record
    traced = stage_cache.cached_trace(spec, True, 2, False)
    assert traced.graph.names and traced.activation_bytes == record.activation_bytes
    reread = stage_cache.cached_program("Interleaved1F1B", 2, 4, 2, False, no_trace, PipelineProgram)
    assert [a.tolist() for a in reread.actions] == [a.tolist() for a in program.actions]
    assert reread.stage_to_rank.tolist() == program.stage_to_rank.tolist()


def test_an_unreadable_cache_entry_is_a_miss(tmp_path):
    spec = _spec(layers=2)
    stage_cache.stage_record(spec, (False, 1, True), "h100-sxm")
    for path in (tmp_path / "cache").rglob("*.json"):
        path.write_text("{not json")
    stage_cache.clear_memory()
    assert stage_cache.stage_record(spec, (False, 1, True), "h100-sxm").send_bytes == 0


# ---------------------------------------------------------------- the search on given stage costs
def _unit_costs(f: float, b: float, w: float, act: int, static: int, batch: int):
    """A rank's layers split over v stages, each micro-batch batch / m of the batch: costs scale with both."""

    def costs(v: int, m: int) -> StageCosts:
        share = batch / m / v
        return StageCosts(forward_s=f * share, backward_input_s=b * share, backward_weight_s=w * share,
                          activation_bytes=int(act * share), static_bytes=static // v)  # fmt: skip

    return costs


@settings(max_examples=15, deadline=None)
@given(p=st.sampled_from([2, 4]), batch=st.sampled_from([4, 8]), f=st.integers(1, 4), b=st.integers(1, 4),
       w=st.integers(1, 4), act=st.integers(1, 64), budget=st.integers(40, 400))  # fmt: skip
def test_the_kept_plan_is_never_slower_than_the_input_nor_over_budget(p, batch, f, b, w, act, budget):
    costs = _unit_costs(f * 1e-3, b * 1e-3, w * 1e-3, act << 20, 32 << 20, batch)
    plan = optimize_costs("1F1B", p, batch, None, costs, budget << 20, free_comm=True)
    base = plan.baseline
    assert (base.schedule, base.microbatches, base.stages_per_rank) == ("1F1B", batch, 1)
    assert len(plan.tried) == len({(t.schedule, t.microbatches, t.stages_per_rank) for t in plan.tried})
    if plan.kept is None:
        assert all(t.refused or t.peak_memory_bytes > budget << 20 for t in plan.tried)
        return
    assert plan.kept.peak_memory_bytes <= budget << 20
    assert plan.kept.step_s == plan.step.step_s
    if base.step_s is not None and base.peak_memory_bytes <= budget << 20:
        assert plan.kept.step_s <= base.step_s
    for t in plan.tried:
        if t.verdict.startswith("slower by"):
            assert t.step_s >= plan.kept.step_s and t.peak_memory_bytes <= budget << 20
        elif t.verdict.startswith("over budget"):
            assert t.peak_memory_bytes > budget << 20
        else:
            assert t.verdict == "kept" or t.verdict.startswith("refused: ")


def test_candidates_are_every_schedule_at_every_divisor_of_the_batch():
    grid = candidates(6)
    assert {m for _, m, _ in grid} == {1, 2, 3, 6}
    assert {v for name, _, v in grid if name in ("GPipe", "1F1B")} == {1}
    assert {v for name, _, v in grid if name in ("ZBVZeroBubble", "DualPipeV")} == {2}
    assert {v for name, _, v in grid if name == "Interleaved1F1B"} == {2, 4}


# ---------------------------------------------------------------- DualPipeV's overlapped F&B pairs
def test_an_overlapped_pair_costs_at_most_f_plus_b_and_at_least_the_longer_part():
    """A TP+SP stage (dense): one micro-batch's TP collectives under the other's compute make the pair shorter than
    F + B in turn, never shorter than the longer part; the DualPipeV step with the pairs is never longer."""
    from commsched.pipeline.job import simulate_job
    from commsched.pipeline.optimize import with_pairs
    from commsched.pipeline.overlap_fb import pair_graph, pair_seconds

    job = PipelineJob(preset="llama-tiny", parallel="fsdp+tp+sp", world_size=8, tp_size=2, pp_size=2,
                      schedule="DualPipeV", microbatches=4, layers=2, seq_len=512).resolve()  # fmt: skip
    mid = stage_cache.cached_trace(job.compute, False, 1, False)
    g, fwd = pair_graph(mid, mid)
    g.validate()
    assert fwd.sum() == mid.forward.sum()  # every forward node, then the backward's
    times = pair_seconds(mid, mid, "h100-sxm")
    assert max(times.compute_s) <= times.pair_s <= times.in_turn_s
    step = simulate_job(job, "h100-sxm")
    paired = with_pairs(step, "h100-sxm")
    table, costs = paired.costs.overlap_f_b_s, step.costs
    used = [(f, b) for f in range(4) for b in range(4) if table[f, b] < costs.forward_s[f] + costs.backward_s[b]]
    assert used, "no pair saved anything"
    for f in range(4):
        for b in range(4):
            whole = costs.forward_s[f] + costs.backward_s[b]
            assert max(costs.forward_s[f], costs.backward_s[b]) <= table[f, b] <= whole + 1e-15
    assert paired.step_s <= step.step_s


# ---------------------------------------------------------------- a zoo job
def test_a_smaller_405b_kept_plan_is_1_10x_faster_than_1f1b_at_m_p_and_every_try_says_why():
    """The 405B acceptance (benchmarks/RESULTS.md, "Pipeline optimize") at a small size: FSDP + TP, P = 4, the
    batch of M = P micro-batches, the profile's HBM per rank; the kept plan beats torchtitan's old default, 1F1B at
    M = P, by at least 1.10x, and each try says why it lost."""
    job = PipelineJob(preset="llama-tiny", parallel="fsdp+tp", world_size=16, tp_size=2, pp_size=4, schedule="1F1B",
                      microbatches=4, batch=4, layers=8, seq_len=256)  # fmt: skip
    plan = optimize_pipeline(job, "h100-sxm", schedules=("1F1B", "Interleaved1F1B", "ZBVZeroBubble"),
                             stages_per_rank=(2,))  # fmt: skip
    assert plan.baseline.label == "1F1B M=4 V=1" and plan.baseline.verdict.startswith("slower by")
    assert plan.kept is not None and plan.speedup >= 1.10, plan.summary()
    assert plan.kept.peak_memory_bytes <= plan.memory_budget_bytes
    assert plan.step.step_s == plan.kept.step_s
    assert plan.stage_overlap.startswith(("kept", "not kept"))
    refused = [t for t in plan.tried if t.refused]
    assert any(t.label == "1F1B M=1 V=1" for t in refused)  # torch: 1F1B needs M >= P
    # exposed: the step's growth over free P2P (a chain of transfers across ranks can exceed one rank's wire time)
    assert 0 <= plan.exposed_p2p_s < plan.step.step_s and plan.p2p_wire_s > 0
    # a budget below the input's peak: the input loses as over budget, and what is kept fits
    budget = plan.baseline.peak_memory_bytes - 1
    tight = optimize_pipeline(job, "h100-sxm", budget, schedules=("1F1B", "GPipe"), stage_overlap=False)
    assert tight.tried[0].verdict.startswith("over budget by")
    assert tight.kept is None or tight.kept.peak_memory_bytes <= budget


def test_the_command_optimizes_and_prints_json():
    args = ["pipeline", "llama-tiny", "--parallel", "fsdp+tp", "--world-size", "8", "--tp-size", "2", "--pp-size",
            "2", "--layers", "2", "--seq-len", "64", "--microbatches", "2", "--optimize", "--json", "-"]  # fmt: skip
    out = runner.invoke(app, args)
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert data["baseline"]["label"] == "1F1B M=2 V=1" and data["kept"]["verdict"] == "kept"
    assert data["speedup"] >= 1.0 and len(data["tried"]) == len(candidates(2))
    bad = runner.invoke(app, [*args[:-3], "--optimize", "--memory-budget", "0"])
    assert bad.exit_code == 2 and "--memory-budget" in bad.output


# ---------------------------------------------------------------- AC as an option of the search
def test_the_ac_policies_are_searched_and_decide_under_a_tight_budget():
    """With ``ac_policies`` every (schedule, M, V) is tried under each AC policy (the job's own first, so the input
    stays the first try); AC trades held activations for recompute, so without a budget the fastest try runs no
    AC, and under a budget below every no-AC try's peak the kept plan checkpoints and fits."""
    from commsched.pipeline.optimize import AC_POLICIES

    job = PipelineJob(preset="llama-tiny", parallel="fsdp+tp", world_size=8, tp_size=2, pp_size=2, schedule="1F1B",
                      microbatches=2, batch=4, layers=2, seq_len=256, ac="full")  # fmt: skip
    kw = dict(schedules=("1F1B", "ZBVZeroBubble"), stage_overlap=False, ac_policies=AC_POLICIES)
    free = optimize_pipeline(job, "h100-sxm", 10**15, **kw)
    assert free.tried[0].label == "1F1B M=2 V=1 ac=full"
    grid = {(t.schedule, t.microbatches, t.stages_per_rank) for t in free.tried}
    assert {(*g, t.ac) for g in grid for t in free.tried} >= {(*g, ac) for g in grid for ac in AC_POLICIES}
    assert len(free.tried) == len(grid) * len(AC_POLICIES)
    ran = [t for t in free.tried if t.step_s is not None]
    by_ac = {ac: [t for t in ran if t.ac == ac] for ac in AC_POLICIES}
    assert min(t.peak_memory_bytes for t in by_ac["full"]) < min(t.peak_memory_bytes for t in by_ac["none"])
    assert free.kept.ac == "none"  # no budget: recompute only costs time
    budget = min(t.peak_memory_bytes for t in by_ac["none"]) - 1
    tight = optimize_pipeline(job, "h100-sxm", budget, **kw)
    assert tight.kept is not None and tight.kept.ac != "none" and tight.kept.peak_memory_bytes <= budget
    fits = [t for t in tight.tried if t.step_s is not None and t.peak_memory_bytes <= budget]
    assert tight.kept.step_s == min(t.step_s for t in fits)
    assert all(t.verdict.startswith("over budget") for t in tight.tried if t.ac == "none" and t.step_s is not None)


def test_the_command_searches_ac_only_with_optimize(monkeypatch):
    """--optimize-ac passes the AC policies to the search (here over 1F1B alone, to stay fast); without --optimize
    it is a one-line error."""
    from commsched.pipeline import optimize

    real = optimize.optimize_pipeline
    monkeypatch.setattr(optimize, "optimize_pipeline", lambda *a, **kw: real(*a, **kw, schedules=("1F1B",)))
    args = ["pipeline", "llama-tiny", "--parallel", "fsdp+tp", "--world-size", "8", "--tp-size", "2", "--pp-size",
            "2", "--layers", "2", "--seq-len", "64", "--microbatches", "2", "--pp-schedule", "1F1B"]  # fmt: skip
    bad = runner.invoke(app, [*args, "--optimize-ac"])
    assert bad.exit_code == 2 and "--optimize-ac" in bad.output
    out = runner.invoke(app, [*args, "--optimize", "--optimize-ac", "--json", "-"])
    assert out.exit_code == 0, out.output
    data = json.loads(out.output)
    assert {t["ac"] for t in data["tried"]} == {"none", "selective-op", "full"}
    assert data["baseline"]["label"] == "1F1B M=2 V=1 ac=none"


def test_the_optimizer_step_is_traced_once_for_every_batch_and_ac_policy(monkeypatch):
    """tail_seconds is memoised across M and AC (the search's tries) and on disk: the optimizer step of a spec with
    another batch and AC policy, traced afresh, takes exactly the seconds of the shared one, and a fresh process
    reads it back."""
    from commsched.hardware import for_graph
    from commsched.pipeline import per_step

    job = PipelineJob(preset="llama-tiny", parallel="fsdp+tp", world_size=8, tp_size=2, pp_size=2, schedule="1F1B",
                      microbatches=2, batch=4, layers=2, seq_len=256, ac="full").resolve()  # fmt: skip
    hw = for_graph("h100-sxm", world_size=8)
    units = job.rank_units(0)
    shared = per_step.tail_seconds(job.inner, units, hw, False)
    assert shared.total_s > 0 and job.inner.batch == 2 and job.inner.ac == "full"
    per_step._tail_seconds.cache_clear()
    own = per_step._tail_seconds(job.inner, units, hw, False)  # this spec's own trace, not normalised
    assert own == shared
    # a fresh process (memory cleared) reads the shared one from the disk cache, tracing nothing
    per_step._tail_seconds.cache_clear()
    monkeypatch.setattr(per_step, "_traced_tail", lambda *a: pytest.fail("traced again"))
    assert per_step.tail_seconds(job.inner, units, hw, False) == shared

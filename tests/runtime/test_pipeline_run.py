"""Real pipeline runs (``runtime/pipeline_run.py``): the stage modules compute the unpipelined model, a 2-rank gloo
run of torch's schedules matches it number for number and its steps are predicted, bad options exit 2."""

from __future__ import annotations

import json

import pytest
import torch
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from typer.testing import CliRunner

from commsched.cli import app
from commsched.pipeline.split import stages_of
from commsched.runtime.pipeline_calibrate import P2PCalibration, p2p_hardware
from commsched.runtime.pipeline_run import PipelineRunConfig, run_pipeline_local
from commsched.runtime.pipeline_stage import ZooStage, stage_loss
from commsched.workloads import resolve
from commsched.workloads.params import init_full_params
from commsched.workloads.program import StepProgram

runner = CliRunner()


def _spec(layers: int = 2, batch: int = 4, seq_len: int = 8):
    return resolve("llama-tiny", parallel="none", world_size=1, layers=layers, seq_len=seq_len, batch=batch,
                   dtype="float32", attention="sdpa")  # fmt: skip


@settings(max_examples=3, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(layers=st.integers(1, 3), extra=st.integers(0, 3), seed=st.integers(0, 3))
def test_the_stages_chained_compute_the_unpipelined_step(layers, extra, seed):
    """Any torchtitan split of the layers into 2..layers+2 stages: the stage modules one after another give the
    zoo step's loss and every parameter's gradient (one micro-batch holding the whole batch)."""
    spec = _spec(layers)
    num_stages = min(2 + extra, layers + 2)
    full = init_full_params(spec.model, seed=seed)
    program = StepProgram(spec, {}, 0)
    inputs = program.real_inputs(seed=seed, full_params=full)
    named = dict(zip(program.input_names, inputs, strict=False))
    loss_ref, *grads_ref = program.step(*inputs)
    modules = [ZooStage(spec, s, full, spec.batch) for s in stages_of(num_stages, layers)]
    h = named["tokens"]
    for m in modules:
        h = m(h)
    loss = stage_loss(h, named["labels"])
    loss.backward()
    assert abs(loss.item() - loss_ref.item()) <= 1e-6 * abs(loss_ref.item())
    got = {n: w.grad for m in modules for n, w in zip(m.names, m.weights, strict=True)}
    assert sorted(got) == sorted(p.name for p in spec.layout)  # every parameter sits in exactly one stage
    for p, g_ref in zip(spec.layout, grads_ref, strict=True):
        torch.testing.assert_close(got[p.name], g_ref, rtol=1e-5, atol=1e-6)


def test_the_p2p_link_is_timed_as_measured():
    from commsched.cost.collectives import plan_collective

    fit = P2PCalibration.fit(65536, small_s=1e-3, transfer_s=3e-3)
    assert fit.latency_s == 1e-3 and fit.bytes_per_s == pytest.approx((65536 - 4) / 2e-3)
    hw = p2p_hardware("cpu-local", 4, fit)
    for nbytes in (4, 65536, 1 << 20):
        want = fit.latency_s + nbytes / fit.bytes_per_s
        assert plan_collective("sendrecv", nbytes, 2, hw, stride=3).time_s == pytest.approx(want, rel=1e-12)
    flat = P2PCalibration.fit(65536, small_s=2e-3, transfer_s=1.5e-3)  # the larger message was no slower
    assert flat.latency_s == 1.5e-3 and flat.bytes_per_s == float("inf")


@settings(max_examples=40, deadline=None)
@given(
    schedule=st.sampled_from(["GPipe", "1F1B", "Interleaved1F1B"]),
    pp_size=st.integers(2, 4),
    forward_ms=st.lists(st.floats(0.1, 5.0), min_size=8, max_size=8),
    cores=st.floats(0.5, 5.0),
)
def test_ranks_sharing_cores_share_them_as_processor_sharing(schedule, pp_size, forward_ms, cores):
    """The stream model's shared-cores rule in the pipeline engine (free communication): with at least a core per
    rank the step is the simulated one exactly; with fewer it is never shorter, never longer than with every
    compute P / cores times slower, never shorter with fewer cores; on one core the step is all the ranks' work
    done one after another (the core is never idle while a rank can compute)."""
    from commsched.pipeline import StageCosts, simulate_pipeline

    stages = pp_size * (2 if schedule == "Interleaved1F1B" else 1)
    f_s = [round(x, 3) * 1e-3 for x in forward_ms[:stages]]  # whole microseconds: exact ns
    costs = StageCosts(forward_s=f_s, backward_s=[2 * f for f in f_s])
    m = 2 * pp_size

    def step_s(host_cores: float) -> float:
        return simulate_pipeline(schedule, pp_size, m, None, costs, free_comm=True, host_cores=host_cores).step_s

    alone = step_s(float("inf"))
    shared = step_s(cores)
    assert step_s(float(pp_size)) == alone
    assert alone * (1 - 1e-9) <= shared <= alone * max(1.0, pp_size / cores) * (1 + 1e-9)
    assert step_s(cores / 2) >= shared * (1 - 1e-9)
    work_s = m * sum(3 * f for f in f_s)
    assert step_s(1.0) == pytest.approx(work_s, rel=1e-6)


@pytest.mark.parametrize(
    ("options", "message"),
    [
        (dict(pp_size=1), "pp_size=1"),
        (dict(schedules=("NoSuch",)), "NoSuch"),
        (dict(microbatches=3), "microbatches=3"),
        (dict(schedules=("Interleaved1F1B",), stages_per_rank=4), "layers=2"),  # 8 stages, 4 effective layers
    ],
)
def test_bad_options_name_the_option(options, message):
    kwargs = dict(spec=_spec(), pp_size=2, schedules=("1F1B",), microbatches=4) | options
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        PipelineRunConfig(**kwargs)


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--pp-schedule", "Zigzag"], "Zigzag"),
        (["--microbatches", "4", "--batch", "6"], "batch=6"),
        (["--pp-schedule", "GPipe", "--layers", "0"], "layers"),
        (["--world-size", "4"], "--world-size 4"),
        (["--parallel", "fsdp"], "--parallel fsdp"),
    ],
)
def test_bad_cli_options_exit_2_before_any_rank_starts(args, message):
    res = runner.invoke(app, ["run", "llama-tiny", "--pp-size", "2", *args])
    assert res.exit_code == 2, res.output
    assert message in res.output and "Traceback" not in res.output


@pytest.fixture(scope="module")
def two_rank_run():
    """One real 2-rank run of three torch schedules (the only test here that starts processes: 30-60 s). 9 rounds:
    on 2 shared cores one round's ratio of two schedules' steps varies by +-30 %."""
    schedules = ("1F1B", "GPipe", "Interleaved1F1B")
    spec = _spec(layers=2, batch=4, seq_len=64)
    cfg = PipelineRunConfig(spec=spec, pp_size=2, schedules=schedules, microbatches=4, iters=9, warmup=1)
    return run_pipeline_local(cfg, profile=False)


def test_a_real_run_matches_the_unpipelined_model_and_its_prediction(two_rank_run):
    report = two_rank_run
    for name, run in report.schedules.items():
        # the mean of the micro-batch losses is the batch's loss; gradients scaled by 1/M are the batch's gradients
        assert run.loss_error <= 1e-6, name
        assert run.max_grad_error <= 1e-5, name
        assert all(c.forward_s > 0 and c.backward_s > 0 for c in run.stages), name
        assert [c.stage for c in run.stages] == list(range(2 * run.stages_per_rank)), name
        # torch's runtime over empty stages takes time, but far less than over the model's
        assert 0 < run.empty_step_s < run.measured.median_s and run.action_overhead_s >= 0, name
    assert 1.0 <= report.cores <= 2.0
    one, gpipe = report.schedules["1F1B"], report.schedules["GPipe"]
    assert one.predicted_s >= one.predicted_dedicated_s * (1 - 1e-12)
    # 2 cores shared with other jobs: the step is predicted within a factor 2.5, and GPipe's step relative to
    # 1F1B's (the same stages and bubble, a different order) within 30 %
    for run in (one, gpipe):
        assert 0.4 <= run.predicted_s / run.measured.median_s <= 2.5, (run.predicted_s, run.measured)
    predicted, measured = report.ratios()["GPipe"]
    assert abs(predicted / measured - 1.0) <= 0.3, (predicted, measured, one.measured, gpipe.measured)
    assert report.p2p.send_bytes == 64 * 256 * 4 and report.p2p.transfer_s > 0
    json.dumps(report.to_dict(), allow_nan=False)  # what --json prints


def test_the_cores_ranks_share_interpolate_between_the_measured_points(monkeypatch):
    """The shared-cores rule through (1, 1) and the probe's points, flat past the last; the probe's points are
    ranks over their median slowdown, each within [1, ranks] and the CPUs the run may use."""
    from commsched.runtime import pipeline_calibrate
    from commsched.sim.model import cores_points, shared_cores_rule

    points = ((2.0, 2.0), (4.0, 1.6))
    assert [shared_cores_rule(k, points) for k in (1, 2)] == [1.0, 1.0]
    assert shared_cores_rule(3, points) == pytest.approx(3 / 1.8)
    assert shared_cores_rule(4, points) == pytest.approx(2.5)
    assert shared_cores_rule(6, points) == pytest.approx(6 / 1.6)
    assert cores_points(float("inf")) == () and cores_points(1.5) == ((1.5, 1.5),)
    monkeypatch.setattr(pipeline_calibrate, "available_cores", lambda: 2)
    slowdowns = [(1.1, 2.5), (1.3, 2.4), (float("nan"), 2.6), (float("nan"), 2.5)]
    got = pipeline_calibrate.shared_cores(4, 2, slowdowns)
    assert got[0] == (2.0, pytest.approx(2 / 1.2)) and got[1] == (4.0, pytest.approx(4 / 2.5))
    assert pipeline_calibrate.shared_cores(4, 2, [(1.0, 0.5)] * 4) == ((2.0, 2.0), (4.0, 2.0))  # capped
    assert pipeline_calibrate.shared_cores(2, 2, [(float("nan"), 1.0)] * 2) == ((2.0, 2.0),)


def test_the_measured_ratio_pairs_the_steps_of_a_round():
    """Load that comes and goes between rounds slows both schedules of a round: their per-round ratio holds
    where the ratio of their medians would not (CI's stop 48: 1.56 measured for a true 1.0)."""
    from dataclasses import replace

    from commsched.runtime.executor import step_times
    from commsched.runtime.pipeline_calibrate import paired_ratio

    def run(rounds):
        return replace(_A_RUN, measured=step_times(list(rounds)), round_steps_s=tuple(rounds))

    one = run([0.16, 0.16, 0.24, 0.24, 0.16])  # another job ran through rounds 3 and 4 ...
    gpipe = run([0.165, 0.165, 0.25, 0.25, 0.25])  # ... and came back for GPipe's step of round 5
    assert gpipe.measured.median_s / one.measured.median_s == pytest.approx(1.5625)
    # paired by round: 1.03, 1.03, 1.04, 1.04, 1.56 -> median 1.04
    assert paired_ratio(gpipe, one) == pytest.approx(0.25 / 0.24)
    unpaired = replace(gpipe, round_steps_s=())  # a report without rounds: the ratio of medians
    assert paired_ratio(unpaired, one) == pytest.approx(1.5625)


def _schedule_run():
    from commsched.runtime.executor import step_times
    from commsched.runtime.pipeline_calibrate import ScheduleRun

    return ScheduleRun(schedule="1F1B", stages_per_rank=1, measured=step_times([1.0]), predicted_s=1.0,
                       predicted_dedicated_s=1.0, empty_step_s=0.1, action_overhead_s=0.0,
                       predicted_bubble_fraction=0.2, predicted_profile_s=None, stages=(), loss=1.0,
                       reference_loss=1.0, max_grad_error=0.0)  # fmt: skip


_A_RUN = _schedule_run()

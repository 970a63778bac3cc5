"""The real executor on 2 gloo ranks (unshaped loopback): every order computes bit-identical outputs, the original
matches the unsharded model, and the report carries calibration, predictions and measurements."""

from __future__ import annotations

import math

import pytest

from commsched.runtime import RunConfig, run_local
from commsched.workloads import resolve


@pytest.fixture(scope="module")
def report():
    spec = resolve("llama-tiny", parallel="fsdp", world_size=2, seq_len=16, batch=2, dtype="float32", attention="sdpa")
    cfg = RunConfig(spec=spec, iters=2, warmup=1, calibrate_reps=2, op_reps=1, seed=5)
    return run_local(cfg, progress=PROGRESS.append)


PROGRESS: list[str] = []  # rank 0's progress lines as run_local handed them over while the ranks ran


@pytest.mark.slow
def test_progress_reaches_the_parent_while_the_ranks_run(report):
    """Issue 19.10: minutes of a real run with nothing on screen. Rank 0's phases reach the parent as they happen
    (polled twice a second, so fast phases may be passed over), ending with the last step of the timed loop."""
    assert PROGRESS, "no progress line reached the parent"
    assert PROGRESS[-1] == "step 3/3 (1 warm-up) of 3 orders"
    assert len(PROGRESS) == len(set(PROGRESS))  # each line handed over once


@pytest.mark.slow
def test_scheduled_orders_are_bit_identical_to_the_original(report):
    assert set(report.variants) == {"original", "overlap", "torch"}, report.skipped
    for name, v in report.variants.items():
        assert v.bit_identical, f"{name}: outputs differ from the original order's"
    # the orders really differ: the executor ran reordered graphs, not the same one three times (ours may keep the
    # traced order when the probe finds this unshaped loopback too CPU-bound for overlap to pay; torch's still moves)
    assert max(report.variants[k].moved_nodes for k in ("overlap", "torch")) > 0
    assert report.variants["original"].moved_nodes == 0
    # and the original order computes the model: the unsharded reference, loss and gradient shards
    assert report.reference_max_rel_error < 1e-4


@pytest.mark.slow
def test_report_has_calibration_predictions_and_measurements(report):
    link = report.link
    kinds = {row.kind for row in link.collectives}
    assert kinds == {"all_gather", "reduce_scatter"}  # FSDP: what the graph issues, measured on the link
    assert all(row.group_size == 2 and row.seconds > 0 for row in link.collectives)
    assert 1.0 <= link.interference.compute_slowdown <= 4.0
    assert 1.0 <= link.interference.comm_slowdown <= 4.0
    for v in report.variants.values():
        assert len(v.measured.samples_s) == 2
        assert 0 < v.measured.min_s <= v.measured.median_s <= v.measured.max_s
        assert set(v.predicted) == {"measured", "profile", "measured, comm unslowed"}
        assert all(p > 0 and math.isfinite(p) for p in v.predicted.values())
    assert report.variants["original"].speedup_measured == 1.0
    assert report.graph.collectives > 0
    assert report.compute_nice == 10  # the default: gloo's threads are favoured over compute on a CPU run
    assert link.interference.replayed_calls > 0  # the probe's compute is the step's own kernels


@pytest.mark.slow
def test_report_round_trips_through_json(report, tmp_path):
    from commsched.report.run_report import RunReport

    assert RunReport.from_dict(report.to_dict()) == report
    assert RunReport.load(report.save(tmp_path / "report.json")) == report
    data = report.to_dict()
    assert list(data)[:2] == ["format", "version"] and "teardown_error" not in data  # only when a rank failed
    assert isinstance(data["link"]["collectives"][0], list)  # kind, group size, bytes, seconds (as before)


@pytest.mark.slow
def test_each_order_is_judged_against_the_prediction(report):
    """Issue #36 item 8 on real gloo ranks: each order's measured speedup is judged against the predicted one from
    the steps paired in run order; two timed steps are too few to judge by, and the report says so."""
    from commsched.report.run_verdict import MIN_STEPS

    assert report.variants["original"].speedup_check is None
    for name in ("overlap", "torch"):
        v = report.variants[name]
        c = v.speedup_check
        assert c is not None and c.steps == report.iters == 2 < MIN_STEPS
        assert c.verdict == "too few steps"
        assert c.measured_p25 <= c.measured_p75 and c.predicted == v.speedup_predicted
        # the paired ratios lie between the fastest and the slowest pairing of the two orders' steps
        lo = report.variants["original"].measured.min_s / v.measured.max_s
        hi = report.variants["original"].measured.max_s / v.measured.min_s
        assert lo <= c.measured_p25 and c.measured_p75 <= hi
    assert report.warnings[0].startswith("2 timed steps per order are too few to check the predicted speedups")

"""Issue #36 item 8: ``commsched run`` measured an order 0.54x the original while predicting 1.06x, on step times
spread p25-p75 78-232 ms, and said nothing. The verdict rule on constructed step lists, the warnings it gives with
their likely causes, in the JSON and in the terminal."""

from __future__ import annotations

import dataclasses
import io
import json

import pytest
from rich.console import Console

from commsched.report.run_report import OrderResult, RunReport, StepTimes
from commsched.report.run_verdict import MIN_STEPS, WIDE_SPREAD, judge_speedup, relative_spread, run_warnings
from commsched.report.terminal_run import print_run_report
from run_reports import small_run_report


def _times(samples: list[float]) -> StepTimes:
    import numpy as np

    s = sorted(samples)
    q25, q50, q75 = (float(x) for x in np.quantile(s, [0.25, 0.5, 0.75]))
    return StepTimes(median_s=q50, p25_s=q25, p75_s=q75, min_s=s[0], max_s=s[-1], samples_s=tuple(s))


@pytest.mark.parametrize(
    ("base", "order", "predicted", "verdict"),
    [
        # the run: the overlap order about 0.54x the original's speed where 1.06x was predicted
        ([0.100, 0.104, 0.098, 0.102, 0.101, 0.099], [0.190, 0.188, 0.182, 0.186, 0.192, 0.184], 1.06, "contradicts"),
        # and the other way round: predicted slower, measured faster throughout
        ([0.100, 0.104, 0.098, 0.102, 0.101, 0.099], [0.080, 0.082, 0.079, 0.081, 0.080, 0.083], 0.95, "contradicts"),
        ([0.100, 0.104, 0.098, 0.102, 0.101, 0.099], [0.094, 0.099, 0.093, 0.096, 0.096, 0.094], 1.06, "within"),
        # faster as predicted, by less than predicted: off, not contradicted
        ([0.100, 0.104, 0.098, 0.102, 0.101, 0.099], [0.098, 0.101, 0.096, 0.100, 0.099, 0.097], 1.20, "outside"),
        # a measured range across 1x contradicts no direction
        ([0.100, 0.104, 0.098, 0.102, 0.101, 0.099], [0.104, 0.100, 0.099, 0.101, 0.103, 0.097], 1.06, "outside"),
        ([0.100, 0.104, 0.098, 0.102], [0.190, 0.188, 0.182, 0.186], 1.06, "too few steps"),
    ],
)
def test_the_verdict_rule_on_constructed_steps(base, order, predicted, verdict):
    spread = max(relative_spread(_times(base)), relative_spread(_times(order)))
    check = judge_speedup(base, order, predicted, spread)
    assert check.verdict == verdict
    assert check.measured_p25 <= check.measured_p75 and check.steps == min(len(base), len(order))
    assert check.predicted == predicted and check.spread == spread


def test_steps_are_paired_in_run_order():
    """A machine that slows down through the run (each step 10 % slower than the last) moves both orders alike:
    paired, the order is 1.10x the original's speed at every step; compared as sorted samples it would not be."""
    base = [0.1 * 1.1**i for i in range(8)]
    order = [t / 1.1 for t in base]
    check = judge_speedup(base, order, 1.10, relative_spread(_times(base)))
    assert check.verdict == "within"
    assert check.measured_p25 == pytest.approx(1.1) and check.measured_p75 == pytest.approx(1.1)
    assert relative_spread(_times(base)) > WIDE_SPREAD  # though each order's own times spread widely


def _report(base: list[float], order: list[float], predicted: float, **changes) -> RunReport:
    # the backend as a local run names it: gloo with one communication thread per rank
    rep = small_run_report(iters=len(base), **{"backend": "gloo_threads1", **changes})
    original, overlap = rep.variants["original"], rep.variants["overlap"]
    tb, to = _times(base), _times(order)
    spread = max(relative_spread(tb), relative_spread(to))
    original = dataclasses.replace(original, measured=tb, predicted={"measured": 0.106})
    overlap = dataclasses.replace(
        overlap, measured=to, predicted={"measured": 0.106 / predicted}, speedup_measured=tb.median_s / to.median_s,
        speedup_predicted=predicted, speedup_check=judge_speedup(base, order, predicted, spread),
    )  # fmt: skip
    rep = dataclasses.replace(rep, variants={"original": original, "overlap": overlap})
    return dataclasses.replace(rep, warnings=run_warnings(rep))


def test_a_contradiction_on_wide_spreads_warns_with_the_likely_cause_in_json_and_terminal(tmp_path):
    """The issue's run: unshaped gloo, the original's steps spread 78-232 ms, overlap measured about half as fast
    as predicted."""
    base = [0.078, 0.232, 0.080, 0.230, 0.150, 0.076, 0.235, 0.120, 0.090, 0.210]
    order = [2 * t for t in base]
    rep = _report(base, order, 1.06)
    check = rep.variants["overlap"].speedup_check
    assert check.verdict == "contradicts" and check.measured_p75 == pytest.approx(0.5)
    assert len(rep.warnings) == 2
    spread, contra = rep.warnings
    assert spread.startswith("step times spread widely (p25-p75: original 82.5-225.0 ms (")
    assert "likely cause: gloo on an unshaped network" in spread and "a noisy machine" in spread
    assert contra.startswith(
        "overlap: measured 0.50x the original's speed (per-step p25-p75 0.50-0.50x) where "
        "1.06x was predicted: the measurement contradicts the prediction; likely cause: gloo"
    )
    # in the JSON, and back
    data = json.loads(json.dumps(rep.to_dict()))
    assert data["warnings"] == list(rep.warnings)
    assert data["variants"]["overlap"]["speedup_check"]["verdict"] == "contradicts"
    assert "speedup_check" not in data["variants"]["original"]
    assert RunReport.load(rep.save(tmp_path / "r.json")) == rep
    # in the terminal
    console = Console(file=io.StringIO(), width=400)
    print_run_report(rep, console)
    text = console.file.getvalue()
    assert "warning: overlap: measured 0.50x the original's speed" in text
    assert "warning: step times spread widely" in text


def test_a_shaped_run_that_bears_the_prediction_out_has_no_warning():
    base = [0.100, 0.104, 0.098, 0.102, 0.101, 0.099, 0.100, 0.103, 0.097, 0.101]
    order = [t / 1.06 for t in base]
    rep = _report(base, order, 1.06, network="loopback shaped to 2gbit")
    assert rep.variants["overlap"].speedup_check.verdict == "within"
    assert rep.warnings == ()


def test_causes_follow_the_run():
    base = [0.100, 0.104, 0.098, 0.102, 0.101, 0.099]
    order = [0.190, 0.188, 0.182, 0.186, 0.192, 0.184]
    shaped = _report(base, order, 1.06, network="loopback shaped to 2gbit", costs="profile",
                     cost_totals={"profile": small_run_report().cost_totals["measured"]})  # fmt: skip
    (line,) = shaped.warnings
    assert "gloo on an unshaped" not in line and "a noisy machine" not in line
    assert "the costs come from the cpu-local profile, not from this machine" in line
    assert f"only {len(base)} timed steps per order (--iters)" in line
    few = _report(base[: MIN_STEPS - 1], order[: MIN_STEPS - 1], 1.06)
    assert few.variants["overlap"].speedup_check.verdict == "too few steps"
    assert few.warnings[0] == f"{MIN_STEPS - 1} timed steps per order are too few to check the predicted speedups by " \
                              f"(--iters {2 * MIN_STEPS} or more)"  # fmt: skip


def test_an_old_report_without_the_new_keys_still_loads():
    data = small_run_report().to_dict()
    del data["warnings"]
    assert RunReport.from_dict(data).warnings == ()
    assert isinstance(RunReport.from_dict(data).variants["overlap"], OrderResult)

"""A small, complete run report for tests of its JSON form, its loading and its rendering (no run needed)."""

from __future__ import annotations

import dataclasses
from typing import Any

from commsched.report.run_report import (
    CollectiveTiming,
    CostTotals,
    GraphInfo,
    InterferenceProbe,
    LinkCalibration,
    OrderResult,
    PhaseTimes,
    RunReport,
    StepTimes,
)


def small_run_report(**changes: Any) -> RunReport:
    """Two orders (the original and ``overlap``) on two gloo ranks; ``changes`` replace top-level fields."""
    probe = InterferenceProbe(**dict.fromkeys(InterferenceProbe.__dataclass_fields__, 1.0))
    steps = StepTimes(median_s=0.010, p25_s=0.009, p75_s=0.011, min_s=0.008, max_s=0.012, samples_s=(0.008, 0.012))
    original = OrderResult(
        measured=steps, predicted={"measured": 0.011}, predicted_exposed_comm_s=0.002, lower_bound_s=0.005,
        peak_memory_bytes=1 << 20, bit_identical=True, moved_nodes=0, prediction_error=0.1,
        prediction_error_vs_min=0.375, speedup_measured=1.0, speedup_measured_min=1.0, speedup_predicted=1.0,
    )  # fmt: skip
    totals = CostTotals(compute_s=0.004, collectives_s=0.008, compute_slowdown=1.0, comm_slowdown=1.0)
    overlap = dataclasses.replace(original, bit_identical=False, moved_nodes=7, speedup_measured=1.25)
    report = RunReport(
        workload="llama-tiny/fsdp", preset="llama-tiny", parallel="fsdp", world_size=2, seq_len=16, batch=2,
        dtype="float32", backend="gloo", threads=1, gloo_threads=1, compute_nice=10, iters=2, warmup=1,
        graph=GraphInfo(nodes=373, collectives=34, meta="llama-tiny/fsdp"), hardware="cpu-local", costs="measured",
        cost_totals={"measured": totals},
        link=LinkCalibration(collectives=(CollectiveTiming("all_gather", 2, 1024, 0.001),), interference=probe),
        variants={"original": original, "overlap": overlap}, skipped={}, reference_max_rel_error=None,
        timings_s=PhaseTimes(trace=1.0, calibrate=2.0, plan=0.5),
    )  # fmt: skip
    return dataclasses.replace(report, **changes)

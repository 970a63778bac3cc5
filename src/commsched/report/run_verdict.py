"""What a real run's measurements say about its predictions (``commsched run``): each order's measured speedup over
the original judged against the predicted one and the run's own spread, and the warnings the report carries, each
with its likely cause. Data only (no torch, no rich).

The rule: the orders take turns within every timed step, so step ``i`` of the original and of an order ran under
the same machine state, and ``original_i / order_i`` is one measurement of the speedup. Its p25-p75 over the steps
is the measured range. The prediction is *within* it, *outside* it on the same side of 1x, or the measured range
lies wholly on the other side of 1x from the prediction: the measurement *contradicts* it (predicted 1.06x,
measured 0.54x). Independently, step times whose p25-p75 spans more than :data:`WIDE_SPREAD` of their median (78-232
ms) are too noisy for a few-percent prediction to be checked, and fewer than :data:`MIN_STEPS` steps have no
quartiles worth the name.
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from commsched.report.run_report import RunReport, SpeedupCheck, StepTimes

WIDE_SPREAD = 0.25
"""an order's step times are too spread to check a prediction by when (p75 - p25) / median exceeds this"""
MIN_STEPS = 5
"""fewer paired steps than this: no verdict ("too few steps")"""


def relative_spread(times: StepTimes) -> float:
    """(p75 - p25) / median of one order's step times (0 for a zero median)."""
    return (times.p75_s - times.p25_s) / times.median_s if times.median_s > 0 else 0.0


def judge_speedup(
    base_steps_s: Sequence[float], steps_s: Sequence[float], predicted: float, spread: float
) -> SpeedupCheck:
    """The verdict on one order (module docstring). ``base_steps_s`` / ``steps_s``: the original's and the order's
    step times in run order (step ``i`` of each paired); ``predicted``: the predicted speedup (original's
    predicted step over the order's); ``spread``: the wider :func:`relative_spread` of the two orders."""
    n = min(len(base_steps_s), len(steps_s))
    ratios = np.asarray(base_steps_s[:n], dtype=float) / np.asarray(steps_s[:n], dtype=float)
    lo, hi = (float(q) for q in np.quantile(ratios, [0.25, 0.75])) if n else (float("nan"), float("nan"))
    if n < MIN_STEPS:
        verdict = "too few steps"
    elif (predicted > 1.0 and hi < 1.0) or (predicted < 1.0 and lo > 1.0):
        verdict = "contradicts"
    elif lo <= predicted <= hi:
        verdict = "within"
    else:
        verdict = "outside"
    return SpeedupCheck(verdict=verdict, measured_p25=lo, measured_p75=hi, predicted=predicted, spread=spread,
                        steps=n)  # fmt: skip


def likely_causes(rep: RunReport, *, noisy: bool) -> str:
    """Why a run's measurements may not bear its predictions out, most likely first, from what the report says
    of the run (``noisy``: some order's step times spread more than :data:`WIDE_SPREAD`)."""
    causes = []
    if rep.network is None and rep.backend.startswith("gloo"):  # "gloo_threads1": gloo with its own threads
        causes.append(
            "gloo on an unshaped network (the loopback, run locally) is CPU-bound: its transfers take the cores the "
            "compute runs on, so overlap gains little or costs (shape the link: --bandwidth)"
        )
    if rep.costs == "profile":
        causes.append(f"the costs come from the {rep.hardware} profile, not from this machine (--costs measured)")
    if noisy:
        causes.append("a noisy machine (other jobs, frequency scaling): rerun when it is idle, with more --iters")
    if rep.iters < 2 * MIN_STEPS:
        causes.append(f"only {rep.iters} timed steps per order (--iters)")
    return "; ".join(causes) or "the cost model misses something of this program on this machine (see --profile)"


def run_warnings(rep: RunReport) -> tuple[str, ...]:
    """The report's warnings (module docstring), one line each: too few steps, wide spreads, then each order whose
    measured speedup contradicts the prediction, with the likely causes."""
    out: list[str] = []
    wide = {name: v.measured for name, v in rep.variants.items() if relative_spread(v.measured) > WIDE_SPREAD}
    checks = {name: v.speedup_check for name, v in rep.variants.items() if v.speedup_check is not None}
    causes = likely_causes(rep, noisy=bool(wide))
    if any(c.verdict == "too few steps" for c in checks.values()):
        out.append(f"{rep.iters} timed steps per order are too few to check the predicted speedups by "
                   f"(--iters {2 * MIN_STEPS} or more)")  # fmt: skip
    if wide:
        spans = ", ".join(
            f"{name} {t.p25_s * 1e3:.1f}-{t.p75_s * 1e3:.1f} ms ({relative_spread(t):.0%} of its median)"
            for name, t in wide.items()
        )
        out.append(f"step times spread widely (p25-p75: {spans}): a predicted speedup of a few percent cannot be "
                   f"checked against them; likely cause: {causes}")  # fmt: skip
    for name, c in checks.items():
        if c.verdict == "contradicts":
            measured = rep.variants[name].speedup_measured
            out.append(
                f"{name}: measured {measured:.2f}x the original's speed (per-step p25-p75 {c.measured_p25:.2f}-"
                f"{c.measured_p75:.2f}x) where {c.predicted:.2f}x was predicted: the measurement contradicts the "
                f"prediction; likely cause: {causes}"
            )
    return tuple(out)

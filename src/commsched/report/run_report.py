"""The report of a real run (``commsched run``): what ran, the link's calibration, and per order the measured step
times next to the predictions. Data only (no torch, no rich): the executor fills it on rank 0, the launcher saves it,
``report.terminal_run`` prints it, benchmarks read it back.

The JSON keeps the keys the report had as a plain dict (benchmarks/RESULTS.md and other tools read them), plus
``format`` / ``version`` first. Times are seconds, sizes bytes. A variant that ran a rewritten program
(``optimize``) also has ``program`` and ``outputs``; both are optional keys, left out otherwise.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, NamedTuple

from commsched.io import read_input_json
from commsched.report.json_record import OMIT_IF_NONE, JsonRecord

RUN_REPORT_FORMAT = "commsched.run-report"
RUN_REPORT_VERSION = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepTimes(JsonRecord):
    """The spread of one order's measured step times (a step ends when its slowest rank does)."""

    median_s: float
    p25_s: float
    p75_s: float
    min_s: float
    max_s: float
    samples_s: tuple[float, ...]
    """every timed step, sorted"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Prediction(JsonRecord):
    """The simulated step of one order under one cost source."""

    makespan_s: float
    exposed_comm_s: float
    peak_memory_bytes: int
    lower_bound_s: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class ProgramChange(JsonRecord):
    """The program a variant ran in place of the traced one (``optimize``: what ``commsched.optimize`` kept)."""

    kept: str
    """the program variant the search kept (``Optimized.label``)"""
    nodes: int
    collectives: int
    """in the program that ran (the traced step's are in ``RunReport.graph``)"""
    tried: int
    """program variants the search simulated"""
    search_s: float
    """the search's wall time (on rank 0; every rank runs the same one)"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutputCheck(JsonRecord):
    """A rewritten program's outputs against the original order's first output, on every rank and step."""

    expected: str
    """"bit-identical" (no reduction merged: every element sums its ranks' terms as the original does) or "within
    tolerance" (reductions bucketed: the collective may add an element's terms in another order)"""
    rtol: float
    """each element within rtol x (|original| + the tensor's max |original|) (``runtime.numerics.reduction_rtol``:
    4 x ranks x the dtype's eps); 0 when bit-identical is expected"""
    within: bool
    """every output within the tolerance (equal, with rtol 0), on every rank and step"""
    max_abs_diff: float
    max_rel_diff: float
    """the largest |difference| of an output tensor over that tensor's largest |value|"""
    merged_reductions: int
    """reduce_scatter / all_reduce collectives bucketed into others"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpeedupCheck(JsonRecord):
    """An order's measured speedup over the original next to the predicted one, judged against the run's own
    spread (:func:`commsched.report.run_verdict.judge_speedup`, where the rule lives)."""

    verdict: str
    """"within" (the predicted speedup lies in the measured p25-p75), "outside" (it does not, but on the same side
    of 1x), "contradicts" (the measured p25-p75 lies wholly on the other side of 1x), or "too few steps" to tell"""
    measured_p25: float
    measured_p75: float
    """p25 and p75 of the per-step speedups (the original's step i over this order's step i: the orders take turns
    within each step, so a pair shares the machine's state)"""
    predicted: float
    spread: float
    """the wider relative p25-p75 range of the two orders' step times ((p75 - p25) / median)"""
    steps: int
    """paired steps"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class OrderResult(JsonRecord):
    """One order (variant) of the step: measured, predicted, and how far apart."""

    measured: StepTimes
    predicted: dict[str, float]
    """predicted step seconds by cost source ("measured", "profile", "measured, comm unslowed")"""
    predicted_exposed_comm_s: float
    """under the cost source the schedulers saw (``RunReport.costs``), like the three fields below"""
    lower_bound_s: float
    peak_memory_bytes: int
    bit_identical: bool
    """every output of every step equal, bit for bit, to the original order's first output, on every rank"""
    moved_nodes: int
    """nodes not at their traced position (a rewritten program: positions whose node is not the traced one)"""
    prediction_error: float
    """predicted / measured median - 1"""
    prediction_error_vs_min: float
    """predicted / fastest measured step - 1 (what other jobs on a shared machine cost shows in the median)"""
    speedup_measured: float | None = dataclasses.field(default=None, metadata=OMIT_IF_NONE)
    """original's median / this order's (absent when the original order did not run)"""
    speedup_measured_min: float | None = dataclasses.field(default=None, metadata=OMIT_IF_NONE)
    speedup_predicted: float | None = dataclasses.field(default=None, metadata=OMIT_IF_NONE)
    program: ProgramChange | None = dataclasses.field(default=None, metadata=OMIT_IF_NONE)
    """the program that ran, when it is not the traced one (absent: the traced program, reordered or not)"""
    outputs: OutputCheck | None = dataclasses.field(default=None, metadata=OMIT_IF_NONE)
    """how a rewritten program's outputs compared (absent: not rewritten, and ``bit_identical`` is the check)"""
    speedup_check: SpeedupCheck | None = dataclasses.field(default=None, metadata=OMIT_IF_NONE)
    """the measured speedup judged against the predicted one (absent: the original order, or it did not run)"""


class CollectiveTiming(NamedTuple):
    """One distinct collective of the step, timed on the run's link (a JSON list: kind, size, bytes, seconds)."""

    kind: str
    group_size: int
    bytes: int
    """nccl-tests convention"""
    seconds: float
    """per call, back to back; the slowest rank's median round"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class InterferenceProbe(JsonRecord):
    """How compute and communication slowed each other down when overlapped (``runtime.measure``'s probe)."""

    comm_s: float
    """the step's collectives (up to a size cap) issued together and waited"""
    compute_s: float
    """the compute phase alone (the step's own kernels replayed, sized to about half of ``comm_s``)"""
    compute_end_s: float
    """when the compute ended in the run of both"""
    overlapped_s: float
    """both issued together"""
    serial_s: float
    """``comm_s + compute_s``"""
    comm_bytes: float
    collectives: float
    """how many collectives the probe issues"""
    comm_cpu_s: float
    """CPU time a rank spent on one ``comm_s``"""
    compute_slowdown: float
    """compute's slowdown while communicating (>= 1)"""
    comm_slowdown: float
    """communication's slowdown while computing (>= 1)"""
    replayed_calls: float
    """recorded kernel calls the compute phase cycles through (0: matmuls)"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class LinkCalibration(JsonRecord):
    """What the ranks measured on the run's link before planning."""

    collectives: tuple[CollectiveTiming, ...]
    """the step's distinct collectives, then those of the ``optimize`` variant's program that the step lacks"""
    interference: InterferenceProbe


@dataclasses.dataclass(frozen=True, kw_only=True)
class CostTotals(JsonRecord):
    """What a cost source's prediction is made of."""

    compute_s: float
    collectives_s: float
    compute_slowdown: float
    comm_slowdown: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class GraphInfo(JsonRecord):
    """The traced step's graph."""

    nodes: int
    collectives: int
    meta: str | None
    """the workload's name (``graph.meta["workload"]``)"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PhaseTimes(JsonRecord):
    """Seconds each phase of the run took on rank 0 (the JSON key is ``timings_s``)."""

    trace: float
    calibrate: float
    plan: float
    optimize: float | None = dataclasses.field(default=None, metadata=OMIT_IF_NONE)
    """the ``optimize`` variant's search, and the calibration of its new collectives and ops (absent: not run)"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunReport(JsonRecord):
    """Rank 0's report of a real run. ``to_dict()`` / ``from_dict()`` / ``save()`` / ``load()`` (strict)."""

    record_name = "run report"

    format: str = RUN_REPORT_FORMAT
    version: int = RUN_REPORT_VERSION
    workload: str | None
    preset: str
    parallel: str
    world_size: int
    seq_len: int
    batch: int
    dtype: str
    backend: str
    threads: int
    gloo_threads: int
    compute_nice: int
    iters: int
    warmup: int
    graph: GraphInfo
    hardware: str
    """the profile of the ``profile`` cost source"""
    costs: str
    """the cost source the schedulers saw: "measured" or "profile\""""
    cost_totals: dict[str, CostTotals]
    link: LinkCalibration
    variants: dict[str, OrderResult]
    """every order that ran, in run order"""
    skipped: dict[str, str]
    """orders that could not be planned, and why"""
    reference_max_rel_error: float | None
    """the original order's outputs vs the unsharded model (None: not checked)"""
    timings_s: PhaseTimes
    network: str | None = None
    """the shaped network the ranks ran in (None: unshaped, or a torchrun launch)"""
    teardown_error: str | None = dataclasses.field(default=None, metadata=OMIT_IF_NONE)
    """a rank failed after every rank had finished its steps (the results are complete)"""
    warnings: tuple[str, ...] = ()
    """what the measurements say about the predictions, one line each with its likely cause: a measured speedup
    that contradicts the predicted one, step times too spread or too few to judge by
    (:func:`commsched.report.run_verdict.run_warnings`)"""

    def __post_init__(self) -> None:
        if (self.format, self.version) != (RUN_REPORT_FORMAT, RUN_REPORT_VERSION):
            raise ValueError(
                f"run report: format={self.format!r} version={self.version}: expected {RUN_REPORT_FORMAT!r} "
                f"version {RUN_REPORT_VERSION}"
            )

    @classmethod
    def from_dict(cls, data: Any) -> RunReport:
        """The report in ``data``; ValueError naming the first missing or mistyped field (``format`` and
        ``version`` included: a dict without them is not a run report)."""
        for key in ("format", "version"):
            if isinstance(data, dict) and key not in data:
                raise ValueError(
                    f"run report: {key}: missing (expected {RUN_REPORT_FORMAT!r} version {RUN_REPORT_VERSION})"
                )
        return super().from_dict(data)

    def save(self, path: str | Path) -> Path:
        """Write the report as JSON atomically (a temp file, then a rename); returns the path."""
        from commsched.io import atomic_write_text

        path = Path(path)
        atomic_write_text(path, json.dumps(self.to_dict(), indent=1))
        return path

    @classmethod
    def load(cls, path: str | Path) -> RunReport:
        """The report saved at ``path``; ValueError naming the file and the bad field."""
        data = read_input_json(path, "run report")
        try:
            return cls.from_dict(data)
        except (ValueError, TypeError, KeyError, AttributeError) as exc:
            raise ValueError(f"{path}: {exc}") from None

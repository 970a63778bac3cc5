"""The report of ``commsched rewrite``: every decision of the rewrites that ran and the simulated step before and
after. Data only; ``report.terminal_rewrite`` prints it, ``--stats`` writes ``to_dict()`` as JSON (the keys the
command always wrote)."""

from __future__ import annotations

import dataclasses
from typing import Any

from commsched.report.json_record import OMIT_IF_NONE, JsonRecord


@dataclasses.dataclass(frozen=True, kw_only=True)
class LoweringDecisions(JsonRecord):
    """What ``lower_all_reduces`` did: decisions tallied by reason, and one row per all_reduce."""

    counts: dict[str, int]
    rows: list[dict[str, Any]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class BucketingDecisions(JsonRecord):
    """What ``bucket_collectives`` did: ``BucketPlan.summary()`` and one row per bucket (``BucketPlan.rows()``)."""

    summary: dict[str, Any]
    buckets: list[dict[str, Any]]


@dataclasses.dataclass(frozen=True, kw_only=True)
class StepChange(JsonRecord):
    """The simulated step (seconds, each graph under its own schedule) before and after the rewrites."""

    before: float
    after: float


@dataclasses.dataclass(frozen=True, kw_only=True)
class RewriteReport(JsonRecord):
    """One ``commsched rewrite`` run; a rewrite that did not run has no entry."""

    record_name = "rewrite report"

    workload: str
    hardware: str
    lower_all_reduce: LoweringDecisions | None = dataclasses.field(default=None, metadata=OMIT_IF_NONE)
    bucketing: BucketingDecisions | None = dataclasses.field(default=None, metadata=OMIT_IF_NONE)
    step_s: StepChange

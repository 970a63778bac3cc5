"""``commsched rewrite`` in the terminal: the buckets a plan chose, the all_reduce lowering, and the simulated step
before and after the rewrites."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console

from commsched.report.rewrite_report import RewriteReport
from commsched.report.tables import new_table
from commsched.report.units import fmt_bytes, fmt_mapping, fmt_seconds

if TYPE_CHECKING:
    from commsched.rewrites.bucket_plan import BucketPlan
    from commsched.sim.result import SimResult


def print_bucket_plan(plan: BucketPlan, console: Console, max_rows: int) -> None:
    """The first ``max_rows`` buckets (kind, members, size, time merged and one by one, why each closed), then how
    many collectives the merged buckets hold and the size caps."""
    columns = ("#", "kind", "n", "bytes", "time", "one by one", "closed by", "first member")
    table = new_table(f"buckets on {plan.hardware}", columns, left=("kind", "closed by", "first member"))
    for k, b in enumerate(plan.buckets[:max_rows]):
        table.add_row(str(k), b.kind, str(len(b.members)), fmt_bytes(b.nbytes), fmt_seconds(b.time_s),
                      fmt_seconds(b.members_time_s), b.closed_by, b.members[0])  # fmt: skip
    if len(plan.buckets) > max_rows:
        table.add_row("...", f"{len(plan.buckets) - max_rows} more", *[""] * 6)
    console.print(table)
    s = plan.summary()
    console.print(f"  {s['merged_buckets']} buckets merge {s['collectives_merged']} of {s['collectives']} "
                  f"collectives; closed by {fmt_mapping(s['closed_by'])}")  # fmt: skip
    caps = ", ".join(f"{k} {fmt_bytes(v)}" for k, v in s["caps_bytes"].items())
    console.print(f"  caps (90 % of asymptotic bus bandwidth): {caps}")


def print_rewrite_result(
    report: RewriteReport, before: SimResult, after: SimResult, console: Console, *, title: str
) -> None:
    """The lowering's counts, then the step before and after (collectives, step, exposed comm, peak memory)."""
    if report.lower_all_reduce is not None and report.lower_all_reduce.counts:
        console.print(f"all_reduce lowering: {fmt_mapping(report.lower_all_reduce.counts)}")
    table = new_table(title, ("", "collectives", "step", "exposed comm", "peak memory"))
    for label, r in (("before", before), ("after", after)):
        table.add_row(label, str(len(r.graph.collectives)), fmt_seconds(r.makespan_s), fmt_seconds(r.exposed_comm_s),
                      fmt_bytes(r.peak_memory_bytes))  # fmt: skip
    console.print(table)
    console.print(f"  step time {(after.makespan_s / before.makespan_s - 1) * 100:+.1f} %")

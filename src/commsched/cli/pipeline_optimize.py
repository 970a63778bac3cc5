"""``commsched pipeline ... --optimize``: torch's schedules, M and V searched under a memory budget per rank
(:mod:`commsched.pipeline.optimize`), every try in a table with its verdict, then the kept plan's step."""

from __future__ import annotations

from typing import Any

from commsched.cli.common import console
from commsched.cli.options import emit_json

GB = 10**9
"""``--memory-budget`` is in GB, as HBM is sold (an H100's 80 GB is 80e9 bytes)"""


def optimize_command(job: Any, hardware: Any, memory_budget_gb: float | None, json_out: str | None,
                     ac_policies: tuple[str, ...] = ()) -> Any:  # fmt: skip
    """Search (also over ``ac_policies``), then print the tries and the kept step (or emit ``--json``); returns the
    plan."""
    from commsched.pipeline.optimize import optimize_pipeline

    budget = None if memory_budget_gb is None else int(memory_budget_gb * GB)
    plan = optimize_pipeline(job, hardware, budget, ac_policies=ac_policies)
    written = emit_json(plan.as_dict(), json_out) if json_out else None
    if json_out and written is None:
        return plan
    print_plan(plan)
    if written is not None:
        console.print(f"wrote [bold]{written}[/]")
    return plan


def print_plan(plan: Any) -> None:
    """One row per try (the kept one in bold), then the summary line."""
    from commsched.report.tables import new_table
    from commsched.report.units import fmt_bytes, fmt_seconds

    title = f"pipeline optimize: {len(plan.tried)} plans tried (the first is the input)"
    table = new_table(title, ("plan", "step time", "peak memory", "verdict"), left={"plan", "verdict"})
    for t in plan.tried:
        step = "-" if t.step_s is None else fmt_seconds(t.step_s)
        peak = "-" if t.peak_memory_bytes is None else fmt_bytes(t.peak_memory_bytes)
        table.add_row(t.label, step, peak, t.verdict, style="bold" if t.verdict == "kept" else None)
    console.print(table)
    console.print(plan.summary(), highlight=False, soft_wrap=True)

"""A real run's report (``commsched run``) in the terminal: the setup, the link probe, the costs, and one row per
order with its measured step time next to the prediction."""

from __future__ import annotations

from rich.console import Console

from commsched.report.run_report import RunReport
from commsched.report.tables import new_table
from commsched.report.units import fmt_bytes, fmt_seconds


def print_run_report(rep: RunReport, console: Console) -> None:
    """The run report as text and one table (printed by rank 0)."""
    costs = rep.costs
    console.print(
        f"[bold]{rep.workload}[/], seq {rep.seq_len} x batch {rep.batch}, {rep.dtype}; "
        f"{rep.world_size} ranks on {rep.backend}, {rep.threads} thread(s) each; "
        f"{rep.network or 'unshaped network'}"
    )
    probe = rep.link.interference
    console.print(
        f"link probe: the step's {probe.collectives:.0f} collectives {fmt_seconds(probe.comm_s)} (CPU "
        f"{fmt_seconds(probe.comm_cpu_s)} per rank), compute {fmt_seconds(probe.compute_s)}, "
        f"issued together {fmt_seconds(probe.overlapped_s)} (serial {fmt_seconds(probe.serial_s)}): compute "
        f"slowdown while communicating x{probe.compute_slowdown:.2f}, communication's while computing "
        f"x{probe.comm_slowdown:.2f}"
    )
    totals = rep.cost_totals[costs]
    console.print(
        f"costs ({costs}): compute {fmt_seconds(totals.compute_s)}, collectives "
        f"{fmt_seconds(totals.collectives_s)} over {rep.graph.collectives} collectives, "
        f"{rep.graph.nodes} nodes"
    )
    console.print(_orders_table(rep))
    peaks = ", ".join(f"{k} {fmt_bytes(v.peak_memory_bytes)}" for k, v in rep.variants.items())
    console.print(f"simulated peak memory: {peaks}")
    for name, why in rep.skipped.items():
        console.print(f"[yellow]skipped {name}[/]: {why}")
    if rep.teardown_error:
        console.print(f"[yellow]warning[/]: {rep.teardown_error} (the results above are complete)")
    if rep.reference_max_rel_error is not None:
        console.print(f"original order vs the unsharded model: max relative error {rep.reference_max_rel_error:.1e}")


def _orders_table(rep: RunReport):
    nan = float("nan")
    columns = ("order", "median ms", "p25-p75", "predicted", "error", "speedup/pred")
    table = new_table(f"{rep.iters} steps per order (after {rep.warmup} warm-up)", columns, no_wrap=True)
    table.add_column("bits", justify="center")  # bit-identical to the original order's outputs
    for name, v in rep.variants.items():
        m = v.measured
        speedups = f"{_or(v.speedup_measured, nan):.2f}x/{_or(v.speedup_predicted, nan):.2f}x"
        table.add_row(
            name,
            f"{m.median_s * 1e3:.1f}",
            f"{m.p25_s * 1e3:.1f}-{m.p75_s * 1e3:.1f}",
            f"{v.predicted[rep.costs] * 1e3:.1f}",
            f"{v.prediction_error * 100:+.1f}%",
            speedups,
            "[green]yes[/]" if v.bit_identical else "[bold red]NO[/]",
        )
    return table


def _or(value: float | None, default: float) -> float:
    return default if value is None else value

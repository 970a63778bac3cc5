"""A real run's report (``commsched run``) in the terminal: the setup, the link probe, the costs, one row per
order with its measured step time next to the prediction, and what a rewritten program (``optimize``) kept."""

from __future__ import annotations

from rich.console import Console

from commsched.report.run_report import OrderResult, RunReport
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
    for name, v in rep.variants.items():
        if v.program is not None:
            console.print(_program_line(name, v, rep.graph.collectives))
    for name, why in rep.skipped.items():
        console.print(f"[yellow]skipped {name}[/]: {why}")
    for line in rep.warnings:  # measurements that do not bear the predictions out, with the likely cause
        console.print(f"[yellow]warning[/]: {line}")
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
            _bits(v),
        )
    return table


def _bits(v: OrderResult) -> str:
    """yes: bit-identical to the original order's outputs; ~: not, but within the tolerance of bucketed
    reductions; NO: neither."""
    if v.bit_identical:
        return "[green]yes[/]"
    if v.outputs is not None and v.outputs.within and v.outputs.rtol > 0:
        return "[yellow]~[/]"
    return "[bold red]NO[/]"


def _program_line(name: str, v: OrderResult, traced_collectives: int) -> str:
    """What a rewritten program is and how its outputs compared with the original order's."""
    p, out = v.program, v.outputs
    line = (
        f"{name} kept {p.kept}: {traced_collectives} -> {p.collectives} collectives, {p.nodes} nodes "
        f"({p.tried} program variants searched in {fmt_seconds(p.search_s)})"
    )
    if out is None:
        return line
    if out.max_abs_diff == 0 and v.bit_identical:
        verdict = "[green]bit-identical[/]"
    elif out.within and out.rtol > 0:
        verdict = f"[yellow]within rtol {out.rtol:.1e}[/]"
    else:
        verdict = f"[bold red]outside {'rtol ' + format(out.rtol, '.1e') if out.rtol else 'bit-identical'}[/]"
    return (
        f"{line}; outputs {verdict} (expected {out.expected}, {out.merged_reductions} reductions merged; max diff "
        f"{out.max_abs_diff:.1e} abs, {out.max_rel_diff:.1e} rel)"
    )


def _or(value: float | None, default: float) -> float:
    return default if value is None else value

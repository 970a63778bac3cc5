"""``commsched predict`` in the terminal: the predicted step, its rates as the framework logs them, the cluster, the
configuration and what bounds the step."""

from __future__ import annotations

from typing import TYPE_CHECKING

from rich.console import Console
from rich.table import Table

from commsched.report.rates import fmt_mfu, fmt_rate
from commsched.report.tables import title_width
from commsched.report.units import fmt_bytes, fmt_seconds

if TYPE_CHECKING:
    from commsched.experiments.predict import Prediction
    from commsched.experiments.predict_pipeline import PipelinePrediction


def prediction_table(p: Prediction, title: str) -> Table:
    """Step time, tokens per second per GPU, MFU (and HFU), peak memory per GPU, exposed communication."""
    t = Table(title=title, show_header=False, show_edge=False, pad_edge=False, min_width=title_width(title))
    t.add_column("metric", style="bold")
    t.add_column("value", justify="right")
    t.add_column("how", style="dim")
    t.add_row("step time", fmt_seconds(p.step_s), f"lower bound {fmt_seconds(p.sim.lower_bound_s)}")
    t.add_row("tokens/s per GPU", fmt_rate(p.tokens_per_s_per_gpu),
              f"{p.tokens_per_replica} tokens per data-parallel rank / step / (TP {p.tp} x CP {p.cp})")  # fmt: skip
    dtype = p.meta.get("dtype")
    t.add_row(f"MFU ({dtype})", fmt_mfu(p.mfu),
              f"model FLOPs, as torchtitan logs it; every traced FLOP (recompute too): {fmt_mfu(p.hfu)}")  # fmt: skip
    capacity = p.hardware.compute.hbm_capacity_bytes
    of_hbm = f"of {capacity / 1e9:g} GB HBM ({100 * p.peak_memory_bytes / capacity:.0f} %)" if capacity else ""
    t.add_row("peak memory per GPU", fmt_bytes(p.peak_memory_bytes), of_hbm)
    share = f"{100 * p.sim.exposed_comm_s / p.step_s:.1f} % of the step" if p.step_s > 0 else ""
    t.add_row("exposed communication", fmt_seconds(p.sim.exposed_comm_s), share)
    return t


def print_prediction(p: Prediction, console: Console, title: str) -> None:
    """The table, then one line each: the hardware, the configuration, how the step is ordered and costed, the
    notes, what bounds the step, and what the number is (not our optimiser's)."""
    from commsched.report.bound_text import what_bounds_the_step

    console.print(prediction_table(p, title))
    lines = [
        f"hardware: {p.hardware_line()}",
        f"configuration: {p.configuration_line()}",
        f"order: {p.order} ({p.order_note}); kernels: {p.kernels}",
        *(f"note: {n}" for n in p.config.notes),
        f"what bounds the step: {what_bounds_the_step(p.sim, p.hardware)}",
        "this is the step as the framework runs it, to compare with the job's logs; commsched optimize searches a "
        "faster one",
    ]
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)


def print_pipeline_prediction(p: PipelinePrediction, console: Console, title: str) -> None:
    """predict under pipeline parallelism: the same rows (the peak is the worst pipeline rank's), the bubble, each
    rank's busy / bubble / exposed-communication time and peak, then the configuration, notes and what bounds it."""
    t = Table(title=title, show_header=False, show_edge=False, pad_edge=False, min_width=title_width(title))
    for name, style in (("metric", "bold"), ("value", None), ("how", "dim")):
        t.add_column(name, style=style, justify="right" if name == "value" else "left")
    job = p.step.job
    t.add_row("step time", fmt_seconds(p.step_s), f"torch's {job.program.schedule}, simulated rank by rank")
    t.add_row("tokens/s per GPU", fmt_rate(p.tokens_per_s_per_gpu),
              f"{job.batch * job.inner.seq_len} tokens per data-parallel replica / step / (TP {job.inner.plan.tp} x "
              f"PP {job.job.pp_size})")  # fmt: skip
    dtype = str(job.inner.dtype).removeprefix("torch.")
    t.add_row(f"MFU ({dtype})", fmt_mfu(p.mfu), "model FLOPs, as torchtitan logs it")
    t.add_row("peak memory per GPU", fmt_bytes(p.peak_memory_bytes), "the worst pipeline rank")
    t.add_row("bubble", f"{100 * p.bubble_fraction:.1f} %", "idle compute over the step, mean over pipeline ranks")
    console.print(t)
    ranks = Table(show_edge=False, pad_edge=False)
    for col in ("pipeline rank", "busy", "bubble", "exposed comm", "peak memory"):
        ranks.add_column(col, justify="right")
    for r in p.step.result.per_rank:
        ranks.add_row(str(r.rank), fmt_seconds(r.busy_s), fmt_seconds(r.bubble_s), fmt_seconds(r.exposed_comm_s),
                      fmt_bytes(r.peak_memory_bytes))  # fmt: skip
    console.print(ranks)
    bound = p.to_dict()["bound"]
    lines = [f"configuration: {p.configuration_line()}", *(f"note: {n}" for n in (*p.config.notes, *p.notes)),
             f"what bounds the step: {bound['what_bounds_the_step']}; to move it: {bound['what_would_move_it']}",
             "this is the step as torch's pipelining runs it, to compare with the job's logs"]  # fmt: skip
    for line in lines:
        console.print(line, highlight=False, soft_wrap=True)

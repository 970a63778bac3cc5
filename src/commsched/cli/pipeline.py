"""``commsched pipeline``: a zoo model trained with pipeline parallelism, torch's schedule simulated rank by rank
with each stage's traced programs (:mod:`commsched.pipeline.job`)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from commsched.cli.common import HardwareOption, Stages, console, user_errors
from commsched.cli.options import (
    PP_MICROBATCHES,
    PP_SCHEDULE,
    PP_STAGES_PER_RANK,
    check_layers,
    checked_by,
    emit_json,
    json_option,
    out_file,
)

PARALLEL_HELP = ("the plan inside each pipeline rank (PP is the outermost mesh dimension): none, fsdp, tp, tp+sp, "
                 "fsdp+tp, fsdp+tp+sp")  # fmt: skip


def register(app: typer.Typer) -> None:
    @app.command()
    def pipeline(
        preset: str = typer.Argument(..., help="a zoo preset, e.g. llama3-8b"),
        parallel: str = typer.Option(
            "fsdp", "--parallel", "-p", help=PARALLEL_HELP, callback=checked_by("commsched.pipeline.job:parse_parallel")
        ),
        world_size: int = typer.Option(8, "--world-size", "-w", min=1, help="every rank of the job (PP x the rest)"),
        tp_size: int = typer.Option(None, "--tp-size", min=1, help="tensor-parallel degree (tp*, fsdp+tp*)"),
        pp_size: int = typer.Option(2, "--pp-size", min=2, help="pipeline ranks (P)"),
        pp_schedule: str = PP_SCHEDULE,
        microbatches: int = PP_MICROBATCHES,
        stages_per_rank: int = PP_STAGES_PER_RANK,
        layers: int = typer.Option(None, "--layers", "-l", min=1, help="transformer blocks (unset: the preset's)"),
        seq_len: int = typer.Option(None, "--seq-len", min=1, help="sequence length (unset: the preset's)"),
        batch: int = typer.Option(
            None,
            "--batch",
            min=1,
            help="sequences per data-parallel replica per step, split "
            "into the micro-batches (unset: one per micro-batch)",
        ),
        dtype: str = typer.Option("bfloat16", "--dtype", help="compute dtype: bfloat16, float16, float32"),
        hardware: HardwareOption = "h100-sxm",
        json_out: str = json_option("the pipeline step"),
        html_out: Path = out_file("--html", help="write an HTML report: one timeline panel per pipeline rank"),
        trace_out: Path = out_file("--trace", help="write a Perfetto / Chrome trace: one process per pipeline rank"),
    ) -> None:
        """Simulate one training step of PRESET with pipeline parallelism: the layers split over P x V stages as
        torchtitan splits them, each distinct stage's forward and backward (and the zero-bubble schedules' input-
        and weight-gradient halves) traced once on fake tensors and timed with its tensor-parallel collectives,
        FSDP's all_gather and reduce_scatter once per step (as torch's pipelining runs FSDP), the P2P transfers
        timed between the ranks' placements, and torch's own action lists run on every pipeline rank. Prints each
        rank's busy, bubble and exposed-communication time and peak memory, and the step, tokens/s per GPU and MFU.

        Example: commsched pipeline llama-tiny --parallel fsdp+tp --world-size 8 --tp-size 2 --pp-size 2 --pp-schedule Interleaved1F1B --microbatches 4 -H h100-sxm
        """  # noqa: E501
        from commsched.pipeline.actions import SINGLE_STAGE
        from commsched.pipeline.job import PipelineJob, simulate_job

        with user_errors():
            check_layers(preset, layers)
            v = stages_per_rank if stages_per_rank is not None else (1 if pp_schedule in SINGLE_STAGE else 2)
            job = PipelineJob(preset=preset, parallel=parallel, world_size=world_size, pp_size=pp_size,
                              schedule=pp_schedule, microbatches=microbatches or pp_size * v,
                              stages_per_rank=stages_per_rank, tp_size=tp_size, layers=layers, seq_len=seq_len,
                              batch=batch, dtype=dtype)  # fmt: skip
            resolved = job.resolve()  # every option checked before any tracing
            with Stages(("trace and simulate",), enabled=not json_out) as stages:
                shapes = len({s.shape for s in resolved.stages})
                stages.stage("trace and simulate", f"{shapes} distinct stage(s), {resolved.program.num_stages} stages")
                step = simulate_job(resolved, hardware)
        written = [emit_json(step.as_dict(), json_out) if json_out else None, *_write_views(step, html_out, trace_out)]
        if json_out and written[0] is None:
            return
        _print(step)
        for path in filter(None, written):
            console.print(f"wrote [bold]{path}[/]")


def _write_views(step: Any, html_out: Path | None, trace_out: Path | None) -> list[Path]:
    """``--html`` and ``--trace``: the step's report and trace, written atomically."""
    written = []
    if html_out is not None:
        from commsched.report.pipeline_html import write_pipeline_html

        written.append(write_pipeline_html(step.result, html_out, step=step))
    if trace_out is not None:
        from commsched.report.pipeline_trace import write_pipeline_trace

        written.append(write_pipeline_trace(step.result, trace_out, summary=step.as_dict()))
    return written


def _print(step: Any) -> None:
    """The per-rank table and the step's numbers."""
    from rich.table import Table

    from commsched.report.pipeline_view import RANK_COLUMNS, rank_rows
    from commsched.report.rates import fmt_mfu, fmt_rate
    from commsched.report.units import fmt_bytes

    job, res = step.job, step.result
    p = job.program
    mesh = " x ".join(f"{name} {size}" for name, size in step.as_dict()["mesh"].items())
    title = (f"pipeline: {job.job.preset} / {job.job.parallel} ({mesh}) / {p.schedule} M={p.microbatches} "
             f"V={p.stages_per_rank} / {job.inner.model.n_layers} layers / batch {job.batch} x seq "
             f"{job.inner.seq_len} on {step.hardware.name}")  # fmt: skip
    console.print(title, soft_wrap=True)
    table = Table()
    for col in RANK_COLUMNS:
        table.add_column(col, justify="left" if col in ("stages", "layers") else "right")
    for row in rank_rows(res, job.stages):
        table.add_row(*row)
    console.print(table)
    console.print(f"step [bold]{step.step_s * 1e3:.2f} ms[/]  bubble {100 * res.bubble_fraction:.1f} %  "
                  f"tokens/s per GPU {fmt_rate(step.tokens_per_s_per_gpu)}  MFU {fmt_mfu(step.mfu)}  "
                  f"peak memory (worst rank) {fmt_bytes(res.peak_memory_bytes)}")  # fmt: skip

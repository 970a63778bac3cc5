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
    ZooStep,
    check_layers,
    emit_json,
    given_options,
    json_option,
    out_file,
    zoo_step_options,
)
from commsched.cli.predict import ASYNC_TP_HELP, COMPILE_HELP, OPTIMIZER_HELP

OPTIMIZE_HELP = ("search torch's schedules, M and V under the memory budget and keep the fastest; also our overlap "
                 "pass inside each stage and in DualPipeV's F&B pairs (commsched.pipeline.optimize)")  # fmt: skip

OPTIMIZE_AC_HELP = ("with --optimize: also try each schedule, M and V under activation checkpointing none, "
                    "selective-op and full (the simulator weighs recompute against memory freed)")  # fmt: skip


def register(app: typer.Typer) -> None:
    @app.command()
    @zoo_step_options(optimizer="adamw-fused", optimizer_help=OPTIMIZER_HELP, max_norm="1.0")
    def pipeline(
        ctx: typer.Context,
        preset: str = typer.Argument(..., help="a zoo preset, e.g. llama3-8b"),
        zoo: ZooStep = None,  # type: ignore[assignment]  (predict's zoo-step options: zoo_step_options)
        pp_size: int = typer.Option(2, "--pp-size", min=2, help="pipeline ranks (P)"),
        pp_schedule: str = PP_SCHEDULE,
        microbatches: int = PP_MICROBATCHES,
        stages_per_rank: int = PP_STAGES_PER_RANK,
        compile_: bool = typer.Option(False, "--compile/--no-compile", help=COMPILE_HELP),
        async_tp: bool = typer.Option(False, "--async-tp/--no-async-tp", help=ASYNC_TP_HELP),
        hardware: HardwareOption = "h100-sxm",
        json_out: str = json_option("the pipeline step"),
        html_out: Path = out_file("--html", help="write an HTML report: one timeline panel per pipeline rank"),
        trace_out: Path = out_file("--trace", help="write a Perfetto / Chrome trace: one process per pipeline rank"),
        optimize: bool = typer.Option(False, "--optimize", help=OPTIMIZE_HELP),
        memory_budget: float = typer.Option(
            None, "--memory-budget", min=0.001, help="GB per rank for --optimize (unset: the profile's HBM)"
        ),
        optimize_ac: bool = typer.Option(False, "--optimize-ac", help=OPTIMIZE_AC_HELP),
    ) -> None:
        """Simulate one training step of PRESET with pipeline parallelism: the layers split over P x V stages as
        torchtitan splits them, each distinct stage's forward and backward (and the zero-bubble schedules' input-
        and weight-gradient halves) traced once on fake tensors and timed with its tensor-parallel, context-parallel
        and expert-parallel collectives, FSDP's all_gather and reduce_scatter (HSDP's and DDP's all_reduce) once per
        step (as torch's pipelining runs them), the P2P transfers timed between the ranks' placements, torch's own
        action lists run on every pipeline rank, then each rank's optimizer step (predict's options: AC, float8,
        --compile, --async-tp, --optimizer, --max-norm; --batch is split into the micro-batches, unset: one
        sequence per micro-batch). Prints each rank's busy, bubble and exposed-communication time and peak memory,
        and the step, tokens/s per GPU and MFU.

        Example: commsched pipeline llama-tiny --parallel fsdp+tp --world-size 8 --tp-size 2 --pp-size 2 --pp-schedule Interleaved1F1B --microbatches 4 -H h100-sxm
        """  # noqa: E501
        from commsched.pipeline.actions import SINGLE_STAGE
        from commsched.pipeline.job import simulate_job

        with user_errors():
            check_layers(preset, zoo.layers)
            v = stages_per_rank if stages_per_rank is not None else (1 if pp_schedule in SINGLE_STAGE else 2)
            job = _job(preset, zoo, given_options(ctx, ("fsdp_bucket", "kv_len")), pp_size=pp_size,
                       schedule=pp_schedule, microbatches=microbatches or pp_size * v, stages_per_rank=stages_per_rank,
                       compile=compile_, async_tp=async_tp)  # fmt: skip
            resolved = job.resolve()  # every option checked before any tracing
            if optimize_ac and not optimize:
                raise ValueError("--optimize-ac: only with --optimize (it widens the search)")
            if optimize:
                from commsched.cli.pipeline_optimize import optimize_command
                from commsched.pipeline.optimize import AC_POLICIES

                optimize_command(job, hardware, memory_budget, json_out, AC_POLICIES if optimize_ac else ())
                return
            with Stages(("trace and simulate",), enabled=not json_out) as stages:
                shapes = len({(s.shape, resolved.policies(s)) for s in resolved.stages})
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


def _job(preset: str, zoo: ZooStep, given: set[str], **pipeline: Any) -> Any:
    """The :class:`~commsched.pipeline.job.PipelineJob` of predict's options and the pipeline's own; a ValueError
    naming an option a pipelined training step cannot take."""
    from commsched.pipeline.job import PipelineJob

    if zoo.mode != "train":
        raise ValueError(f"--mode {zoo.mode}: a pipeline step is a training step (torch.distributed.pipelining "
                         "trains); simulate or compare take inference steps")  # fmt: skip
    if "kv_len" in given:
        raise ValueError(f"--kv-len {zoo.kv_len}: a KV cache is for inference; a pipeline step trains")
    if "fsdp_bucket" in given and zoo.fsdp_bucket != "block":
        raise ValueError(f"--fsdp-bucket {zoo.fsdp_bucket}: the pipeline times FSDP2's program, one collective per "
                         "block (--fsdp-bucket block)")  # fmt: skip
    return PipelineJob(preset=preset, parallel=zoo.parallel, world_size=int(zoo.world_size), tp_size=zoo.tp_size,
                       ep_size=zoo.ep_size, layers=zoo.layers, seq_len=zoo.seq_len, batch=zoo.batch, dtype=zoo.dtype,
                       ac=zoo.ac, float8=zoo.float8, cp_size=zoo.cp_size, cp_rotate=zoo.cp_rotate,
                       dp_replicate=zoo.dp_replicate, optimizer=zoo.optimizer, max_norm=zoo.max_norm,
                       **pipeline)  # fmt: skip


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
             f"{job.inner.seq_len}{_options_phrase(job.job.options())} on {step.hardware.name}")  # fmt: skip
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


def _options_phrase(options: dict[str, Any]) -> str:
    """The options set away from PipelineJob's defaults, and the optimizer: `` / ac full / compile / optimizer
    adamw-fused / max_norm 1``."""
    import dataclasses

    from commsched.pipeline.job import PipelineJob

    defaults = {f.name: f.default for f in dataclasses.fields(PipelineJob)}
    parts = [
        name if value is True else f"{name} {value:g}" if isinstance(value, float) else f"{name} {value}"
        for name, value in options.items()
        if name in ("optimizer", "max_norm") or (value, type(value)) != (defaults[name], type(defaults[name]))
    ]
    return "".join(f" / {part}" for part in parts)

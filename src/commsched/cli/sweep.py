"""``commsched sweep``: one preset over parallelisms x world sizes x hardware profiles, as a table and a plot."""

from __future__ import annotations

import contextlib
import time
from pathlib import Path
from typing import Any

import typer

from commsched.cli.common import (
    GpusPerNodeOption,
    console,
    ctrl_c_deadline,
    err_console,
    error_line,
    exit_interrupted,
    user_errors,
)
from commsched.cli.options import (
    PP_SCHEDULE_HELP,
    ZooStep,
    check_layers,
    emit_json,
    json_option,
    layers_phrase,
    out_file,
    preset_layers,
    zoo_step_options,
)


def parse_list(text: str, what: str, *, as_int: bool = False) -> list:
    """A comma-separated option value as a list (ints when ``as_int``)."""
    items = [s.strip() for s in text.split(",") if s.strip()]
    if not items:
        raise ValueError(f"{what}: expected a comma-separated list, got {text!r}")
    if not as_int:
        return items
    out = []
    for s in items:
        try:
            out.append(int(s))
        except ValueError:
            raise ValueError(f"{what}: {s!r} is not an integer (expected e.g. 8,64,512)") from None
    return out


PP_HELP = {
    "pp_size": "pipeline ranks P (comma-separated): sweep torch's pipeline schedules (PP outermost), each row the "
    "step `commsched pipeline` simulates",
    "pp_schedule": "with --pp-size, comma-separated (default 1F1B): " + PP_SCHEDULE_HELP,
    "microbatches": "with --pp-size: micro-batch counts M, comma-separated (unset: P x V)",
    "stages_per_rank": "with --pp-size: stages per rank V, comma-separated (unset: 1 for GPipe / 1F1B, else 2)",
}


def register(app: typer.Typer) -> None:
    @app.command()
    @zoo_step_options(lists=True)
    def sweep(
        preset: str = typer.Argument(..., help="model preset (see commsched trace --list), e.g. llama3-8b"),
        zoo: ZooStep = None,  # type: ignore[assignment]  (the zoo-step options: zoo_step_options)
        hardware: str = typer.Option("h100-sxm", "--hardware", "-H", help="comma-separated hardware profiles"),
        schedule: str = typer.Option("default", "--schedule", "-s", help="pass preset or comma-separated passes"),
        optimize: str = typer.Option("off", "--optimize", help="off, on, or off,on: also run commsched optimize"),
        gpus_per_node: GpusPerNodeOption = None,
        jobs: int = typer.Option(None, "--jobs", "-j", min=1, help="processes tracing at once (default: one per CPU)"),
        ray_address: str = typer.Option(
            None, "--ray-address", help="run on Ray: 'local' (a private instance) or a head's HOST:PORT"
        ),
        no_cache: bool = typer.Option(False, "--no-cache", help="trace everything (neither read nor fill the cache)"),
        out: Path = out_file("--out", "-o", help="write a PNG plot of step time and peak memory"),
        json_path: str = json_option("the rows", stdout_replaces="the table"),
        pp_size: str = typer.Option(None, "--pp-size", help=PP_HELP["pp_size"]),
        pp_schedule: str = typer.Option(None, "--pp-schedule", help=PP_HELP["pp_schedule"]),
        microbatches: str = typer.Option(None, "--microbatches", "-M", help=PP_HELP["microbatches"]),
        stages_per_rank: str = typer.Option(None, "--stages-per-rank", "-V", help=PP_HELP["stages_per_rank"]),
    ) -> None:
        """Trace PRESET at every (parallelism, world size), simulate it on every hardware profile in the traced
        order and in the order SCHEDULE chooses, and print step time, exposed communication, overlap and peak
        memory per configuration. --jobs N traces N configurations at once (this process and N - 1 workers, forked
        once this process has imported torch); --ray-address runs them on Ray actors instead (pip install
        'commsched[ray]'). Traces are cached (see README "Scaling out"); Ctrl-C keeps the finished rows and the same
        command resumes; the same sweep run again takes its stored rows (--no-cache computes them). A
        configuration that fails is reported as an error row. Exits 2 when none succeeds.

        With --pp-size, the rows are pipeline schedules instead: one per (parallel, world size, P, schedule, M, V,
        hardware), each the step `commsched pipeline` simulates, with its tokens/s per GPU and bubble; a
        combination torch refuses is an error row.

        Example: commsched sweep llama3-8b --parallel fsdp --world-size 8,64,512 --hardware h100-sxm,b200
        --layers 4 --out sweep.png --json rows.json --jobs 2

        Example: commsched sweep llama3-8b -p fsdp+tp -w 64 --tp-size 8 --pp-size 4 --pp-schedule
        1F1B,Interleaved1F1B,ZBVZeroBubble --microbatches 8,16,32 -H h100-sxm
        """
        from commsched.execute import ExecutorError
        from commsched.experiments.sweep import default_processes, run_sweep, sweep_to_dict
        from commsched.report.terminal_experiments import print_sweep

        layers, mode = zoo.layers, zoo.mode
        with user_errors():
            parallels = parse_list(zoo.parallel, "--parallel")
            worlds = parse_list(zoo.world_size, "--world-size", as_int=True)
            profiles = parse_list(hardware, "--hardware")
            buckets = parse_list(zoo.fsdp_bucket, "--fsdp-bucket")
            optimizing = _on_off(optimize)
            check_layers(preset, layers)
            pipeline = _pipeline(pp_size, pp_schedule, microbatches, stages_per_rank, out, schedule, mode)
            # only what was given: the trace cache's keys and an interrupted sweep's stored rows stay the same
            options = {"seq_len": zoo.seq_len, "batch": zoo.batch, "tp_size": zoo.tp_size, "ep_size": zoo.ep_size,
                       "kv_len": zoo.kv_len, "dtype": None if zoo.dtype == "bfloat16" else zoo.dtype,
                       "ac": None if zoo.ac == "none" else zoo.ac,
                       "float8": None if zoo.float8 == "none" else zoo.float8,
                       "dp_replicate": None if zoo.dp_replicate == 1 else zoo.dp_replicate,
                       "optimizer": None if zoo.optimizer == "none" else zoo.optimizer,
                       "max_norm": zoo.max_norm}  # fmt: skip
            build_kw = {k: v for k, v in options.items() if v is not None}
            t0 = time.perf_counter()
            computed: list = []
            deadline = ctrl_c_deadline() if ray_address is None else contextlib.nullcontext()  # Ray: its own stop
            try:
                with deadline:
                    rows = run_sweep(
                        preset,
                        parallel=parallels,
                        world_sizes=worlds,
                        hardware=profiles,
                        layers=layers,
                        schedule=schedule,
                        optimize=optimizing,
                        fsdp_bucket=buckets,
                        processes=jobs,
                        ray_address=ray_address,
                        cache=not no_cache,
                        gpus_per_node=gpus_per_node,
                        **({"mode": mode} if pipeline is None else {"pipeline": pipeline}),
                        progress=True,
                        console=err_console,
                        on_rows=computed.extend,
                        **build_kw,
                    )
            except ExecutorError as exc:
                raise ValueError(str(exc)) from None
            except KeyboardInterrupt:
                exit_interrupted("interrupted: the finished rows are kept; the same command resumes the sweep")
            wall_s = time.perf_counter() - t0
            ok = [r for r in rows if r.ok]
            if json_path is not None:
                context = {
                    "preset": preset,
                    "layers": layers or preset_layers(preset),  # traced in every row
                    "preset_layers": preset_layers(preset),
                    "schedule": schedule if pipeline is None else None,
                    "mode": mode,
                    "jobs": min(jobs or default_processes(), len(rows) // (len(profiles) * len(optimizing))),
                    "ray_address": ray_address,
                    "wall_s": wall_s,
                }
                written = emit_json(sweep_to_dict(rows, **context), json_path)
            if out is not None and ok:
                from commsched.report.sweep_plot import write_sweep_plot

                write_sweep_plot(rows, out)

        if len(computed) < len(rows):
            err_console.print(f"{len(rows) - len(computed)} of {len(rows)} rows from an earlier run of this sweep "
                              "(kept in the cache folder; --no-cache recomputes)")  # fmt: skip
        _warn_capacity(ok)
        if json_path == "-":  # the JSON is stdout's only content
            if not ok:
                error_line("no configuration succeeded")
                raise typer.Exit(2)
            return
        title = f"{preset} ({layers_phrase(preset, layers)}, {mode}), " + (
            f"schedule {schedule}" if pipeline is None else "pipeline schedules"
        )
        print_sweep(rows, console, title=title, wall_s=wall_s)
        for p in ((written,) if json_path else ()) + ((out,) if out and ok else ()):
            console.print(f"wrote [bold]{p}[/]")
        if not ok:
            error_line("no configuration succeeded")
            raise typer.Exit(2)


def _pipeline(pp_size: str | None, schedules: str | None, microbatches: str | None, stages: str | None,
              out: Path | None, schedule: str, mode: str) -> Any:  # fmt: skip
    """The pipeline dimensions (:class:`commsched.experiments.sweep_pipeline.PipelineSweep`) when --pp-size is
    given, else None; a pipeline option without it, or an option a pipeline sweep does not take, is a one-line
    ValueError naming it."""
    from commsched.experiments.sweep_pipeline import PipelineSweep

    if pp_size is None:
        given = [name for name, v in (("--pp-schedule", schedules), ("--microbatches", microbatches),
                                      ("--stages-per-rank", stages)) if v is not None]  # fmt: skip
        if given:
            raise ValueError(f"{given[0]}: a pipeline option; give --pp-size too")
        return None
    for name, bad in (("--out", out is not None), ("--schedule", schedule != "default"), ("--mode", mode != "train")):
        if bad:
            raise ValueError(f"{name}: not taken with --pp-size (a pipeline sweep simulates torch's schedules of a "
                             "training step; --json has every row)")  # fmt: skip
    return PipelineSweep(
        pp_sizes=tuple(parse_list(pp_size, "--pp-size", as_int=True)),
        schedules=tuple(parse_list(schedules or "1F1B", "--pp-schedule")),
        microbatches=tuple(parse_list(microbatches, "--microbatches", as_int=True)) if microbatches else (None,),
        stages_per_rank=tuple(parse_list(stages, "--stages-per-rank", as_int=True)) if stages else (None,),
    )


def _on_off(text: str) -> list[bool]:
    """``--optimize``: off, on, or both."""
    values = {"off": False, "on": True}
    items = parse_list(text, "--optimize")
    bad = [v for v in items if v not in values]
    if bad:
        raise ValueError(f"--optimize: {bad[0]!r} is not off or on (expected off, on or off,on)")
    return [values[v] for v in items]


def _warn_capacity(rows: list) -> None:
    """A warning per configuration whose scheduled peak exceeds its profile's HBM (issue 19.2)."""
    from commsched import hardware
    from commsched.cli.common import warn
    from commsched.report.capacity import capacity_warning

    lines = []
    for r in rows:
        line = capacity_warning(r.peak_memory_bytes, hardware.get(r.hardware))
        if line:
            lines.append(f"{r.parallel} at world {r.world_size} on {r.hardware}: {line}")
    warn(lines)

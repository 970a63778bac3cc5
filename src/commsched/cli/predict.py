"""``commsched predict``: the step as the user's framework runs it (FSDP2 / DDP eager, or compiled), the number to
compare with a job's logs (:mod:`commsched.experiments.predict`); from the zoo options or a torchtitan job config."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import typer

from commsched.cli.common import (
    GpusPerNodeOption,
    HardwareOption,
    NumNodesOption,
    Stages,
    console,
    user_errors,
    warn,
)
from commsched.cli.options import (
    ZOO_STEP_OPTIONS,
    ZooStep,
    emit_json,
    given_options,
    json_option,
    pipeline_options,
    step_title,
    zoo_step_options,
)

COMPILE_HELP = (
    "torch.compile as torchtitan applies it (each block compiled): a block's kernels fused as Inductor fuses them, "
    "its collectives (TP) in torch.compile's default order (no overlap pass: as traced, as in eager); FSDP2's and "
    "DDP's hooks stay eager around the blocks, so their prefetch and bucket overlap do not change"
)
OPTIMIZER_HELP = (
    "; predict's default: adamw-fused, torchtitan's ([optimizer] name AdamW, implementation fused), since a step is "
    "the whole iteration (forward, backward, optimizer step); none: up to the gradients"
)
ASYNC_TP_HELP = (
    "async TP as torch runs it with symmetric memory (torchtitan's enable_async_tensor_parallel; needs --compile and "
    "TP): the blocks' all_gather -> matmul and matmul -> reduce_scatter as per-peer copy-engine transfers over NVLink "
    "overlapped with partial matmuls; refused on profiles without NVLink symmetric-memory numbers"
)
PP_SIZE_HELP = (
    "pipeline ranks (P, the outermost mesh dimension, as torchtitan's pipeline_parallel_degree); > 1: the step is "
    "torch's schedule simulated rank by rank with each stage traced (as commsched pipeline), plus its bubble"
)
PP_OPTIONS = ("pp_size", "pp_schedule", "microbatches", "stages_per_rank")
"""predict's pipeline options: StepConfig fields of the same names"""
_PP = pipeline_options(", with --pp-size > 1")
TORCHTITAN_HELP = (
    "read the step from a torchtitan job config (.toml): model, parallel degrees, batch, seq_len, AC, compile, "
    "optimizer; "
    "the world size from its degrees, else --world-size or --num-nodes; only --layers (and options that agree) with it"
)


def _from_options(preset: str | None, zoo: ZooStep, compile_: bool, given: set[str], async_tp: bool = False,
                  pp: dict[str, Any] | None = None) -> Any:  # fmt: skip
    """The StepConfig of the zoo options (FSDP: one collective per block, FSDP2's program, whatever the default)."""
    from commsched.cli.options import check_layers
    from commsched.experiments.predict import StepConfig

    if preset is None:
        raise ValueError("give a PRESET (e.g. llama3-8b) or --torchtitan-config FILE.toml")
    if zoo.mode != "train":
        raise ValueError(f"--mode {zoo.mode}: predict models a training step (what the job logs); "
                         "simulate or compare take inference steps")  # fmt: skip
    if "fsdp_bucket" in given and zoo.fsdp_bucket != "block":
        raise ValueError(f"--fsdp-bucket {zoo.fsdp_bucket}: predict traces FSDP2's program, one collective per "
                         "block (--fsdp-bucket block)")  # fmt: skip
    check_layers(preset, zoo.layers)
    own = ("seq_len", "batch", "dtype", "tp_size", "ac", "float8", "dp_replicate", "optimizer", "max_norm")
    extra = {k: v for k, v in zoo.options().items() if k not in (*own, "mode", "fsdp_bucket")}
    gathers_float8 = zoo.float8 == "tensorwise" and "fsdp" in zoo.parallel.split("+")  # as the zoo traces it
    return StepConfig(preset=preset, parallel=zoo.parallel, world_size=int(zoo.world_size), layers=zoo.layers,
                      seq_len=zoo.seq_len, batch=zoo.batch, dtype=zoo.dtype, tp_size=zoo.tp_size, ac=zoo.ac,
                      float8=zoo.float8, float8_all_gather=gathers_float8, compile=compile_, async_tp=async_tp,
                      dp_replicate=zoo.dp_replicate, optimizer=zoo.optimizer, max_norm=zoo.max_norm,
                      extra=tuple(sorted(extra.items())), **_pipeline_options(pp or {}, given))  # fmt: skip


def _pipeline_options(pp: dict[str, Any], given: set[str]) -> dict[str, Any]:
    """The pipeline options as StepConfig fields; a schedule, M or V without --pp-size > 1 is refused."""
    if pp.get("pp_size", 1) == 1:
        stray = sorted(n for n in PP_OPTIONS[1:] if n in given)
        if stray:
            raise ValueError(f"--{stray[0].replace('_', '-')}: needs --pp-size > 1 (pipeline parallelism)")
        return {}
    return pp


def _from_torchtitan(path: Path, preset: str | None, zoo: ZooStep, compile_: bool, given: set[str], world: int | None,
                     async_tp: bool = False, pp: dict[str, Any] | None = None):  # fmt: skip
    """The StepConfig of a torchtitan config, with the command-line options that agree with it (and --layers)."""
    from commsched.cli.options import check_layers
    from commsched.experiments.torchtitan import from_torchtitan_config, merge_options

    step = from_torchtitan_config(path, world_size=world)
    if preset is not None and preset != step.preset:
        raise ValueError(f"{preset} conflicts with {step.source}'s model ({step.preset}): give one or the other")
    values = {**{n: getattr(zoo, n) for n in ZOO_STEP_OPTIONS}, "compile": compile_, "async_tp": async_tp,
              **(pp or {})}  # fmt: skip
    step = merge_options(step, {n: values[n] for n in sorted(given) if n != "world_size"})
    check_layers(step.preset, step.layers)
    return step


def register(app: typer.Typer) -> None:
    @app.command()
    @zoo_step_options(optimizer="adamw-fused", optimizer_help=OPTIMIZER_HELP, max_norm="1.0")
    def predict(
        ctx: typer.Context,
        preset: str = typer.Argument(None, help="a zoo preset, e.g. llama3-8b (or --torchtitan-config)"),
        zoo: ZooStep = None,  # type: ignore[assignment]  (the zoo-step options: zoo_step_options)
        compile_: bool = typer.Option(False, "--compile/--no-compile", help=COMPILE_HELP),
        async_tp: bool = typer.Option(False, "--async-tp/--no-async-tp", help=ASYNC_TP_HELP),
        torchtitan_config: Path = typer.Option(None, "--torchtitan-config", help=TORCHTITAN_HELP),
        pp_size: int = typer.Option(1, "--pp-size", min=1, help=PP_SIZE_HELP),
        pp_schedule: str = _PP[0],
        microbatches: int = _PP[1],
        stages_per_rank: int = _PP[2],
        hardware: HardwareOption = "h100-sxm",
        num_nodes: NumNodesOption = None,
        gpus_per_node: GpusPerNodeOption = None,
        json_out: str = json_option("the prediction"),
    ) -> None:
        """Predict one training step as the user's framework runs it: FSDP2 eager (one all_gather per block,
        the next block prefetched, parameters resharded after the forward; HSDP with --dp-replicate), DDP eager
        (gradient buckets all-reduced as they fill), or with --compile, then the optimizer step (AdamW, fused by
        default, as torchtitan runs it): the step time, tokens/s per GPU (one data-parallel rank's
        tokens / step / (TP x CP)), MFU (torchtitan's model FLOPs) and peak memory per GPU: the numbers to compare
        with the job's logs. With --pp-size > 1 (or a torchtitan config's pipeline_parallel_degree) the step is torch's
        pipeline schedule simulated rank by rank with each stage traced, as commsched pipeline runs it, and its bubble
        is reported too. This is not commsched's optimiser (commsched optimize searches a faster step). With
        --num-nodes and no --world-size, the world is every GPU of those nodes.

        Example: commsched predict llama3-8b --parallel fsdp --world-size 8 --layers 2 -H h100-sxm

        Example: commsched predict --torchtitan-config llama3_8b.toml --world-size 64 -H h100-sxm

        Example: commsched predict llama3-8b -p tp+sp -w 8 --layers 2 --compile --async-tp -H h100-sxm

        Example: commsched predict llama3-8b -p fsdp+tp -w 64 --tp-size 8 --pp-size 4 --pp-schedule Interleaved1F1B -M 8 -H h100-sxm
        """  # noqa: E501
        from commsched.experiments.predict import predict_workload, trace, world_for_nodes
        from commsched.report.terminal_predict import print_prediction

        with user_errors():
            given = given_options(ctx, (*ZOO_STEP_OPTIONS, "compile_", "async_tp", *PP_OPTIONS))
            given = {"compile" if n == "compile_" else n for n in given}
            pp = {"pp_size": pp_size, "pp_schedule": pp_schedule, "microbatches": microbatches,
                  "stages_per_rank": stages_per_rank}  # fmt: skip
            world = int(zoo.world_size) if "world_size" in given else None
            if world is None and num_nodes is not None:
                world = world_for_nodes(hardware, num_nodes, gpus_per_node)
            if world is not None:
                zoo = ZooStep(**{**{n: getattr(zoo, n) for n in ZOO_STEP_OPTIONS}, "world_size": world})
            if torchtitan_config is not None:
                step = _from_torchtitan(torchtitan_config, preset, zoo, compile_, given, world, async_tp, pp)
            else:
                step = _from_options(preset, zoo, compile_, given, async_tp, pp)
            _check(step, torchtitan_config)
            if step.pp_size > 1:
                return _predict_pipeline(step, hardware, num_nodes, gpus_per_node, json_out)
            with Stages(("trace", "import", "simulate"), enabled=not json_out) as stages:
                stages.stage("trace", f"{step.preset} / {step.parallel} at world {step.world_size}")
                w = trace(step, progress=lambda msg: _progress(stages, msg))
                stages.stage("simulate", "costing, ordering as the framework does, simulating")
                p = predict_workload(w, step, hardware, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
        warn(p.warnings)
        written = None
        if json_out:
            written = emit_json(p.to_dict(), json_out)
            if written is None:
                return
        hw = p.hardware
        title = f"predict: {step_title(p.meta)} on {hw.name} x {hw.num_nodes} node(s)"
        print_prediction(p, console, title)
        if written is not None:
            console.print(f"wrote [bold]{written}[/]")


def _check(step: Any, torchtitan_config: Path | None) -> None:
    """Refuse an impossible step before any tracing (one line; a config's step: the file heads the line)."""
    from commsched.experiments.predict_pipeline import pipeline_job

    try:
        if step.pp_size > 1:
            pipeline_job(step)[0].resolve()
        else:
            step.resolve()
    except ValueError as exc:
        raise ValueError(f"{torchtitan_config}: {exc}" if torchtitan_config is not None else exc) from None


def _predict_pipeline(step: Any, hardware: Any, num_nodes: int | None, gpus_per_node: int | None,
                      json_out: str | None) -> None:  # fmt: skip
    """predict with --pp-size > 1 (or a config's pipeline_parallel_degree): the pipeline step and its bubble."""
    from commsched.experiments.predict_pipeline import predict_pipeline
    from commsched.report.terminal_predict import print_pipeline_prediction

    with Stages(("trace and simulate",), enabled=not json_out) as stages:
        what = f"{step.preset} / {step.parallel} under PP {step.pp_size} at world {step.world_size}"
        stages.stage("trace and simulate", f"{what}: each distinct stage traced, torch's {step.pp_schedule} simulated")
        p = predict_pipeline(step, hardware, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
    warn(p.warnings)
    written = emit_json(p.to_dict(), json_out) if json_out else None
    if json_out and written is None:
        return
    hw = p.hardware
    print_pipeline_prediction(p, console, f"predict: {step.preset} under PP on {hw.name} x {hw.num_nodes} node(s)")
    if written is not None:
        console.print(f"wrote [bold]{written}[/]")


def _progress(stages: Stages, message: str) -> None:
    if message.startswith("importing"):
        stages.stage("import", message.removeprefix("importing ").strip())
    else:
        stages.detail(message.removeprefix("tracing: "))

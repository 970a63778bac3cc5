"""Options several commands take alike, each defined once: where output goes (files, folders, ``--json``) and the
options that pick a zoo step (``--parallel`` ... ``--fsdp-bucket``, ``--ac``, ``--float8``, ``--cp-size``,
``--dp-replicate``, ``--optimizer``, ``--max-norm``), with the check that the step's layers exist."""

from __future__ import annotations

import dataclasses
import functools
import inspect
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import typer

from commsched.cli.common import JSON_STDOUT, console


# ---------------------------------------------------------------- output files and folders
def _checked_file(value: Path | None) -> Path | None:
    """A typer callback: an output file option's value, refused (a usage error, exit 2, naming the option and the
    path) when it is anything but a regular file or a path that does not exist yet
    (:func:`commsched.io.check_output_file`)."""
    from commsched.io import check_output_file

    if value is not None and str(value) != "-":
        try:
            check_output_file(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


def _checked_dir(value: Path | None) -> Path | None:
    """A typer callback: an output folder option's value, refused when it exists and is not a folder."""
    from commsched.io import check_output_dir

    if value is not None:
        try:
            check_output_dir(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None
    return value


def out_file(*decls: str, help: str, default: Path | None = None) -> Any:
    """An option naming a file the command writes: checked as it is parsed, before any work."""
    return typer.Option(default, *decls, help=help, callback=_checked_file)


def out_dir(*decls: str, help: str, default: Path | None = None) -> Any:
    """An option naming a folder the command writes files into: checked as it is parsed, before any work."""
    return typer.Option(default, *decls, help=help, callback=_checked_dir)


OUTPUT_CALLBACKS = (_checked_file, _checked_dir)
"""the callbacks of every output option (tests/test_cli_options.py checks each command's output options use one)"""

JSON_HELP = "write the result as JSON to PATH; '-' (or --json last / before another option): print it on stdout"


def json_option(what: str = "the result", *, stdout_replaces: str = "the tables") -> Any:
    """``--json PATH``: every command's one JSON convention. ``-`` (and a bare ``--json``, which the app reads as
    ``--json -``: :func:`bare_json_as_stdout`) prints the JSON on stdout instead of ``stdout_replaces``; a path gets
    it written (atomically), the terminal output kept."""
    help_text = f"write {what} as JSON to PATH; '-' or a bare --json: print it on stdout instead of {stdout_replaces}"
    return typer.Option(None, "--json", metavar="PATH|-", help=help_text, callback=_checked_file)


def emit_json(data: Any, dest: str | None) -> Path | None:
    """``data`` as JSON where ``--json`` says: on stdout for ``-`` (returns None), else written to the file (returns
    its path). ``dest`` None: nothing."""
    if dest is None:
        return None
    if dest == JSON_STDOUT:
        console.print_json(json.dumps(data, allow_nan=False, default=str))
        return None
    from commsched.io import atomic_write_text

    return atomic_write_text(dest, json.dumps(data, indent=1, allow_nan=False, default=str))


# ---------------------------------------------------------------- a zoo step
@dataclasses.dataclass(frozen=True)
class ZooStep:
    """The options that pick a zoo step, as given (None: the preset's or ``resolve``'s default). Every command
    that builds one takes them through :func:`zoo_step_options` (sweep: ``parallel``, ``world_size`` and
    ``fsdp_bucket`` are comma-separated lists)."""

    parallel: str
    world_size: Any
    layers: int | None
    mode: str
    seq_len: int | None
    batch: int | None
    dtype: str
    tp_size: int | None
    ep_size: int | None
    kv_len: int | None
    fsdp_bucket: str
    ac: str = "none"
    float8: str = "none"
    cp_size: int = 1
    cp_rotate: str = "allgather"
    dp_replicate: int = 1
    optimizer: str = "none"
    max_norm: float | None = None

    def options(self) -> dict[str, Any]:
        """``resolve`` / ``build`` keywords beyond preset, parallel, world size and layers (None left out)."""
        # ac / float8 / optimizer "none" and dp_replicate 1 (the defaults) left out, as the options given to resolve
        # were before they existed
        given = {"mode": self.mode, "seq_len": self.seq_len, "batch": self.batch, "dtype": self.dtype,
                 "tp_size": self.tp_size, "ep_size": self.ep_size, "kv_len": self.kv_len,
                 "fsdp_bucket": self.fsdp_bucket,
                 "ac": None if self.ac == "none" else self.ac,
                 "float8": None if self.float8 == "none" else self.float8,
                 "dp_replicate": None if self.dp_replicate == 1 else self.dp_replicate,
                 "optimizer": None if self.optimizer == "none" else self.optimizer,
                 "max_norm": self.max_norm,
                 **({"cp_size": self.cp_size, "cp_rotate": self.cp_rotate} if self.cp_size != 1 else {})}  # fmt: skip
        return {k: v for k, v in given.items() if v is not None}

    def build_kwargs(self) -> dict[str, Any]:
        """Every ``build`` keyword of the step (parallel, world size, layers, then :meth:`options`): what travels
        to a worker that builds it itself."""
        return {"parallel": self.parallel, "world_size": self.world_size, "layers": self.layers, **self.options()}

    def resolve(self, preset: str, **extra: Any) -> Any:
        """``commsched.workloads.resolve`` of ``preset`` with these options, its layers checked first
        (:func:`check_layers`)."""
        from commsched.workloads import resolve

        check_layers(preset, self.layers)
        return resolve(preset, parallel=self.parallel, world_size=self.world_size, layers=self.layers,
                       **{**self.options(), **extra})  # fmt: skip

    def describe(self, preset: str) -> str:
        """One line for a progress message: preset / parallel / mode at world N, how many layers."""
        layers = layers_phrase(preset, self.layers)
        return f"{preset} / {self.parallel} / {self.mode} at world {self.world_size}, {layers}"


def given_options(ctx: typer.Context, names: tuple[str, ...]) -> set[str]:
    """The parameters among ``names`` that the command line set (not their defaults). By the source's name: typer
    may run its own copy of click, whose ``ParameterSource`` is another enum."""
    sources = {n: ctx.get_parameter_source(n) for n in names}
    return {n for n, src in sources.items() if getattr(src, "name", None) in ("COMMANDLINE", "ENVIRONMENT")}


def preset_layers(preset: str) -> int | None:
    """The layer count of a zoo preset (None: not a preset name)."""
    from commsched.workloads import PRESETS

    cfg = PRESETS.get(preset)
    return None if cfg is None else cfg.n_layers


def check_layers(preset: str, layers: int | None) -> None:
    """``--layers`` is at most the preset's layer count: a ValueError naming the maximum (a slice of the model can be
    traced; more blocks than it has cannot)."""
    most = preset_layers(preset)
    if layers is not None and most is not None and layers > most:
        raise ValueError(f"--layers {layers}: {preset} has {most} layers; expected 1 to {most} (unset: all {most})")


def layers_phrase(preset: str, layers: int | None) -> str:
    """``"4 of 32 layers"``, or ``"all 32 layers"`` when unset."""
    most = preset_layers(preset)
    if most is None:
        return f"{layers} layers" if layers is not None else "the preset's layers"
    return f"all {most} layers" if layers is None or layers == most else f"{layers} of {most} layers"


def step_title(meta: dict[str, Any]) -> str:
    """A traced step's title, its layers out of the preset's: ``llama3-8b/fsdp/train/world 64/4 of 32 layers``.
    A graph without zoo metadata: its ``workload`` (or ``graph``)."""
    if "layers" not in meta or "preset" not in meta:
        return str(meta.get("workload", "graph"))
    head = f"{meta['preset']}/{meta['parallel']}/{meta['mode']}/world {meta['world_size']}"
    ac = f"/ac {meta['ac']}" if meta.get("ac", "none") != "none" else ""
    float8 = f"/float8 {meta['float8']}" if meta.get("float8", "none") != "none" else ""
    cp = f"/cp {meta['cp']}" if meta.get("cp", 1) > 1 else ""
    optimizer = f"/optimizer {meta['optimizer']}" if meta.get("optimizer", "none") != "none" else ""
    layers = f"{meta['layers']} of {meta.get('preset_layers', meta['layers'])} layers"
    return f"{head}/{layers}{ac}{float8}{cp}{optimizer}"


def step_layers(meta: dict[str, Any]) -> dict[str, Any]:
    """The traced layers and the preset's, for a command's JSON (empty for a graph without zoo metadata)."""
    if "layers" not in meta:
        return {}
    return {"layers": meta["layers"], "preset_layers": meta.get("preset_layers", meta["layers"])}


_ZOO_HELP = {
    "parallel": "fsdp, ddp, tp, tp+sp, fsdp+tp, ep, ...",
    "world_size": "ranks of the (fake) process group",
    "fsdp_bucket": "param: one collective per parameter; block: one per block",
    "ac": "activation checkpointing of the blocks (train): none, full, selective-op, selective-layer:N "
    "(every N-th block), as torchtitan applies it; or per-layer:P,P,... (each block's P: none, selective-op, full; "
    "P*K: K blocks)",
    "float8": "float8 training of the blocks' linears (train), as torchtitan runs torchao's Float8Linear: none, "
    "tensorwise (under FSDP: float8 all_gather of the weights), rowwise",
    "cp_size": "context-parallel degree (train, prefill): each rank holds seq / cp tokens (head-tail) and attention "
    "runs as torch's context_parallel ring; inside the FSDP / data dimension, as torchtitan's dp_shard x cp",
    "cp_rotate": "how the CP ring moves K/V (with --cp-size > 1): allgather (torchtitan's default) or alltoall",
    "dp_replicate": "HSDP (fsdp, fsdp+tp*): FSDP's shards replicated over this many groups (torchtitan's "
    "data_parallel_replicate_degree), gradients reduce-scattered then all-reduced across them",
    "optimizer": "the AdamW step ending a training step, as torch runs it: none, adamw (foreach=True, torch's "
    "default on CUDA), adamw-fused (fused=True, torchtitan's default)",
    "max_norm": "clip the gradients to this total norm before the update, as torchtitan's training.max_norm "
    "(torch's clip_grad_norm_ on DTensor grads: per-parameter norms, an all_reduce per sharded mesh dimension, "
    "one foreach_mul_); none: no clipping",
}


def checked_by(parser: str) -> Callable[[str], Any]:
    """A typer callback: the option's value in the canonical form ``parser`` (``"module:function"``, imported when
    the option is parsed: the workload modules import torch) gives it, or a usage error (exit 2) with the parser's
    one line naming the accepted values, before any work."""

    def check(value: str) -> Any:
        import importlib

        module, _, name = parser.partition(":")
        try:
            return getattr(importlib.import_module(module), name)(value)
        except ValueError as exc:
            raise typer.BadParameter(str(exc)) from None

    return check


def _zoo_parameters(world_size: int, dtype: str, lists: bool, optimizer: str = "none", optimizer_help: str = "",
                    max_norm: str = "none") -> list[inspect.Parameter]:  # fmt: skip
    """The zoo-step options as typer parameters (their one definition)."""
    many = " (comma-separated: every one is swept)" if lists else ""
    opt = typer.Option
    specs: list[tuple[str, Any, Any]] = [
        ("parallel", str, opt("fsdp", "--parallel", "-p", help=_ZOO_HELP["parallel"] + many)),
        ("world_size", str if lists else int,
         opt("8,64,512" if lists else world_size, "--world-size", "-w", min=None if lists else 1,
             help=_ZOO_HELP["world_size"] + many)),
        ("layers", int | None,
         opt(None, "--layers", "-l", min=1, help="transformer blocks, at most the preset's (unset: all of them)")),
        ("mode", str, opt("train", "--mode", "-m", help="train, prefill or decode")),
        ("seq_len", int | None, opt(None, "--seq-len", min=1, help="sequence length (decode: KV positions attended; "
                                    "unset: the preset's)")),
        ("batch", int | None, opt(None, "--batch", min=1, help="sequences per data-parallel replica")),
        ("dtype", str, opt(dtype, "--dtype", help="compute dtype: bfloat16, float16, float32")),
        ("tp_size", int | None, opt(None, "--tp-size", min=1, help="tensor-parallel degree (tp*, fsdp+tp*)")),
        ("ep_size", int | None, opt(None, "--ep-size", min=1, help="expert-parallel degree (ep, fsdp+ep)")),
        ("kv_len", int | None, opt(None, "--kv-len", min=1, help="KV-cache capacity (prefill / decode)")),
        ("fsdp_bucket", str, opt("param", "--fsdp-bucket", help=_ZOO_HELP["fsdp_bucket"] + many)),
        ("ac", str, opt("none", "--ac", callback=checked_by("commsched.workloads.ac:parse_ac"), help=_ZOO_HELP["ac"])),
        ("float8", str, opt("none", "--float8", callback=checked_by("commsched.workloads.float8:parse_float8"),
                            help=_ZOO_HELP["float8"])),
        ("cp_size", int, opt(1, "--cp-size", min=1, help=_ZOO_HELP["cp_size"])),
        ("cp_rotate", str, opt("allgather", "--cp-rotate",
                               callback=checked_by("commsched.workloads.context_parallel:parse_rotate"),
                               help=_ZOO_HELP["cp_rotate"])),
        ("dp_replicate", int, opt(1, "--dp-replicate", min=1, help=_ZOO_HELP["dp_replicate"])),
        ("optimizer", str, opt(optimizer, "--optimizer",
                               callback=checked_by("commsched.workloads.optimizer:parse_optimizer"),
                               help=_ZOO_HELP["optimizer"] + optimizer_help)),
        ("max_norm", str, opt(max_norm, "--max-norm",
                              callback=checked_by("commsched.workloads.optimizer:parse_max_norm"),
                              help=_ZOO_HELP["max_norm"])),
    ]  # fmt: skip
    return [inspect.Parameter(name, inspect.Parameter.KEYWORD_ONLY, default=info, annotation=kind)
            for name, kind, info in specs]  # fmt: skip


# ---------------------------------------------------------------- pipeline parallelism (pipeline, predict)
PP_SCHEDULE_HELP = ("torch's schedule (torch.distributed.pipelining): GPipe, 1F1B, Interleaved1F1B, LoopedBFS, "
                    "InterleavedZeroBubble, ZBVZeroBubble, DualPipeV")  # fmt: skip


def pipeline_options(when: str = "") -> tuple[Any, Any, Any]:
    """``--pp-schedule``, ``--microbatches`` / ``-M`` and ``--stages-per-rank`` / ``-V`` (their one definition);
    ``when``: added to each help (e.g. ``", with --pp-size > 1"``)."""
    schedule = typer.Option("1F1B", "--pp-schedule", help=PP_SCHEDULE_HELP + when,
                            callback=checked_by("commsched.pipeline.actions:parse_schedule"))  # fmt: skip
    microbatches = typer.Option(None, "--microbatches", "-M", min=1,
                                help=f"micro-batches per step (M{when}; unset: P x V)")  # fmt: skip
    stages = typer.Option(None, "--stages-per-rank", "-V", min=1,
                          help=f"stages per pipeline rank (V{when}; unset: 1 for GPipe / 1F1B, else 2)")  # fmt: skip
    return schedule, microbatches, stages


PP_SCHEDULE, PP_MICROBATCHES, PP_STAGES_PER_RANK = pipeline_options()
"""the options as ``commsched pipeline`` takes them"""

ZOO_STEP_OPTIONS = tuple(p.name for p in _zoo_parameters(8, "bfloat16", False))
"""the parameter names :func:`zoo_step_options` adds, in order"""


def zoo_step_options(
    *,
    world_size: int = 8,
    dtype: str = "bfloat16",
    lists: bool = False,
    optimizer: str = "none",
    optimizer_help: str = "",
    max_norm: str = "none",
) -> Callable[[Callable[..., Any]], Callable[..., Any]]:
    """Give a command the zoo-step options in place of its ``zoo: ZooStep`` parameter: one definition for trace,
    compare, optimize, rewrite, run and sweep (``lists``: comma-separated parallelisms, world sizes and buckets).
    ``world_size`` / ``dtype`` / ``optimizer`` / ``max_norm``: the command's defaults (``optimizer_help``: added to
    its help)."""

    def decorate(fn: Callable[..., Any]) -> Callable[..., Any]:
        sig = inspect.signature(fn, eval_str=True)
        names = list(sig.parameters)
        at = names.index("zoo")
        own = [p.replace(kind=inspect.Parameter.KEYWORD_ONLY) for p in sig.parameters.values()]
        zoo_params = _zoo_parameters(world_size, dtype, lists, optimizer, optimizer_help, max_norm)
        params = own[:at] + zoo_params + own[at + 1 :]

        @functools.wraps(fn)
        def command(**kwargs: Any) -> Any:
            zoo = ZooStep(**{name: kwargs.pop(name) for name in ZOO_STEP_OPTIONS})
            return fn(zoo=zoo, **kwargs)

        command.__signature__ = sig.replace(parameters=params)  # type: ignore[attr-defined]
        command.__annotations__ = {p.name: p.annotation for p in params}
        del command.__wrapped__  # typer reads the signature above, not fn's
        return command

    return decorate


def trace_zoo_step(zoo: ZooStep, preset: str, stages: Any, **extra: Any) -> Any:
    """Resolve and trace ``preset`` with ``zoo``'s options (``extra``: more ``resolve`` keywords), its progress shown
    on ``stages`` (a :class:`commsched.cli.common.Stages` with "trace" and "import" stages): the layer being traced,
    then the import."""
    from commsched.workloads import trace_spec

    spec = zoo.resolve(preset, **extra)
    stages.stage("trace", zoo.describe(preset))
    return trace_spec(spec, progress=lambda message: _trace_progress(stages, message))


def _trace_progress(stages: Any, message: str) -> None:
    """``trace_spec``'s phase messages as stages: "importing ..." begins the import, the rest detail the trace."""
    if message.startswith("importing"):
        stages.stage("import", message.removeprefix("importing ").strip())
    else:
        stages.detail(message.removeprefix("tracing: "))

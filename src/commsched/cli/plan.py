"""``commsched plan``: the best parallel layout of a model on a cluster (:mod:`commsched.plan`), and the winner as a
torchtitan job config."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any

import typer

from commsched.cli.common import GpusPerNodeOption, console, err_console, user_errors
from commsched.cli.options import emit_json, json_option, out_file


def _choices(text: str, what: str) -> tuple[str, ...]:
    items = tuple(s.strip() for s in text.split(",") if s.strip())
    if not items:
        raise ValueError(f"{what}: expected a comma-separated list, got {text!r}")
    return items


def _bools(text: str, what: str) -> tuple[bool, ...]:
    values = {"true": True, "false": False}
    items = _choices(text, what)
    for item in items:
        if item.lower() not in values:
            raise ValueError(f"{what}: {item!r}: expected true or false (comma-separated)")
    return tuple(dict.fromkeys(values[item.lower()] for item in items))


def _train_choices(ac: str | None, float8: str | None, pp_schedules: str | None, reshard: str | None,
                   async_tp: str | None) -> dict[str, Any]:  # fmt: skip
    """The PlanRequest fields of the training choices given (the others keep PlanRequest's defaults)."""
    given = {("ac_policies", "--ac", _choices): ac, ("float8_recipes", "--float8", _choices): float8,
             ("pp_schedules", "--pp-schedules", _choices): pp_schedules,
             ("reshard_after_forward", "--reshard-after-forward", _bools): reshard,
             ("async_tp", "--async-tp", _bools): async_tp}  # fmt: skip
    return {field: parse(text, option) for (field, option, parse), text in given.items() if text is not None}


def _check_mode(req: Any, train_only: dict[str, Any]) -> None:
    """One-line ValueErrors for ``--mode`` and the options it does not take (inference: the training choices,
    ``--explain``'s changes, a TOML)."""
    req.check()
    if not req.inference:
        return
    for option, value in train_only.items():
        if value is not None:
            raise ValueError(f"{option} is for --mode train, not --mode {req.mode} ({_not_inference(option)})")


def _not_inference(option: str) -> str:
    from commsched.plan.toml_out import NO_INFERENCE_TOML

    reasons = {"--toml": NO_INFERENCE_TOML, "--explain": "its one-step changes are training ones"}
    return reasons.get(option, "a training choice: inference layouts have no AC, float8, PP or FSDP")


def register(app: typer.Typer) -> None:
    @app.command()
    def plan(
        preset: str = typer.Argument(..., help="a zoo preset, e.g. llama3-70b"),
        gpus: int = typer.Option(..., "--gpus", "-n", min=1, help="GPUs of the job"),
        hardware: str = typer.Option("h100-sxm", "--hardware", "-H", help="hardware profile"),
        gpus_per_node: GpusPerNodeOption = None,
        hbm: float = typer.Option(None, "--hbm", min=0.001, help="GiB of HBM per GPU (default: the profile's)"),
        seq_len: int = typer.Option(None, "--seq-len", min=1, help="sequence length (default: the preset's)"),
        global_batch: int = typer.Option(None, "--global-batch", min=1, help="sequences per step (default: --gpus)"),
        ac: str = typer.Option(
            None, "--ac", help="AC policies to try (comma-separated; train; default: none,selective-op,full)"
        ),
        float8: str = typer.Option(
            None, "--float8", help="float8 recipes to try (comma-separated; train; default: none,tensorwise)"
        ),
        pp_schedules: str = typer.Option(
            None,
            "--pp-schedules",
            help="torch pipeline schedules to try (train; default: 1F1B,Interleaved1F1B,ZBVZeroBubble)",
        ),
        reshard: str = typer.Option(
            None,
            "--reshard-after-forward",
            help="FSDP reshard_after_forward values to try (FSDP / HSDP; default: true,false)",
        ),
        async_tp: str = typer.Option(
            None,
            "--async-tp",
            help="async TP values to try (TP + SP, compiled, on NVLink profiles; train; default: false,true)",
        ),
        mode: str = typer.Option(
            "train",
            "--mode",
            "-m",
            help="train, prefill or decode (inference: TP, CP, EP and replicas; --global-batch: concurrent sequences)",
        ),
        kv_len: int = typer.Option(
            None, "--kv-len", min=1, help="KV-cache positions per sequence (prefill / decode; default: --seq-len)"
        ),
        max_pp: int = typer.Option(None, "--max-pp", min=1, help="largest pipeline degree tried (1: no PP)"),
        compile_: bool = typer.Option(True, "--compile/--no-compile", help="judge torch.compile'd blocks"),
        layers_scale: int = typer.Option(2, "--layers-scale", min=0, help="trace K and 2K layers, scale (0: all)"),
        top: int = typer.Option(5, "--top", min=1, help="rows to print and write"),
        verify: bool = typer.Option(False, "--verify", help="judge the winner again at every layer"),
        toml: Path = out_file("--toml", help="write the winner as a torchtitan job config (TOML)"),
        python: Path = out_file("--python", help="write the winner as FSDP2 / torch.distributed.pipelining calls"),
        html_out: Path = out_file("--html", help="write the ranked table and the winner's breakdown as HTML"),
        explain: bool = typer.Option(False, "--explain", help="judge --layout and its cheapest one-step changes"),
        layout: str = typer.Option(
            None,
            "--layout",
            help="the layout --explain judges, e.g. 'dp_shard=32,tp=8,sp=true,ac=full' (the keys of --json's layout)",
        ),
        jobs: int = typer.Option(None, "--jobs", "-j", min=1, help="processes judging at once (default: per CPU)"),
        ray_address: str = typer.Option(None, "--ray-address", help="judge on Ray: 'local' or a head's HOST:PORT"),
        no_cache: bool = typer.Option(False, "--no-cache", help="neither read nor fill the trace cache"),
        json_out: str = json_option("the ranked layouts"),
    ) -> None:
        """Find the fastest layout of PRESET on --gpus GPUs: every FSDP / HSDP / DDP, TP (with and without SP),
        PP (torch's schedules, M, V), CP degree with each AC policy and float8 recipe (and FSDP's
        reshard-after-forward, async TP where they apply), pruned by memory and step
        lower bounds, each left judged by the simulator on its traced program (K and 2K layers, scaled) in the
        framework's order and optimised, ranked by tokens/s per GPU. Prints the winner, the runner-up and the best
        layout without overlap optimisation, and what makes the winner win; --toml writes it for torchtitan,
        --python as FSDP2 / pipelining calls. With --explain --layout L: L judged, and each one-step change (HSDP,
        a larger micro-batch, a smaller TP, another AC, float8, reshard-after-forward, async TP) with its simulated
        gain, best first. With --mode prefill or decode: the inference layouts (TP with and without SP, CP in
        prefill, EP, replicas), ranked by prompt or generated tokens/s per GPU, each step its latency; --python
        writes the mesh and TP plan (no TOML).

        Example: commsched plan llama3-8b --gpus 8 -H h100-sxm --seq-len 8192 --max-pp 1 --toml best.toml
        """
        from commsched.plan import PlanRequest
        from commsched.plan import plan as run_plan
        from commsched.plan.layout import INFERENCE_CHOICES
        from commsched.report.plan_text import plan_table, why_lines

        with user_errors():
            if (layout is None) == explain:
                raise ValueError("--explain and --layout: expected both (judge one layout's changes) or neither")
            train_only = {"--ac": ac, "--float8": float8, "--pp-schedules": pp_schedules,
                          "--reshard-after-forward": reshard, "--async-tp": async_tp, "--max-pp": max_pp,
                          "--toml": toml, "--explain": explain or None}  # fmt: skip
            req = PlanRequest(preset=preset, gpus=gpus, hardware=hardware, gpus_per_node=gpus_per_node, hbm_gib=hbm,
                              seq_len=seq_len, global_batch=global_batch, max_pp=max_pp, compile=compile_,
                              layers_scale=layers_scale, mode=mode, kv_len=kv_len,
                              **_train_choices(ac, float8, pp_schedules, reshard, async_tp))  # fmt: skip
            _check_mode(req, train_only)
            if req.inference:
                req = dataclasses.replace(req, **INFERENCE_CHOICES)
            if explain:
                _explain(req, layout, jobs, ray_address, not no_cache, json_out, toml, python)
                return
            result = run_plan(req, jobs=jobs, ray_address=ray_address, cache=not no_cache, verify=verify,
                              progress=None if json_out else (lambda m: err_console.print(m)))  # fmt: skip
        _write_answers(req, result.winner.layout, toml, python)
        if html_out:
            from commsched.io import atomic_write_text
            from commsched.report.plan_text import plan_html

            atomic_write_text(html_out, plan_html(result, top))
        written = emit_json(result.as_dict(top), json_out) if json_out else None
        if json_out and written is None:
            return
        console.print(plan_table(result, top))
        for line in why_lines(result):
            console.print(line, soft_wrap=True, highlight=False)
        for path in (written, toml, python, html_out):
            if path:
                console.print(f"wrote [bold]{path}[/]")


def _write_answers(req: Any, layout: Any, toml: Path | None, python: Path | None) -> None:
    """The layout as a torchtitan TOML (``--toml``) and as FSDP2 / pipelining calls (``--python``; inference: the
    mesh and TP plan)."""
    from commsched.io import atomic_write_text
    from commsched.plan.python_out import fsdp2_python, inference_python
    from commsched.plan.toml_out import torchtitan_toml

    if toml:
        atomic_write_text(toml, torchtitan_toml(req, layout))
    if python:
        atomic_write_text(python, (inference_python if req.inference else fsdp2_python)(req, layout))


def _explain(
    req: Any,
    text: str,
    jobs: int | None,
    ray_address: str | None,
    cache: bool,
    json_out: str | None,
    toml: Path | None,
    python: Path | None,
) -> None:
    """``plan --explain``: the given layout and its one-step changes, judged; --toml / --python write the layout."""
    from commsched.plan.explain import explain, parse_layout
    from commsched.report.plan_text import explain_lines

    given = parse_layout(text)
    explained = explain(req, given, jobs=jobs, ray_address=ray_address, cache=cache)
    _write_answers(req, given, toml, python)
    written = emit_json(explained.as_dict(), json_out) if json_out else None
    if json_out and written is None:
        return
    for line in explain_lines(explained):
        console.print(line, soft_wrap=True, highlight=False)
    for path in (written, toml, python):
        if path:
            console.print(f"wrote [bold]{path}[/]")

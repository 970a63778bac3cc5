"""``commsched optimize``: the whole program (order and collectives) of a graph file or a zoo step."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from commsched.cli import common as opt
from commsched.cli.common import Stages, console, user_errors, warn
from commsched.cli.options import (
    ZooStep,
    emit_json,
    json_option,
    out_file,
    step_layers,
    step_title,
    trace_zoo_step,
    zoo_step_options,
)
from commsched.cli.options import out_dir as out_dir_option


def register(app: typer.Typer) -> None:
    @app.command()
    @zoo_step_options()
    def optimize(
        target: str = typer.Argument(
            ..., help="a zoo preset name (e.g. llama3-8b), or a graph JSON file (reorder only)"
        ),
        zoo: ZooStep = None,  # type: ignore[assignment]  (the zoo-step options, for a preset: zoo_step_options)
        hardware: opt.HardwareOption = "h100-sxm",
        num_nodes: opt.NumNodesOption = None,
        gpus_per_node: opt.GpusPerNodeOption = None,
        memory_budget: str = typer.Option("1.05", "--memory-budget", help="peak limit: 1.05 (x traced peak) or 40GiB"),
        table: Path = typer.Option(
            None, "--table", help="measured times: a table or profiler trace (e.g. from calibrate --trace -o)"
        ),
        out_dir: Path = out_dir_option(
            "--out-dir", "-o", help="a folder: write graph.json, scheduled.json, trace.json, optimize.json there"
        ),
        transforms: bool = typer.Option(
            True,
            "--transforms/--no-transforms",
            help="also try program transforms (decomposed TP collectives, e.g. --parallel tp+sp --mode prefill; "
            "split-batch overlap with --batch 2 or more)",
        ),
        references: bool = typer.Option(
            True,
            "--references/--no-references",
            help="judge the kept step against the framework's order (FSDP2 / DDP eager, torch.compile's default) and "
            "torch's three schedule_overlap_bucketing configurations, with the same costs",
        ),
        html_out: Path = out_file("--html", help="write the HTML report: every step side by side, what bounds it"),
        json_out: str = json_option("the answer (the kept step, its references, what bounds it, every variant)"),
        jobs: int = typer.Option(
            None, "--jobs", "-j", min=1, help="judge bucket plans on N processes (default: this one only)"
        ),
        ray_address: str = typer.Option(None, "--ray-address", help="judge bucket plans on Ray ('local' or HOST:PORT)"),
        seed: list[str] = typer.Option(
            None,
            "--seed",
            help="an order the answer must not be slower than, by scheduler name (framework: FSDP2 / DDP's; torch; "
            "repeatable): judged as a variant, the search also started from it, the budget relative to its peak",
        ),
    ) -> None:
        """Try program variants (the traced program, its schedule, its collectives bucketed at several
        granularities, its TP collectives split into chunks that overlap their matmuls, a zoo step of several
        sequences as two interleaved micro-batches), schedule and simulate each alike, keep the fastest within the
        memory budget; then judge it against what the framework runs today and torch's best configuration. A preset's
        every layer unless --layers says fewer (llama3-8b's 32 take minutes: progress on
        stderr; the examples slice it).

        Example: commsched optimize llama3-8b --parallel fsdp --world-size 64 --layers 2 --seq-len 2048 -o opt_out

        Example: commsched optimize llama3-8b --parallel tp+sp --mode prefill --layers 1 --no-transforms

        Example: commsched optimize llama3-8b --parallel tp+sp --mode prefill --layers 1 --seq-len 2048 --batch 2

        Example: commsched optimize llama3-8b --parallel fsdp --world-size 8 --layers 2 --seq-len 1024 --seed framework

        With --jobs N (N > 1) or --ray-address, the bucket plans' probes and full searches run as tasks on an
        executor (README "Scaling out"): the same kept program, order and verdicts as in one process.
        """
        from commsched.optimize import optimize as run_optimize
        from commsched.report.terminal_optimize import print_optimized

        with user_errors():
            seeds = _seeds(seed)  # an unknown name is refused before anything is traced
            is_file = Path(target).exists()
            if is_file:
                from commsched.frontends.json_io import load_graph

                program, groups, gm = load_graph(target), None, None
                source_meta = program.meta
            stage_names = ("trace", "import", "optimize") if not is_file else ("optimize",)
            with Stages((*stage_names, "references") if references else stage_names) as stages:
                if not is_file:
                    w = trace_zoo_step(zoo, target, stages)
                    program, groups, gm, source_meta = w.graph_module, w.graph.group_sizes(), w.graph_module, w.meta
                stages.stage("optimize", "scheduling and simulating every program variant")
                kw = dict(num_nodes=num_nodes, gpus_per_node=gpus_per_node, memory_budget=memory_budget,
                          group_sizes=groups, table=table, transforms=transforms, seeds=seeds)  # fmt: skip
                o = _run(run_optimize, program, hardware, kw, jobs, ray_address)
                from commsched.hardware import for_graph

                hw = for_graph(hardware, o.before.graph, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
                refs = None
                if references:
                    stages.stage("references", "the framework's order and torch's configurations")
                    refs = _references(o, hw, gm, None if is_file else (target, zoo), stages)
            if out_dir is not None:
                _write(o, out_dir, source_meta, refs, hw)
            from commsched.report.capacity import step_warnings

            warnings = step_warnings(o.before.graph.meta, hw, o.after.peak_memory_bytes)
            warn(warnings)
            name = target if is_file else step_title(o.before.graph.meta)
            title = f"{name}: {len(o.before.graph)} nodes on {hw.name} x {hw.num_nodes} node(s)"
            if html_out is not None:
                from commsched.report.html import render_html, write_optimize_html

                if refs is not None:
                    write_optimize_html(o, refs, html_out, title=f"commsched optimize: {title}", hardware=hw,
                                        warnings=warnings)  # fmt: skip
                else:
                    from commsched.io import atomic_write_text

                    atomic_write_text(html_out, render_html(o.after, hardware=hw, warnings=warnings))
            written = None
            if json_out:
                written = emit_json({**_record(o, refs, hw), "warnings": warnings}, json_out)
                if written is None:
                    return
        print_optimized(o, console, title)
        if refs is not None:
            from commsched.report.bound_text import what_bounds_the_step, what_would_move_it
            from commsched.report.optimize_report import print_references

            console.print(f"what bounds the step: {what_bounds_the_step(o.after, hw)}", highlight=False, soft_wrap=True)
            console.print(f"what would move it: {what_would_move_it(o.after, hw)}", highlight=False, soft_wrap=True)
            print_references(o, refs, console, "the kept step against what runs today")
        for path in (out_dir, html_out, written):
            if path is not None:
                console.print(f"wrote [bold]{path}[/]")


def _seeds(names: list[str] | None) -> dict[str, str] | None:
    """``--seed NAME``s as ``optimize``'s seeds: ``"NAME order"`` -> the scheduler ``NAME``; a name that is no
    scheduler is refused in one line (ValueError, before anything is traced)."""
    if not names:
        return None
    from commsched.passes import resolve_passes

    for name in names:
        try:
            resolve_passes(name)
        except ValueError as exc:
            raise ValueError(f"--seed: {exc}") from None
    return {f"{name} order": name for name in dict.fromkeys(names)}


def _references(o, hw, gm, zoo_step, stages):
    """The kept step's references (experiments/references.py); for a zoo step with FSDP, the framework's program is
    the step traced with one collective per FSDP unit."""
    from commsched.experiments.references import framework_program, reference_steps

    framework_graph = None
    if zoo_step is not None:
        preset, zoo = zoo_step
        fw = framework_program(preset, zoo.build_kwargs())
        framework_graph = None if fw is None else fw.graph
    return reference_steps(o.before.graph, hw, gm=gm, framework_graph=framework_graph,
                           progress=lambda msg: stages.detail(msg))  # fmt: skip


def _record(o, refs, hw) -> dict:
    """optimize.json / --json: every variant, the layers, and (with references) the answer and what bounds it."""
    from commsched.report.bound_text import bound_summary

    record = {**o.to_dict(), **step_layers(o.before.graph.meta), "bound": bound_summary(o.after, hw)}
    if refs is not None:
        from commsched.report.optimize_report import headline_dict

        record.update(headline_dict(o, refs))
    return record


def _run(run_optimize, program, hardware, kw: dict, jobs: int | None, ray_address: str | None):
    """``optimize`` here, or with its candidates judged on an executor (``--jobs`` > 1, ``--ray-address``)."""
    if (jobs or 1) <= 1 and ray_address is None:
        return run_optimize(program, hardware, **kw)
    return opt.run_on_executor(lambda ex: run_optimize(program, hardware, executor=ex, **kw), jobs, ray_address)


def _write(o, out_dir: Path, source_meta: dict, refs, hw) -> None:
    from commsched.frontends.json_io import save_graph
    from commsched.io import atomic_write_text
    from commsched.ir.transform import inherit_meta
    from commsched.report.trace import write_chrome_trace

    out_dir.mkdir(parents=True, exist_ok=True)
    save_graph(inherit_meta(o.graph, source_meta), out_dir / "graph.json")
    o.schedule.save(out_dir / "scheduled.json")
    write_chrome_trace(o.after, out_dir / "trace.json")
    atomic_write_text(out_dir / "optimize.json", json.dumps(_record(o, refs, hw), indent=1))

"""``commsched optimize``: the whole program (order and collectives) of a graph file or a zoo step."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from commsched.cli import common as opt
from commsched.cli.common import Stages, console, user_errors, warn
from commsched.cli.options import ZooStep, step_layers, step_title, trace_zoo_step, zoo_step_options
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
        jobs: int = typer.Option(
            None, "--jobs", "-j", min=1, help="judge bucket plans on N processes (default: this one only)"
        ),
        ray_address: str = typer.Option(None, "--ray-address", help="judge bucket plans on Ray ('local' or HOST:PORT)"),
    ) -> None:
        """Try program variants (the traced program, its schedule, its collectives bucketed at several
        granularities, its TP collectives split into chunks that overlap their matmuls, a zoo step of several
        sequences as two interleaved micro-batches), schedule and simulate each alike, keep the fastest within the
        memory budget. A preset's every layer unless --layers says fewer (llama3-8b's 32 take minutes: progress on
        stderr; the examples slice it).

        Example: commsched optimize llama3-8b --parallel fsdp --world-size 64 --layers 2 --seq-len 2048 -o opt_out

        Example: commsched optimize llama3-8b --parallel tp+sp --mode prefill --layers 1 --no-transforms

        Example: commsched optimize llama3-8b --parallel tp+sp --mode prefill --layers 1 --seq-len 2048 --batch 2

        With --jobs N (N > 1) or --ray-address, the bucket plans' probes and full searches run as tasks on an
        executor (README "Scaling out"): the same kept program, order and verdicts as in one process.
        """
        from commsched.optimize import optimize as run_optimize
        from commsched.report.terminal_optimize import print_optimized

        with user_errors():
            is_file = Path(target).exists()
            if is_file:
                from commsched.frontends.json_io import load_graph

                program, groups = load_graph(target), None
            with Stages(("trace", "import", "optimize") if not is_file else ("optimize",)) as stages:
                if not is_file:
                    w = trace_zoo_step(zoo, target, stages)
                    program, groups = w.graph_module, w.graph.group_sizes()
                stages.stage("optimize", "scheduling and simulating every program variant")
                kw = dict(num_nodes=num_nodes, gpus_per_node=gpus_per_node, memory_budget=memory_budget,
                          group_sizes=groups, table=table, transforms=transforms)  # fmt: skip
                o = _run(run_optimize, program, hardware, kw, jobs, ray_address)
            if out_dir is not None:
                _write(o, out_dir)
            from commsched.hardware import for_graph
            from commsched.report.capacity import step_warnings

            hw = for_graph(hardware, o.before.graph, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
            warn(step_warnings(o.before.graph.meta, hw, o.after.peak_memory_bytes))
        name = target if is_file else step_title(o.before.graph.meta)
        print_optimized(o, console, f"{name}: {len(o.before.graph)} nodes on {hw.name} x {hw.num_nodes} node(s)")
        if out_dir is not None:
            console.print(f"wrote [bold]{out_dir}[/] (graph.json, scheduled.json, trace.json, optimize.json)")


def _run(run_optimize, program, hardware, kw: dict, jobs: int | None, ray_address: str | None):
    """``optimize`` here, or with its candidates judged on an executor (``--jobs`` > 1, ``--ray-address``)."""
    if (jobs or 1) <= 1 and ray_address is None:
        return run_optimize(program, hardware, **kw)
    return opt.run_on_executor(lambda ex: run_optimize(program, hardware, executor=ex, **kw), jobs, ray_address)


def _write(o, out_dir: Path) -> None:
    from commsched.frontends.json_io import save_graph
    from commsched.io import atomic_write_text
    from commsched.report.trace import write_chrome_trace

    out_dir.mkdir(parents=True, exist_ok=True)
    save_graph(o.graph, out_dir / "graph.json")
    o.schedule.save(out_dir / "scheduled.json")
    write_chrome_trace(o.after, out_dir / "trace.json")
    record = {**o.to_dict(), **step_layers(o.before.graph.meta)}
    atomic_write_text(out_dir / "optimize.json", json.dumps(record, indent=1))

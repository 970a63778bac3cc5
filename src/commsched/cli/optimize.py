"""``commsched optimize``: the whole program (order and collectives) of a graph file or a zoo step."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from commsched.cli import common as opt
from commsched.cli.common import console, err_console, user_errors, warn


def register(app: typer.Typer) -> None:
    @app.command()
    def optimize(
        target: str = typer.Argument(
            ..., help="a zoo preset name (e.g. llama3-8b), or a graph JSON file (reorder only)"
        ),
        parallel: opt.ParallelOption = "fsdp",
        world_size: opt.WorldSizeOption = 8,
        layers: opt.LayersOption = 4,
        mode: opt.ModeOption = "train",
        seq_len: int = typer.Option(None, "--seq-len", help="sequence length (default: the preset's)"),
        batch: int = typer.Option(
            None, "--batch", min=1, help="sequences per data-parallel replica (>= 2: split-batch overlap is tried)"
        ),
        hardware: opt.HardwareOption = "h100-sxm",
        num_nodes: opt.NumNodesOption = None,
        memory_budget: str = typer.Option("1.05", "--memory-budget", help="peak limit: 1.05 (x traced peak) or 40GiB"),
        table: Path = typer.Option(
            None, "--table", help="measured times: a table or profiler trace (e.g. from calibrate --trace -o)"
        ),
        out_dir: Path = typer.Option(
            None, "--out-dir", "-o", help="write graph.json, scheduled.json, trace.json, optimize.json"
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
        memory budget.

        Example: commsched optimize llama3-8b --parallel fsdp --world-size 64 --layers 2 --seq-len 2048 -o opt_out

        Example: commsched optimize llama3-8b --parallel tp+sp --mode prefill --layers 1 --no-transforms

        Example: commsched optimize llama3-8b --parallel tp+sp --mode prefill --layers 1 --seq-len 2048 --batch 2

        With --jobs N (N > 1) or --ray-address, the bucket plans' probes and full searches run as tasks on an
        executor (README "Scaling out"): the same kept program, order and verdicts as in one process.
        """
        from commsched.optimize import optimize as run_optimize
        from commsched.report.terminal_optimize import print_optimized

        with user_errors():
            if Path(target).exists():
                from commsched.frontends.json_io import load_graph

                program, groups = load_graph(target), None
                source_meta = program.meta
            else:
                from commsched.workloads import build

                with err_console.status(f"tracing {target} / {parallel} / world {world_size} / {layers} layers"):
                    w = build(target, parallel=parallel, world_size=world_size, layers=layers, mode=mode,
                              seq_len=seq_len, batch=batch)  # fmt: skip
                program, groups = w.graph_module, w.graph.group_sizes()
                source_meta = w.graph.meta
            with err_console.status("optimizing: scheduling and simulating every program variant"):
                kw = dict(num_nodes=num_nodes, memory_budget=memory_budget, group_sizes=groups, table=table,
                          transforms=transforms)  # fmt: skip
                o = _run(run_optimize, program, hardware, kw, jobs, ray_address)
            if out_dir is not None:
                _write(o, out_dir, source_meta)
            from commsched.hardware import for_graph
            from commsched.report.capacity import step_warnings

            hw = for_graph(hardware, o.before.graph, num_nodes=num_nodes)
            warn(step_warnings(o.before.graph.meta, hw, o.after.peak_memory_bytes))
        print_optimized(o, console, f"{target}: {len(o.before.graph)} nodes on {hardware}")
        if out_dir is not None:
            console.print(f"wrote [bold]{out_dir}[/] (graph.json, scheduled.json, trace.json, optimize.json)")


def _run(run_optimize, program, hardware, kw: dict, jobs: int | None, ray_address: str | None):
    """``optimize`` here, or with its candidates judged on an executor (``--jobs`` > 1, ``--ray-address``)."""
    if (jobs or 1) <= 1 and ray_address is None:
        return run_optimize(program, hardware, **kw)
    return opt.run_on_executor(lambda ex: run_optimize(program, hardware, executor=ex, **kw), jobs, ray_address)


def _write(o, out_dir: Path, source_meta: dict) -> None:
    """The kept program's files; its graph keeps the workload meta of the program it came from (``source_meta``:
    dtype, tokens per step, ... that ``simulate`` reports MFU and tokens/s by)."""
    from commsched.frontends.json_io import save_graph
    from commsched.io import atomic_write_text
    from commsched.ir.transform import inherit_meta
    from commsched.report.trace import write_chrome_trace

    out_dir.mkdir(parents=True, exist_ok=True)
    save_graph(inherit_meta(o.graph, source_meta), out_dir / "graph.json")
    o.schedule.save(out_dir / "scheduled.json")
    write_chrome_trace(o.after, out_dir / "trace.json")
    atomic_write_text(out_dir / "optimize.json", json.dumps(o.to_dict(), indent=1))

"""``commsched compare``: every scheduler on one graph (or zoo preset), simulated alike, in one table."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from commsched.cli import common as opt
from commsched.cli.common import console, err_console, user_errors, warn


def register(app: typer.Typer) -> None:
    @app.command()
    def compare(
        target: str = typer.Argument(
            ..., help="a graph JSON file or a zoo preset name (e.g. llama3-8b); several, comma-separated"
        ),
        parallel: opt.ParallelOption = "fsdp",
        world_size: opt.WorldSizeOption = 8,
        layers: opt.LayersOption = 4,
        mode: opt.ModeOption = "train",
        seq_len: int = typer.Option(None, "--seq-len", min=1, help="sequence length (preset; default: the preset's)"),
        batch: int = typer.Option(None, "--batch", min=1, help="sequences per data-parallel replica (preset)"),
        tp_size: int = typer.Option(None, "--tp-size", min=1, help="tensor-parallel degree (preset: tp*, fsdp+tp*)"),
        hardware: opt.HardwareOption = "h100-sxm",
        num_nodes: opt.NumNodesOption = None,
        torch_peer: bool = typer.Option(True, "--torch/--no-torch", help="run torch's OverlapScheduler too (preset)"),
        exact_max_nodes: int = typer.Option(300, help="run the CP-SAT scheduler on graphs up to this many nodes"),
        exact_time_limit: float = typer.Option(20.0, help="CP-SAT time limit in seconds"),
        table: Path = typer.Option(None, "--table", help="measured times (JSON/CSV table or a profiler trace)"),
        json_out: Path = typer.Option(None, "--json", help="write the rows as JSON"),
        jobs: int = typer.Option(
            None, "--jobs", "-j", min=1, help="several targets: processes at once (default: CPUs)"
        ),
        ray_address: str = typer.Option(None, "--ray-address", help="several targets: on Ray ('local' or HOST:PORT)"),
    ) -> None:
        """Run the input order, each seed pass, our scheduler, the CP-SAT optimum (small graphs) and, for a preset,
        torch's own OverlapScheduler with our costs; simulate every order and print one table.

        With --table, every scheduler sees the measured times, and the header line says how many ops and
        collectives the table matched.

        Several targets (comma-separated) are compared each on its own worker (--jobs, --ray-address: see
        README "Scaling out"), one table each.

        Example: commsched compare llama3-8b --parallel fsdp --world-size 256 --layers 8 --json rows.json
        """
        from commsched.cost import estimate_costs
        from commsched.experiments.compare import compare_schedulers
        from commsched.hardware import for_graph
        from commsched.report.terminal_experiments import print_compare

        targets = [t.strip() for t in target.split(",") if t.strip()]
        if len(targets) > 1 or ray_address is not None:
            given = {"seq_len": seq_len, "batch": batch, "tp_size": tp_size}
            build = {"parallel": parallel, "world_size": world_size, "layers": layers, "mode": mode,
                     **{k: v for k, v in given.items() if v is not None}}  # fmt: skip
            knobs = {"exact_max_nodes": exact_max_nodes, "exact_time_limit_s": exact_time_limit}
            _compare_many(targets, hardware, num_nodes, build, torch_peer, knobs, jobs, ray_address, json_out)
            return
        with user_errors():
            gm = None
            if Path(target).exists():
                from commsched.frontends.json_io import load_graph

                graph = load_graph(target)
            else:
                from commsched.workloads import build

                with err_console.status(f"tracing {target} / {parallel} / world {world_size} / {layers} layers"):
                    given = {"seq_len": seq_len, "batch": batch, "tp_size": tp_size}
                    w = build(target, parallel=parallel, world_size=world_size, layers=layers, mode=mode,
                              **{k: v for k, v in given.items() if v is not None})  # fmt: skip
                graph, gm = w.graph, (w.graph_module if torch_peer else None)
            hw = for_graph(hardware, graph, num_nodes=num_nodes)
            nodes = hw.num_nodes
            match = None
            if table is not None:
                from commsched.cost import load_measured
                from commsched.report.table_match import table_match

                measured = load_measured(table)
                costs = estimate_costs(graph, hw, table=measured)
                match = table_match(graph, costs, measured)
            else:
                costs = estimate_costs(graph, hw)
            with err_console.status("scheduling") as status:
                result = compare_schedulers(
                    graph,
                    costs,
                    gm=gm,
                    exact_max_nodes=exact_max_nodes,
                    exact_time_limit_s=exact_time_limit,
                    progress=lambda name: status.update(f"scheduling: {name}"),
                )
            result.meta.update({"target": target, "hardware": hardware, "num_nodes": nodes, "nodes": len(graph)})
            if match is not None:
                result.meta["table_match"] = match.to_dict()
            if json_out:
                from commsched.io import atomic_write_text

                atomic_write_text(json_out, json.dumps(result.to_dict(), indent=1))
        from commsched.report.capacity import step_warnings

        warn(step_warnings(graph.meta, hw, result.input_peak_bytes))  # the traced order's peak
        if match is not None and match.matched_nothing:
            warn([f"{match.line()}: every time is the model's (another shape, dtype or group size?)"])
        elif match is not None:
            console.print(match.line(), highlight=False, soft_wrap=True)
        print_compare(result, console, f"{target}: {len(graph)} nodes on {hardware} x {nodes} node(s)")
        if json_out:
            console.print(f"wrote [bold]{json_out}[/]")


def _compare_many(targets, hardware, num_nodes, build, torch_peer, knobs, jobs, ray_address, json_out) -> None:
    """Several targets on an executor, one table each; exit 2 when none could be compared."""
    from commsched.cli.common import run_on_executor
    from commsched.experiments.compare import compare_many, result_from_dict
    from commsched.report.terminal_experiments import print_compare

    with user_errors():
        with console.status(f"comparing {len(targets)} targets"):
            out = run_on_executor(
                lambda ex: compare_many(targets, hardware=hardware, num_nodes=num_nodes, build=build,
                                        torch_peer=torch_peer, executor=ex, **knobs),
                jobs, ray_address,
            )  # fmt: skip
        if json_out:
            from commsched.io import atomic_write_text

            atomic_write_text(json_out, json.dumps({"targets": out}, indent=1))
    for item in out:
        if "error" in item:
            from rich.markup import escape

            console.print(f"[red]error[/] {escape(item['target'])}: {escape(item['error'])}", highlight=False,
                          soft_wrap=True)  # fmt: skip
            continue
        res = result_from_dict(item["result"])
        print_compare(
            res, console, f"{item['target']}: {res.meta['nodes']} nodes on {hardware} x {res.meta['num_nodes']} node(s)"
        )
    if json_out:
        console.print(f"wrote [bold]{json_out}[/]")
    if all("error" in item for item in out):
        from commsched.cli.common import fail

        fail("no target could be compared")

"""``commsched compare``: every scheduler on one graph (or zoo preset), simulated alike, in one table."""

from __future__ import annotations

from pathlib import Path

import typer

from commsched.cli import common as opt
from commsched.cli.common import Stages, console, err_console, quiet_torch_logs, user_errors, warn
from commsched.cli.options import (
    ZooStep,
    check_layers,
    emit_json,
    json_option,
    layers_phrase,
    step_layers,
    step_title,
    trace_zoo_step,
    zoo_step_options,
)


def register(app: typer.Typer) -> None:
    @app.command()
    @zoo_step_options()
    def compare(
        target: str = typer.Argument(
            ..., help="a graph JSON file or a zoo preset name (e.g. llama3-8b); several, comma-separated"
        ),
        zoo: ZooStep = None,  # type: ignore[assignment]  (the zoo-step options, for a preset: zoo_step_options)
        hardware: opt.HardwareOption = "h100-sxm",
        num_nodes: opt.NumNodesOption = None,
        gpus_per_node: opt.GpusPerNodeOption = None,
        torch_peer: bool = typer.Option(True, "--torch/--no-torch", help="run torch's OverlapScheduler too (preset)"),
        exact_max_nodes: int = typer.Option(300, help="run the CP-SAT scheduler on graphs up to this many nodes"),
        exact_time_limit: float = typer.Option(20.0, help="CP-SAT time limit in seconds"),
        table: Path = typer.Option(None, "--table", help="measured times (JSON/CSV table or a profiler trace)"),
        json_out: str = json_option("the rows", stdout_replaces="the table"),
        jobs: int = typer.Option(
            None, "--jobs", "-j", min=1, help="several targets: processes at once (default: CPUs)"
        ),
        ray_address: str = typer.Option(None, "--ray-address", help="several targets: on Ray ('local' or HOST:PORT)"),
        pp_size: int = typer.Option(
            None,
            "--pp-size",
            help="not taken: compare pipeline schedules with `commsched "
            "sweep PRESET --pp-size P --pp-schedule A,B --microbatches M1,M2`",
        ),
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

        if pp_size is not None:
            with user_errors():
                raise ValueError(f"--pp-size {pp_size}: compare ranks the schedulers of one traced step; compare "
                                 f"pipeline schedules with `commsched sweep {target} --pp-size {pp_size} --pp-schedule "
                                 "1F1B,Interleaved1F1B,ZBVZeroBubble --microbatches ...`")  # fmt: skip
        targets = [t.strip() for t in target.split(",") if t.strip()]
        if len(targets) > 1 or ray_address is not None:
            with user_errors():
                for t in targets:
                    if not Path(t).exists():
                        check_layers(t, zoo.layers)
            build = zoo.build_kwargs()
            knobs = {"exact_max_nodes": exact_max_nodes, "exact_time_limit_s": exact_time_limit}
            _compare_many(targets, hardware, num_nodes, build, torch_peer, knobs, jobs, ray_address, json_out)
            return
        with user_errors():
            gm = None
            if Path(target).exists():
                from commsched.frontends.json_io import load_graph

                graph = load_graph(target)
            else:
                with Stages(("trace", "import")) as stages:
                    w = trace_zoo_step(zoo, target, stages)
                graph, gm = w.graph, (w.graph_module if torch_peer else None)
            hw = for_graph(hardware, graph, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
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
            with err_console.status("scheduling") as status, quiet_torch_logs():
                result = compare_schedulers(
                    graph,
                    costs,
                    gm=gm,
                    exact_max_nodes=exact_max_nodes,
                    exact_time_limit_s=exact_time_limit,
                    progress=lambda name: status.update(f"scheduling: {name}"),
                )
            result.meta.update({"target": target, "hardware": hardware, "num_nodes": nodes, "nodes": len(graph),
                                **step_layers(graph.meta)})  # fmt: skip
            if match is not None:
                result.meta["table_match"] = match.to_dict()
            written = emit_json(result.to_dict(), json_out)
        from commsched.report.capacity import step_warnings

        warn(step_warnings(graph.meta, hw, result.input_peak_bytes))  # the traced order's peak
        if json_out == "-":
            return
        if match is not None and match.matched_nothing:
            warn([f"{match.line()}: every time is the model's (another shape, dtype or group size?)"])
        elif match is not None:
            console.print(match.line(), highlight=False, soft_wrap=True)
        title = f"{_name(target, graph.meta)}: {len(graph)} nodes on {hardware} x {nodes} node(s)"
        print_compare(result, console, title)
        if written:
            console.print(f"wrote [bold]{written}[/]")


def _name(target: str, meta: dict) -> str:
    """A target as a title names it: a zoo step with its layers out of the preset's (:func:`step_title`)."""
    return step_title(meta) if "preset" in meta and not Path(target).exists() else target


def _compare_many(targets, hardware, num_nodes, build, torch_peer, knobs, jobs, ray_address, json_out) -> None:
    """Several targets on an executor, one table each; exit 2 when none could be compared."""
    from commsched.cli.common import run_on_executor
    from commsched.experiments.compare import compare_many, result_from_dict
    from commsched.report.terminal_experiments import print_compare

    with user_errors():
        with err_console.status(f"comparing {len(targets)} targets"), quiet_torch_logs():
            out = run_on_executor(
                lambda ex: compare_many(targets, hardware=hardware, num_nodes=num_nodes, build=build,
                                        torch_peer=torch_peer, executor=ex, **knobs),
                jobs, ray_address,
            )  # fmt: skip
        written = emit_json({"targets": out}, json_out)
    if json_out == "-":
        if all("error" in item for item in out):
            from commsched.cli.common import fail

            fail("no target could be compared")
        return
    for item in out:
        if "error" in item:
            from rich.markup import escape

            console.print(f"[red]error[/] {escape(item['target'])}: {escape(item['error'])}", highlight=False,
                          soft_wrap=True)  # fmt: skip
            continue
        res = result_from_dict(item["result"])
        t = item["target"]
        name = t if Path(t).exists() else f"{t} ({layers_phrase(t, build['layers'])})"
        title = f"{name}: {res.meta['nodes']} nodes on {hardware} x {res.meta['num_nodes']} node(s)"
        print_compare(res, console, title)
    if written:
        console.print(f"wrote [bold]{written}[/]")
    if all("error" in item for item in out):
        from commsched.cli.common import fail

        fail("no target could be compared")

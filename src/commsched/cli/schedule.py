"""``commsched schedule`` and ``commsched check``: run passes on a graph; validate a schedule file."""

from __future__ import annotations

from pathlib import Path

import typer

from commsched.cli.common import (
    GpusPerNodeOption,
    HardwareOption,
    KnobOption,
    NumNodesOption,
    console,
    err_console,
    parse_knobs,
    user_errors,
    warn,
)
from commsched.cli.options import emit_json, json_option, out_file


def register(app: typer.Typer) -> None:
    @app.command()
    def schedule(
        graph: Path = typer.Argument(None, help="a graph JSON file (commsched.graph format)"),
        hardware: HardwareOption = "h100-sxm",
        num_nodes: NumNodesOption = None,
        gpus_per_node: GpusPerNodeOption = None,
        passes: str = typer.Option("default", "--passes", "-s", help="comma-separated pass names, or a preset"),
        knob: KnobOption = [],  # noqa: B006 (typer copies it)
        stats: bool = typer.Option(False, "--stats", help="print what each pass did"),
        timeline: bool = typer.Option(False, "--timeline", help="print a text timeline of the final order"),
        out: Path = out_file("-o", "--out", help="write the schedule (order of node names) as JSON"),
        table: Path = typer.Option(
            None, "--table", help="measured times: a table or profiler trace (e.g. from calibrate --trace -o)"
        ),
        list_passes: bool = typer.Option(False, "--list", help="list passes and presets, then exit"),
        json_out: str = json_option("the scheduled step's summary (as simulate's)"),
    ) -> None:
        """Reorder GRAPH with scheduling passes and report the simulated effect.

        Example: commsched schedule graph.json --hardware h100-sxm --passes raise_comms,sink_waits --stats
        -o scheduled.json

        Example: commsched schedule graph.json --knob memory_budget=1.0 --knob overlap.waits=late
        """
        from commsched.passes import PASSES, PRESETS
        from commsched.report.terminal import print_pass_list, print_schedule_report

        if list_passes:
            print_pass_list(PASSES, PRESETS, console)
            return
        if graph is None:
            raise typer.BadParameter("GRAPH is required (or use --list)")
        from commsched.cost import estimate_costs, load_measured
        from commsched.frontends.json_io import load_graph
        from commsched.hardware import for_graph
        from commsched.passes import check_knobs
        from commsched.passes import schedule as run_schedule
        from commsched.report.capacity import step_warnings
        from commsched.report.step import predict

        with user_errors():
            g = load_graph(graph)
            knobs = parse_knobs(knob)
            check_knobs(passes, knobs)  # before the costs are estimated
            hw = for_graph(hardware, g, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
            with err_console.status(f"estimating {len(g)} nodes on {hardware}"):
                costs = estimate_costs(g, hw, table=load_measured(table) if table is not None else None)
            with err_console.status(f"running {passes}"):
                result = run_schedule(g, costs, passes, **knobs)
            before = predict(g, costs)
            after = predict(g, costs, result.order, result.streams, result.compute_interference)
            if out:
                result.save(out)
        warnings = step_warnings(g.meta, hw, after.sim.peak_memory_bytes)
        warn(warnings)
        written = None
        if json_out:
            context = {"hardware": hardware, "nodes in cluster": hw.num_nodes, "passes": result.passes,
                       "input_makespan_s": before.makespan_s}  # fmt: skip
            files = [str(out)] if out else []
            summary = {**after.summary(hw), "context": context, "warnings": warnings, "files": files}
            with user_errors():
                written = emit_json(summary, json_out)
            if written is None:
                return
        print_schedule_report(
            result, before, after, console, title=graph.name, costs=costs, stats=stats, timeline=timeline
        )
        for path in (out, written):
            if path:
                console.print(f"wrote [bold]{path}[/]")

    @app.command()
    def check(
        graph: Path = typer.Argument(..., help="a graph JSON file"),
        scheduled: Path = typer.Argument(..., help="a schedule file (commsched schedule -o) or a JSON list of names"),
        allow_collective_reorder: bool = typer.Option(
            False, "--allow-collective-reorder", help="accept any per-group collective order (no SPMD check)"
        ),
    ) -> None:
        """Validate a schedule: topological order, every process group's collective order unchanged (SPMD), and
        with several streams, a collective issue order the program itself forces. A schedule whose pass reordered
        collectives on purpose (reorder_collectives) records each group's new order: it is checked against that.

        Example: commsched check graph.json scheduled.json
        """
        from commsched.frontends.json_io import load_graph
        from commsched.passes import load_order

        with user_errors():
            g = load_graph(graph)
            s = load_order(g, scheduled, allow_collective_reorder=allow_collective_reorder)  # as simulate --order
        from rich.markup import escape

        how = f"; collectives reordered by {', '.join(s.reordered_by)}, as recorded" if s.reordered_by else ""
        console.print(f"[green]ok[/]: {escape(str(scheduled))} is a valid schedule of {escape(str(graph))} "
                      f"({len(g)} nodes{how})", soft_wrap=True)  # fmt: skip

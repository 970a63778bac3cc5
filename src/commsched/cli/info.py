"""``commsched info``: what a graph holds."""

from __future__ import annotations

from pathlib import Path

import typer

from commsched.cli.common import HardwareOption, console, user_errors, warn
from commsched.cli.options import emit_json, json_option
from commsched.report.summary import summarize
from commsched.report.terminal_inputs import print_graph_info


def register(app: typer.Typer) -> None:
    @app.command()
    def info(
        graph: Path = typer.Argument(..., help="a graph JSON file (commsched.graph format)"),
        hardware: HardwareOption = "h100-sxm",
        json_out: str = json_option("the summary"),
    ) -> None:
        """Counts by node kind, collective type and process group; total flops; bytes communicated; the share of
        the step's compute that activation checkpointing recomputes and that float8 training's kernels take
        (flops, and time on --hardware's eager kernels).

        Example: commsched info graph.json

        Example: commsched info ac.json -H h100-sxm --json
        """
        from commsched.frontends.json_io import load_graph
        from commsched.report.summary import SHARES, tagged_nodes

        with user_errors():
            g = load_graph(graph)
            costs = None
            if any(len(tagged_nodes(g, tag)) for tag in SHARES):  # the time shares: cost the step's kernels
                from commsched.cost import estimate_costs
                from commsched.hardware import for_graph

                costs = estimate_costs(g, for_graph(hardware, g), fusion=False)
            summary = summarize(g, costs)
        from commsched.report.capacity import step_warnings

        warn(step_warnings(g.meta, None, None))
        written = None
        if json_out:
            with user_errors():
                written = emit_json(summary.to_dict(), json_out)
            if written is None:
                return
        print_graph_info(summary, console, title=str(graph))
        if written is not None:
            console.print(f"wrote [bold]{written}[/]")

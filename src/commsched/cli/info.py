"""``commsched info``: what a graph holds."""

from __future__ import annotations

from pathlib import Path

import typer

from commsched.cli.common import console, user_errors, warn
from commsched.cli.options import emit_json, json_option
from commsched.report.summary import summarize
from commsched.report.terminal_inputs import print_graph_info


def register(app: typer.Typer) -> None:
    @app.command()
    def info(
        graph: Path = typer.Argument(..., help="a graph JSON file (commsched.graph format)"),
        json_out: str = json_option("the summary"),
    ) -> None:
        """Counts by node kind, collective type and process group; total flops; bytes communicated.

        Example: commsched info graph.json
        """
        from commsched.frontends.json_io import load_graph

        with user_errors():
            g = load_graph(graph)
        from commsched.report.capacity import step_warnings

        warn(step_warnings(g.meta, None, None))
        written = None
        if json_out:
            with user_errors():
                written = emit_json(summarize(g).to_dict(), json_out)
            if written is None:
                return
        print_graph_info(summarize(g), console, title=str(graph))
        if written is not None:
            console.print(f"wrote [bold]{written}[/]")

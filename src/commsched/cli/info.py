"""``commsched info``: what a graph holds."""

from __future__ import annotations

from pathlib import Path

import typer

from commsched.cli.common import console, user_errors, warn
from commsched.report.summary import summarize
from commsched.report.terminal_inputs import print_graph_info


def register(app: typer.Typer) -> None:
    @app.command()
    def info(
        graph: Path = typer.Argument(..., help="a graph JSON file (commsched.graph format)"),
        json_out: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    ) -> None:
        """Counts by node kind, collective type and process group; total flops; bytes communicated.

        Example: commsched info graph.json
        """
        import json

        from commsched.frontends.json_io import load_graph

        with user_errors():
            g = load_graph(graph)
        from commsched.report.capacity import step_warnings

        warn(step_warnings(g.meta, None, None))
        if json_out:
            console.print_json(json.dumps(summarize(g).to_dict()))
        else:
            print_graph_info(summarize(g), console, title=str(graph))

"""``commsched info``: what a graph holds."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from commsched.cli.common import console, user_errors
from commsched.ir import Graph
from commsched.report.summary import summarize
from commsched.report.units import fmt_bytes, fmt_flops


def print_graph_info(g: Graph, title: str = "graph") -> None:
    s = summarize(g)
    kinds = Table(title=f"{title}: {s.num_nodes} nodes", show_edge=False)
    kinds.add_column("kind")
    kinds.add_column("nodes", justify="right")
    for k, v in s.nodes_by_kind.items():
        if v:
            kinds.add_row(k, str(v))
    kinds.add_row("[bold]total flops", fmt_flops(s.total_flops))
    console.print(kinds)
    colls = Table(title="collectives (bytes in the nccl-tests convention)", show_edge=False)
    for col in ("type", "group", "group size", "count", "bytes"):
        colls.add_column(col, justify="right" if col in ("group size", "count", "bytes") else "left")
    for row in s.collectives:
        colls.add_row(row["type"], row["group"], str(row["group_size"]), str(row["count"]), fmt_bytes(row["bytes"]))
    colls.add_row("[bold]all", "", "", str(sum(r["count"] for r in s.collectives)), fmt_bytes(s.comm_bytes))
    console.print(colls)


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
        if json_out:
            console.print_json(json.dumps(summarize(g).to_dict()))
        else:
            print_graph_info(g, title=str(graph))

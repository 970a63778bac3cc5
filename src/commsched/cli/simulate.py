"""``commsched simulate``: estimate a graph on a hardware profile, simulate one step, write trace / HTML / Gantt."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from commsched.cli.common import GpusPerNodeOption, HardwareOption, NumNodesOption, console, user_errors
from commsched.io import read_input_json


def load_order(path: Path) -> list[str]:
    """A schedule file: a JSON list of node names, or an object with an ``order`` list."""
    data = read_input_json(path, "schedule (a JSON list of node names)")
    order = data.get("order") if isinstance(data, dict) else data
    if not isinstance(order, list) or not all(isinstance(v, (str, int)) for v in order):
        raise ValueError(f"{path}: expected a JSON list of node names (or {{'order': [...]}})")
    return order


def register(app: typer.Typer) -> None:
    @app.command()
    def simulate(
        graph: Path = typer.Argument(..., help="a graph JSON file (commsched.graph format)"),
        hardware: HardwareOption = "h100-sxm",
        num_nodes: NumNodesOption = None,
        gpus_per_node: GpusPerNodeOption = None,
        order: Path = typer.Option(None, "--order", help="JSON list of node names to simulate (default: graph order)"),
        trace: Path = typer.Option(None, "--trace", help="write a Perfetto / Chrome trace (Kineto-shaped JSON)"),
        html: Path = typer.Option(None, "--html", help="write a self-contained HTML report"),
        gantt: Path = typer.Option(None, "--gantt", help="write a Gantt chart PNG"),
        json_out: bool = typer.Option(False, "--json", help="print the summary as JSON instead of tables"),
    ) -> None:
        """Simulate one step of GRAPH on a hardware profile and report step time, exposed communication, overlap
        and peak memory.

        Example: commsched simulate graph.json --hardware h100-sxm --num-nodes 8 --trace out.json --html report.html
        """
        from commsched.cost import estimate_costs
        from commsched.frontends.json_io import load_graph
        from commsched.hardware import for_graph
        from commsched.report.terminal import print_summary
        from commsched.sim import simulate_costs

        with user_errors():
            g = load_graph(graph)
            hw = for_graph(hardware, g, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
            num_nodes = hw.num_nodes
            with console.status(f"estimating {len(g)} nodes on {hardware} x {num_nodes} node(s)"):
                costs = estimate_costs(g, hw)
            with console.status("simulating"):
                res = simulate_costs(g, costs, load_order(order) if order else None)
            context = {"hardware": hardware, "nodes in cluster": num_nodes}
            written = write_reports(res, trace=trace, html=html, gantt=gantt, context=context)
        if json_out:
            console.print_json(json.dumps({**res.summary(), "context": context, "files": [str(p) for p in written]}))
            return
        print_summary(res, console, title=f"{graph.name} on {hardware} x {num_nodes}")
        for p in written:
            console.print(f"wrote [bold]{p}[/]")


def write_reports(res, *, trace=None, html=None, gantt=None, context=None) -> list[Path]:
    """Write whichever of the trace, HTML report and Gantt PNG were asked for; returns their paths."""
    written = []
    if trace:
        from commsched.report.trace import write_chrome_trace

        written.append(write_chrome_trace(res, trace))
    if html:
        from commsched.report.html import write_html

        with console.status("rendering the HTML report"):
            written.append(write_html(res, html, context=context))
    if gantt:
        from commsched.report.gantt import write_gantt

        written.append(write_gantt(res, gantt))
    return written

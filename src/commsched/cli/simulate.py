"""``commsched simulate``: estimate a graph on a hardware profile, simulate one step, write trace / HTML / Gantt."""

from __future__ import annotations

from pathlib import Path

import typer

from commsched.cli.common import (
    GpusPerNodeOption,
    HardwareOption,
    NumNodesOption,
    console,
    err_console,
    user_errors,
    warn,
)
from commsched.cli.options import emit_json, json_option, out_file


def load_order(g, path: Path):
    """``--order``: a schedule file (``commsched schedule -o``: its order, compute streams and contention charge),
    or a plain JSON list of node names, checked as ``commsched check`` checks it. Returns a
    :class:`commsched.passes.Schedule`."""
    from commsched.passes import load_order as load

    return load(g, path)


def register(app: typer.Typer) -> None:
    @app.command()
    def simulate(
        graph: Path = typer.Argument(..., help="a graph JSON file (commsched.graph format)"),
        hardware: HardwareOption = "h100-sxm",
        num_nodes: NumNodesOption = None,
        gpus_per_node: GpusPerNodeOption = None,
        order: Path = typer.Option(
            None, "--order", help="a schedule file (schedule -o: order and streams) or a JSON list of node names"
        ),
        trace: Path = out_file("--trace", help="write a Perfetto / Chrome trace (Kineto-shaped JSON)"),
        html: Path = out_file("--html", help="write a self-contained HTML report"),
        gantt: Path = out_file("--gantt", help="write a Gantt chart PNG"),
        json_out: str = json_option("the summary"),
    ) -> None:
        """Simulate one step of GRAPH on a hardware profile and report step time, exposed communication, overlap
        and peak memory.

        Example: commsched simulate graph.json --hardware h100-sxm --num-nodes 8 --trace out.json --html report.html
        """
        from commsched.cost import estimate_costs
        from commsched.frontends.json_io import load_graph
        from commsched.hardware import for_graph
        from commsched.report.capacity import step_warnings
        from commsched.report.step import predict
        from commsched.report.terminal import print_summary

        with user_errors():
            g = load_graph(graph)
            hw = for_graph(hardware, g, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
            num_nodes = hw.num_nodes
            with err_console.status(f"estimating {len(g)} nodes on {hardware} x {num_nodes} node(s)"):
                costs = estimate_costs(g, hw)
            sched = load_order(g, order) if order else None
            with err_console.status("simulating"):
                step = predict(g, costs, *((sched.order, sched.streams, sched.compute_interference) if sched else ()))
            res = step.sim
            context = {"hardware": hardware, "nodes in cluster": num_nodes}
            warnings = step_warnings(g.meta, hw, res.peak_memory_bytes)
            written = write_reports(res, trace=trace, html=html, gantt=gantt, context=context, hw=hw, warnings=warnings)
        warn(warnings)
        if json_out:
            files = [str(p) for p in written]
            # with mfu and tokens_per_s: null where the graph cannot tell
            path = emit_json({**step.summary(hw), "context": context, "warnings": warnings, "files": files}, json_out)
            if path is None:
                return
            written.append(path)
        print_summary(res, console, title=f"{graph.name} on {hardware} x {num_nodes}", contention_s=step.contention_s)
        for p in written:
            console.print(f"wrote [bold]{p}[/]")


def write_reports(res, *, trace=None, html=None, gantt=None, context=None, hw=None, warnings=()) -> list[Path]:
    """Write whichever of the trace, HTML report and Gantt PNG were asked for; returns their paths. ``hw``: its HBM
    capacity is a line on the memory plots; ``warnings`` head the HTML report."""
    capacity = hw.compute.hbm_capacity_bytes if hw is not None else None
    written = []
    if trace:
        from commsched.report.trace import write_chrome_trace

        written.append(write_chrome_trace(res, trace))
    if html:
        from commsched.report.html import write_html

        with err_console.status("rendering the HTML report"):
            written.append(
                write_html(res, html, context=context, capacity_bytes=capacity, warnings=warnings, hardware=hw)
            )
    if gantt:
        from commsched.report.gantt import write_gantt

        written.append(write_gantt(res, gantt, capacity_bytes=capacity))
    return written

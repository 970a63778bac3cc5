"""``commsched estimate``: per-node times of a graph on a hardware profile, totals and the most expensive ops."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from commsched.cli.common import GpusPerNodeOption, HardwareOption, NumNodesOption, console, user_errors
from commsched.report.units import fmt_bytes, fmt_seconds


def print_cost_summary(summary: dict, title: str) -> None:
    hw = f"{summary['hardware']} x {summary['num_nodes']} node(s) of {summary['gpus_per_node']}"
    totals = Table(title=f"{title} on {hw}", show_edge=False)
    totals.add_column("")
    totals.add_column("time", justify="right")
    totals.add_row("compute (one stream, serial)", fmt_seconds(summary["compute_s"]))
    totals.add_row("communication (serial)", fmt_seconds(summary["communication_s"]))
    totals.add_row("[bold]no overlap at all", fmt_seconds(summary["serial_s"]))
    for cls, t in summary["by_class_s"].items():
        totals.add_row(f"  {cls}", fmt_seconds(t))
    totals.add_row("fusion regions", f"{summary['fusion_regions']} ({summary['fused_nodes']} nodes)")
    console.print(totals)
    if summary["collectives"]:
        colls = Table(title="collectives", show_edge=False)
        for col in ("type", "group", "size", "algorithm", "link", "count", "bytes", "time"):
            colls.add_column(
                col, justify="right" if col in ("size", "count", "bytes", "time") else "left", overflow="fold"
            )
        for r in summary["collectives"]:
            colls.add_row(r["type"], r["group"], str(r["group_size"]), r["algorithm"], r["link"], str(r["count"]),
                          fmt_bytes(r["bytes"]), fmt_seconds(r["time_s"]))  # fmt: skip
        console.print(colls)
    top = Table(title="most expensive ops", show_edge=False)
    for col in ("node", "target", "class", "time", "share"):
        top.add_column(col, justify="right" if col in ("time", "share") else "left", overflow="fold")
    for r in summary["top_ops"]:
        region = f" (region {r['fusion_region']})" if r["fusion_region"] >= 0 else ""
        top.add_row(r["node"], r["target"], r["class"] + region, fmt_seconds(r["time_s"]), f"{r['share']:.1%}")
    console.print(top)


def register(app: typer.Typer) -> None:
    @app.command()
    def estimate(
        graph: Path = typer.Argument(..., help="a graph JSON file (commsched.graph format)"),
        hardware: HardwareOption = "h100-sxm",
        num_nodes: NumNodesOption = None,
        gpus_per_node: GpusPerNodeOption = None,
        table: Path = typer.Option(None, "--table", help="measured times (JSON/CSV table or a profiler trace)"),
        no_fusion: bool = typer.Option(False, "--no-fusion", help="charge every op as its own kernel (eager)"),
        top: int = typer.Option(10, "--top", min=0, help="how many of the most expensive ops to list"),
        json_out: bool = typer.Option(False, "--json", help="print the summary as JSON"),
    ) -> None:
        """Estimate every node of a graph on a hardware profile; print totals and the top ops.

        Example: commsched estimate graph.json --hardware h100-sxm --num-nodes 4
        """
        import json

        from commsched.cost import MeasuredTable, estimate_costs, table_from_chrome_trace
        from commsched.cost.summary import cost_summary
        from commsched.frontends.json_io import load_graph
        from commsched.hardware import for_graph

        with user_errors():
            g = load_graph(graph)
            hw = for_graph(hardware, g, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
            measured = None
            if table is not None:
                if not table.is_file():
                    raise FileNotFoundError(f"measured table {str(table)!r} does not exist")
                is_table = table.suffix == ".csv" or '"commsched.cost-table"' in table.read_text(encoding="utf-8")[:200]
                measured = MeasuredTable.load(table) if is_table else table_from_chrome_trace(table)
            est = estimate_costs(g, hw, table=measured, fusion=not no_fusion)
            summary = cost_summary(g, est, top=top)
        if json_out:
            console.print_json(json.dumps(summary))
        else:
            print_cost_summary(summary, title=str(graph))

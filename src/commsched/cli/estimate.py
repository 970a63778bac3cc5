"""``commsched estimate``: per-node times of a graph on a hardware profile, totals and the most expensive ops."""

from __future__ import annotations

from pathlib import Path

import typer

from commsched.cli.common import GpusPerNodeOption, HardwareOption, NumNodesOption, console, user_errors, warn
from commsched.cli.options import emit_json, json_option


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
        json_out: str = json_option("the summary"),
    ) -> None:
        """Estimate every node of a graph on a hardware profile; print totals and the top ops.

        With --table, says how many of the graph's ops and collectives the table timed (the model times the rest).

        Example: commsched estimate graph.json --hardware h100-sxm --num-nodes 4

        Example: commsched estimate graph.json -H cpu-local --table trace.json --no-fusion
        """
        from commsched.cost import estimate_costs, load_measured
        from commsched.cost.summary import cost_summary
        from commsched.frontends.json_io import load_graph
        from commsched.hardware import for_graph
        from commsched.report.terminal_inputs import print_cost_summary

        with user_errors():
            g = load_graph(graph)
            hw = for_graph(hardware, g, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
            measured = load_measured(table) if table is not None else None
            est = estimate_costs(g, hw, table=measured, fusion=not no_fusion)
            summary = cost_summary(g, est, top=top)
            match = None
            if measured is not None:
                from commsched.report.table_match import table_match

                match = table_match(g, est, measured)
            from commsched.memory import memory_profile
            from commsched.report.capacity import step_warnings

            warnings = step_warnings(g.meta, hw, memory_profile(g).peak_bytes)  # the graph's own order
        if match is not None and match.matched_nothing:
            warnings.append(f"{match.line()}: every time is the model's (another shape, dtype or group size?)")
        warn(warnings)
        written = None
        if json_out:
            data = {**summary, "warnings": warnings}
            if match is not None:
                data["table_match"] = match.to_dict()
            with user_errors():
                written = emit_json(data, json_out)
            if written is None:
                return
        print_cost_summary(summary, console, title=str(graph))
        if match is not None:
            console.print(match.line(), highlight=False, soft_wrap=True)
        if written is not None:
            console.print(f"wrote [bold]{written}[/]")

"""``commsched demo``: the end-to-end job on the default built-in workload (llama3-8b / fsdp / 4 layers / world 64):
trace it on fake tensors, estimate it on an H100 cluster, simulate the traced order, schedule it with the flagship
``overlap`` pass (keeping every group's collective order, and with deterministic reordering), simulate again, and
write the graph, the schedule, a Perfetto trace and an HTML report of both orders side by side."""

from __future__ import annotations

from pathlib import Path

import typer

from commsched.cli.common import HardwareOption, console, err_console, user_errors, warn
from commsched.cli.options import check_layers, layers_phrase, step_title
from commsched.cli.options import out_dir as out_dir_option

DEFAULT_PRESET, DEFAULT_PARALLEL, DEFAULT_LAYERS, DEFAULT_WORLD = "llama3-8b", "fsdp", 4, 64


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        out_dir: Path = out_dir_option(
            "--out-dir", help="a folder: where the demo writes its files", default=Path("demo_out")
        ),
        world_size: int = typer.Option(DEFAULT_WORLD, help="ranks of the fake process group"),
        preset: str = typer.Option(DEFAULT_PRESET, "--preset", help="zoo model preset (commsched trace --list)"),
        parallel: str = typer.Option(DEFAULT_PARALLEL, "--parallel", help="zoo parallelism"),
        layers: int = typer.Option(
            DEFAULT_LAYERS, "--layers", "-l", min=1, help="transformer blocks to trace (a slice, to stay quick)"
        ),
        hardware: HardwareOption = "h100-sxm",
    ) -> None:
        """Trace, estimate, simulate, schedule and report the default workload.

        Example: commsched demo --out-dir demo_out --world-size 64
        """
        from commsched.cost import estimate_costs
        from commsched.frontends.json_io import save_graph
        from commsched.hardware import for_graph
        from commsched.passes import schedule
        from commsched.report.html import write_comparison_html
        from commsched.report.summary import summarize
        from commsched.report.terminal import print_demo_report
        from commsched.report.trace import write_chrome_trace
        from commsched.sim import simulate_costs
        from commsched.workloads import resolve, trace_spec

        with user_errors():
            check_layers(preset, layers)
            spec = resolve(preset, parallel=parallel, world_size=world_size, layers=layers)
            with err_console.status(f"tracing {preset} / {parallel} / {layers} layers at world {world_size}") as status:
                g = trace_spec(spec, progress=lambda msg: status.update(msg)).graph
            save_graph(g, out_dir / "graph.json")
            hw = for_graph(hardware, g)
            nodes = hw.num_nodes
            with err_console.status(f"estimating {len(g)} nodes on {hardware} x {nodes} nodes"):
                costs = estimate_costs(g, hw)
            with err_console.status("simulating and scheduling"):
                before = simulate_costs(g, costs)
                ours = schedule(g, costs, "default")
                ours_reorder = schedule(g, costs, "default", reorder_collectives=True)
                results = [
                    ("traced order", before),
                    ("overlap", simulate_costs(g, costs, ours.order)),
                    ("overlap, reorder_collectives", simulate_costs(g, costs, ours_reorder.order)),
                ]
            # the headline is the fastest schedule: scheduled.json and trace.json are that one
            best = 1 if results[1][1].makespan_s <= results[2][1].makespan_s else 2
            (ours if best == 1 else ours_reorder).save(out_dir / "scheduled.json")
            context = {"hardware": f"{hardware} x {nodes} nodes", "world size": world_size}
            write_chrome_trace(results[best][1], out_dir / "trace.json", world_size=world_size)
            from commsched.report.capacity import step_warnings

            warnings = step_warnings(g.meta, hw, max(r.peak_memory_bytes for _, r in results))
            from commsched.passes.overlap import OverlapConfig

            budget = OverlapConfig().memory_budget.limit_bytes(before.peak_memory_bytes)  # the schedules' cap
            write_comparison_html(results, out_dir / "report.html", context=context, hardware=hw,
                                  memory_budget_bytes=budget, warnings=warnings)  # fmt: skip
        warn(warnings)
        print_demo_report(
            summarize(g),
            results,
            (ours.stats[0], ours_reorder.stats[0]),
            console,
            graph_title=step_title(g.meta),
            title=f"one step of {layers_phrase(preset, layers)} on {hardware} x {nodes} nodes (simulated)",
        )
        label, res = results[best]
        speedup = before.makespan_s / res.makespan_s
        console.print(f"headline: {label}, {res.makespan_s * 1e3:.3f} ms, {speedup:.3f}x the traced order's step; "
                      f"scheduled.json and trace.json are this schedule", soft_wrap=True)  # fmt: skip
        for name in ("graph.json", "scheduled.json", "trace.json", "report.html"):
            console.print(f"wrote [bold]{out_dir / name}[/]")

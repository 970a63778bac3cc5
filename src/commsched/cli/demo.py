"""``commsched demo``: the end-to-end job on the default built-in workload (llama3-8b / fsdp / 4 layers)."""

from __future__ import annotations

from pathlib import Path

import typer

from commsched.cli.common import console, user_errors

DEFAULT_PRESET, DEFAULT_PARALLEL, DEFAULT_LAYERS, DEFAULT_WORLD = "llama3-8b", "fsdp", 4, 64


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        out_dir: Path = typer.Option(Path("demo_out"), "--out-dir", help="where the demo writes its files"),
        world_size: int = typer.Option(DEFAULT_WORLD, help="ranks of the fake process group"),
        preset: str = typer.Option(DEFAULT_PRESET, "--preset", help="zoo model preset (commsched trace --list)"),
        parallel: str = typer.Option(DEFAULT_PARALLEL, "--parallel", help="zoo parallelism"),
        layers: int = typer.Option(DEFAULT_LAYERS, "--layers", help="transformer blocks to trace"),
    ) -> None:
        """Trace the default workload, write its graph JSON and print what it holds.

        Example: commsched demo --out-dir demo_out --world-size 64
        """
        from commsched.cli.info import print_graph_info
        from commsched.frontends.json_io import save_graph
        from commsched.workloads import resolve, trace_spec

        with user_errors():
            spec = resolve(preset, parallel=parallel, world_size=world_size, layers=layers)
            with console.status(f"tracing {preset} / {parallel} / {layers} layers at world {world_size}") as status:
                g = trace_spec(spec, progress=lambda msg: status.update(msg)).graph
            path = out_dir / "graph.json"
            save_graph(g, path)
        console.print(f"wrote [bold]{path}[/] ({len(g)} nodes)")
        print_graph_info(g, title=g.meta.get("workload", "graph"))

"""``commsched demo``: the main job on the default built-in workload (llama3-8b / fsdp / world 64, 4 of its 32
layers on 8 nodes of 8 H100s): trace it on fake tensors, ``optimize`` it, and judge the kept step against the step as
the framework runs it today (FSDP2 eager) and against torch's best overlap configuration, with the same costs; print
what bounds the step and what would move it, and write the kept program, its schedule, a Perfetto trace and an HTML
report of every step side by side."""

from __future__ import annotations

import json
from pathlib import Path

import typer

from commsched.cli.common import HardwareOption, console, err_console, user_errors, warn
from commsched.cli.options import check_layers, step_title
from commsched.cli.options import out_dir as out_dir_option

DEFAULT_PRESET, DEFAULT_PARALLEL, DEFAULT_LAYERS, DEFAULT_WORLD = "llama3-8b", "fsdp", 4, 64
DEMO_FILES = ("graph.json", "scheduled.json", "trace.json", "optimize.json", "report.html")


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
        """Optimize the default workload and judge it against FSDP2 eager and torch's best configuration.

        Example: commsched demo --out-dir demo_out --world-size 64
        """
        from commsched.experiments.references import framework_program, reference_steps
        from commsched.hardware import for_graph
        from commsched.optimize import optimize
        from commsched.report.capacity import step_warnings
        from commsched.report.optimize_report import print_references
        from commsched.workloads import build

        with user_errors():
            check_layers(preset, layers)
            build_kwargs = {"parallel": parallel, "world_size": world_size, "layers": layers}
            w = _traced(build, preset, build_kwargs)
            hw = for_graph(hardware, w.graph)
            title = f"{step_title(w.graph.meta)} on {hardware} x {hw.num_nodes} nodes"
            with err_console.status("optimizing: scheduling and simulating every program variant"):
                o = optimize(w.graph_module, hw, group_sizes=w.graph.group_sizes())
            with err_console.status("the references: the framework's order and torch's configurations") as status:
                fw = framework_program(preset, build_kwargs)
                refs = reference_steps(w.graph, hw, gm=w.graph_module, framework_graph=None if fw is None else fw.graph,
                                       progress=lambda msg: status.update(f"the references: {msg}"))  # fmt: skip
            warnings = step_warnings(w.graph.meta, hw, o.after.peak_memory_bytes)
            _write(out_dir, o, refs, hw, title, warnings)
        warn(warnings)
        from commsched.report.bound_text import what_bounds_the_step, what_would_move_it

        console.print(f"[bold]{title}[/] (simulated)", highlight=False, soft_wrap=True)
        console.print(f"what bounds the step: {what_bounds_the_step(o.after, hw)}", highlight=False, soft_wrap=True)
        console.print(f"what would move it: {what_would_move_it(o.after, hw)}", highlight=False, soft_wrap=True)
        print_references(o, refs, console, f"the kept step against what runs today ({len(o.tried)} variants tried)")
        for name in DEMO_FILES:
            console.print(f"wrote [bold]{out_dir / name}[/]")


def _traced(build, preset: str, build_kwargs: dict):
    with err_console.status(f"tracing {preset} / {build_kwargs['parallel']} / world {build_kwargs['world_size']}"):
        return build(preset, **build_kwargs)


def _write(out_dir: Path, o, refs, hw, title: str, warnings) -> None:
    """The kept program (with its workload metadata), its schedule, its Perfetto trace, the JSON answer, the report."""
    from commsched.frontends.json_io import save_graph
    from commsched.io import atomic_write_text
    from commsched.report.bound_text import bound_summary
    from commsched.report.html import write_optimize_html
    from commsched.report.optimize_report import headline_dict
    from commsched.report.trace import write_chrome_trace

    save_graph(o.graph, out_dir / "graph.json")
    o.schedule.save(out_dir / "scheduled.json")
    write_chrome_trace(o.after, out_dir / "trace.json", world_size=int(o.graph.meta.get("world_size") or 1))
    answer = {**headline_dict(o, refs), "bound": bound_summary(o.after, hw), "optimize": o.to_dict()}
    atomic_write_text(out_dir / "optimize.json", json.dumps(answer, indent=1))
    write_optimize_html(o, refs, out_dir / "report.html", title=f"commsched demo: {title}", hardware=hw,
                        warnings=warnings)  # fmt: skip

"""``commsched trace``: trace a zoo workload (Llama 3 / Mixtral at any world size) into a graph JSON file."""

from __future__ import annotations

from pathlib import Path

import typer

from commsched.cli.common import Stages, console, user_errors, warn
from commsched.cli.options import ZooStep, out_file, step_title, trace_zoo_step, zoo_step_options


def register(app: typer.Typer) -> None:
    @app.command()
    @zoo_step_options()
    def trace(
        preset: str = typer.Argument(None, help="model preset (see --list), e.g. llama3-8b"),
        zoo: ZooStep = None,  # type: ignore[assignment]  (the zoo-step options: zoo_step_options)
        out: Path = out_file("--out", "-o", help="write the graph JSON here"),
        list_: bool = typer.Option(False, "--list", help="list presets, parallelisms and modes, then exit"),
    ) -> None:
        """Trace one step of a built-in workload on fake tensors (no GPU) and print what its graph holds. Every
        layer of the preset unless --layers says fewer (a large model's full step takes minutes: progress on
        stderr).

        Example: commsched trace llama3-8b --parallel fsdp --world-size 64 --layers 4 -o graph.json
        """
        from commsched.report.terminal_inputs import print_graph_info

        if list_:
            from commsched.report.terminal_inputs import print_zoo_list
            from commsched.workloads import MODES, PARALLELISMS, PRESETS
            from commsched.workloads.mesh import INFERENCE_PARALLELISMS

            print_zoo_list(PRESETS.values(), PARALLELISMS, MODES, console, inference=INFERENCE_PARALLELISMS)
            return
        from commsched.frontends.json_io import save_graph
        from commsched.report.summary import summarize

        with user_errors():
            if preset is None:
                raise ValueError("give a PRESET (e.g. llama3-8b) or --list")
            with Stages(("trace", "import", "write") if out is not None else ("trace", "import")) as stages:
                w = trace_zoo_step(zoo, preset, stages)
                if out is not None:
                    stages.stage("write", str(out))
                    save_graph(w.graph, out)
        if out is not None:
            console.print(f"wrote [bold]{out}[/] ({len(w.graph)} nodes)")
        print_graph_info(summarize(w.graph), console, title=step_title(w.meta))
        from commsched.report.capacity import step_warnings

        warn(step_warnings(w.meta, None, None))

"""``commsched trace``: trace a zoo workload (Llama 3 / Mixtral at any world size) into a graph JSON file."""

from __future__ import annotations

from pathlib import Path

import typer

from commsched.cli.common import (
    LayersOption,
    ModeOption,
    ParallelOption,
    Stages,
    WorldSizeOption,
    console,
    user_errors,
    warn,
)


def register(app: typer.Typer) -> None:
    @app.command()
    def trace(
        preset: str = typer.Argument(None, help="model preset (see --list), e.g. llama3-8b"),
        parallel: ParallelOption = "fsdp",
        world_size: WorldSizeOption = 8,
        layers: LayersOption = None,
        mode: ModeOption = "train",
        seq_len: int = typer.Option(None, "--seq-len", help="sequence length (decode: KV positions attended)"),
        batch: int = typer.Option(None, "--batch", help="sequences per data-parallel replica"),
        dtype: str = typer.Option("bfloat16", "--dtype", help="compute dtype: bfloat16, float16, float32"),
        tp_size: int = typer.Option(None, "--tp-size", help="tensor-parallel degree (tp*, fsdp+tp*)"),
        ep_size: int = typer.Option(None, "--ep-size", help="expert-parallel degree (ep)"),
        kv_len: int = typer.Option(None, "--kv-len", help="KV-cache capacity (prefill / decode)"),
        fsdp_bucket: str = typer.Option("param", "--fsdp-bucket", help="param: one collective per parameter; block"),
        out: Path = typer.Option(None, "--out", "-o", help="write the graph JSON here"),
        list_: bool = typer.Option(False, "--list", help="list presets, parallelisms and modes, then exit"),
    ) -> None:
        """Trace one step of a built-in workload on fake tensors (no GPU) and print what its graph holds.

        Example: commsched trace llama3-8b --parallel fsdp --world-size 64 --layers 4 -o graph.json
        """
        from commsched.report.terminal_inputs import print_graph_info, print_zoo_list

        if list_:
            from commsched.workloads import MODES, PARALLELISMS, PRESETS
            from commsched.workloads.mesh import INFERENCE_PARALLELISMS

            print_zoo_list(PRESETS.values(), PARALLELISMS, MODES, console, inference=INFERENCE_PARALLELISMS)
            return
        from commsched.frontends.json_io import save_graph
        from commsched.report.summary import summarize
        from commsched.workloads import resolve, trace_spec

        with user_errors():
            if preset is None:
                raise ValueError("give a PRESET (e.g. llama3-8b) or --list")
            options = {"kv_len": kv_len, "tp_size": tp_size, "ep_size": ep_size}
            spec = resolve(
                preset,
                parallel=parallel,
                world_size=world_size,
                layers=layers,
                seq_len=seq_len,
                batch=batch,
                dtype=dtype,
                mode=mode,
                fsdp_bucket=fsdp_bucket,
                **{k: v for k, v in options.items() if v is not None},
            )
            with Stages(("trace", "import", "write") if out is not None else ("trace", "import")) as stages:
                stages.stage("trace", f"{preset} / {parallel} / {mode} at world {world_size}")
                w = trace_spec(spec, progress=lambda msg: _trace_progress(stages, msg))
                if out is not None:
                    stages.stage("write", str(out))
                    save_graph(w.graph, out)
        if out is not None:
            console.print(f"wrote [bold]{out}[/] ({len(w.graph)} nodes)")
        print_graph_info(summarize(w.graph), console, title=w.meta["workload"])
        from commsched.report.capacity import step_warnings

        warn(step_warnings(w.meta, None, None))


def _trace_progress(stages: Stages, message: str) -> None:
    """``trace_spec``'s phase messages as stages: "importing ..." begins the import, the rest detail the trace."""
    if message.startswith("importing"):
        stages.stage("import", message.removeprefix("importing ").strip())
    else:
        stages.detail(message.removeprefix("tracing: "))

"""``commsched trace``: trace a zoo workload (Llama 3 / Mixtral at any world size) into a graph JSON file."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.table import Table

from commsched.cli.common import LayersOption, ModeOption, ParallelOption, WorldSizeOption, console, user_errors


def print_zoo_list() -> None:
    from commsched.workloads import MODES, PARALLELISMS, PRESETS
    from commsched.workloads.mesh import INFERENCE_PARALLELISMS

    presets = Table(title="presets", show_edge=False)
    for col in ("name", "params", "layers", "dim", "heads/kv", "ffn", "vocab", "experts"):
        presets.add_column(col, justify="left" if col == "name" else "right", no_wrap=True)
    for p in PRESETS.values():
        n = p.total_params()
        presets.add_row(
            p.name,
            f"{n / 1e9:.1f}B" if n >= 1e8 else f"{n / 1e6:.1f}M",
            str(p.n_layers),
            str(p.dim),
            f"{p.n_heads}/{p.n_kv_heads}",
            str(p.ffn_dim),
            str(p.vocab_size),
            f"{p.n_experts}, top {p.top_k}" if p.is_moe else "-",
        )
    console.print(presets)
    par = Table(title="parallelisms (--parallel)", show_edge=False)
    par.add_column("name")
    par.add_column("modes")
    par.add_column("what")
    for name, what in PARALLELISMS.items():
        modes = ", ".join(MODES) if name in INFERENCE_PARALLELISMS else "train"
        par.add_row(name, modes, what)
    console.print(par)
    modes = Table(title="modes (--mode)", show_edge=False)
    modes.add_column("name")
    modes.add_column("what")
    for name, what in MODES.items():
        modes.add_row(name, what)
    console.print(modes)


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
        if list_:
            print_zoo_list()
            return
        from commsched.cli.info import print_graph_info
        from commsched.frontends.json_io import save_graph
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
            with console.status(f"tracing {preset} / {parallel} / {mode} at world {world_size}") as status:
                w = trace_spec(spec, progress=lambda msg: status.update(msg))
            if out is not None:
                save_graph(w.graph, out)
        if out is not None:
            console.print(f"wrote [bold]{out}[/] ({len(w.graph)} nodes)")
        print_graph_info(w.graph, title=w.meta["workload"])

"""``commsched demo``: the end-to-end job on the default built-in workload."""

from __future__ import annotations

from pathlib import Path

import typer

from commsched.cli.common import console, user_errors


def _small_fsdp_graph(world_size: int, layers: int):
    """A small FSDP-style MLP step (params all-gathered, grads reduce-scattered), traced on fake tensors."""
    import torch
    import torch.distributed._functional_collectives as fc
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from commsched.frontends.fake_pg import fake_process_group
    from commsched.frontends.fx import from_fx

    dim, tokens = 1024, 4096
    with fake_process_group(world_size) as pg:

        def step(x, *shards):
            params = [fc.all_gather_tensor(s, 0, pg).view(dim, dim) for s in shards]
            h = x
            for w in params:
                h = torch.relu(h @ w.t())
            loss = h.float().pow(2).mean()
            grads = torch.autograd.grad(loss, params)
            return [fc.reduce_scatter_tensor(g.reshape(-1), "sum", 0, pg) for g in grads]

        with FakeTensorMode():
            x = torch.randn(tokens, dim, dtype=torch.bfloat16)
            shards = [
                torch.randn(dim * dim // world_size, dtype=torch.bfloat16, requires_grad=True) for _ in range(layers)
            ]
            gm = make_fx(step)(x, *shards)
        return from_fx(gm, meta={"workload": f"small-fsdp-mlp/{layers} layers", "world_size": world_size})


def register(app: typer.Typer) -> None:
    @app.command()
    def demo(
        out_dir: Path = typer.Option(Path("demo_out"), "--out-dir", help="where the demo writes its files"),
        world_size: int = typer.Option(64, help="ranks of the fake process group"),
    ) -> None:
        """Trace the default workload, write its graph JSON and print what it holds."""
        from commsched.cli.info import print_graph_info
        from commsched.frontends.json_io import save_graph

        with user_errors():
            with console.status("tracing the default workload on fake tensors"):
                g = _small_fsdp_graph(world_size, layers=4)
            path = out_dir / "graph.json"
            save_graph(g, path)
        console.print(f"wrote [bold]{path}[/] ({len(g)} nodes)")
        print_graph_info(g, title=g.meta.get("workload", "graph"))

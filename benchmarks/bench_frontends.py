"""Throughput of the FX frontend (from_fx) and of the JSON loader, in nodes per second.

Usage: python benchmarks/bench_frontends.py [--layers 400]
The graph is a traced FSDP-style joint forward+backward MLP step (make_fx over fake tensors, fake process group).
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def best_of(fn, repeat: int = 3) -> float:
    times = []
    for _ in range(repeat):
        t0 = time.perf_counter()
        fn()
        times.append(time.perf_counter() - t0)
    return min(times)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=400)
    args = ap.parse_args()
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from commsched.frontends.fake_pg import fake_process_group
    from commsched.frontends.fx import from_fx
    from commsched.frontends.json_io import load_graph, save_graph
    from programs import fsdp_mlp_step

    world, dim = 8, 256
    with fake_process_group(world) as pg:
        t0 = time.perf_counter()
        with FakeTensorMode():
            x = torch.randn(128, dim)
            shards = [torch.randn(dim * dim // world, requires_grad=True) for _ in range(args.layers)]
            gm = make_fx(lambda x, *s: fsdp_mlp_step(x, *s, pg=pg, layers_dim=dim))(x, *shards)
        trace_s = time.perf_counter() - t0
        g = from_fx(gm)
        fx_s = best_of(lambda: from_fx(gm))
    n = len(g)
    with tempfile.TemporaryDirectory() as d:
        path = Path(d) / "g.json"
        save_s = best_of(lambda: save_graph(g, path))
        load_s = best_of(lambda: load_graph(path))
        size = path.stat().st_size
    print(f"graph: {n} nodes ({args.layers} layers), make_fx trace {trace_s:.2f} s, JSON {size / 1e6:.1f} MB")
    print(f"from_fx   {fx_s * 1e3:8.1f} ms  {n / fx_s:>10,.0f} nodes/s")
    print(f"save_graph{save_s * 1e3:8.1f} ms  {n / save_s:>10,.0f} nodes/s")
    print(f"load_graph{load_s * 1e3:8.1f} ms  {n / load_s:>10,.0f} nodes/s")


if __name__ == "__main__":
    main()

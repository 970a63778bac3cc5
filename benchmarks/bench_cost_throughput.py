"""Throughput of ``commsched.estimate`` in nodes per second: first call on a graph, repeats, another profile.

Usage: python benchmarks/bench_cost_throughput.py [--layers 100] [--copies 520]
The graph is a traced FSDP-style joint forward+backward MLP step (make_fx over fake tensors, fake process group,
world 16), tiled ``--copies`` times into one graph of independent steps (the way a long program repeats its layers),
to reach about a million nodes.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def tile(g, copies: int):
    """``copies`` disjoint copies of ``g`` as one graph (ids, buffers and storages offset per copy)."""
    from commsched.ir import Graph

    n, ns = len(g), g.num_storages

    def csr(ptr, idx, offset_per_copy):
        sizes = np.tile(np.diff(ptr), copies)
        new_ptr = np.zeros(n * copies + 1, np.int32)
        np.cumsum(sizes, out=new_ptr[1:])
        new_idx = np.concatenate([idx + k * offset_per_copy for k in range(copies)]).astype(np.int32)
        return new_ptr, new_idx

    in_ptr, in_idx = csr(g.in_ptr, g.in_idx, n)
    dep_ptr, dep_idx = csr(g.dep_ptr, g.dep_idx, n)
    buf_ptr = np.zeros(n * copies + 1, np.int32)
    np.cumsum(np.tile(np.diff(g.buf_ptr), copies), out=buf_ptr[1:])
    wait_of = np.concatenate([np.where(g.wait_of >= 0, g.wait_of + k * n, -1) for k in range(copies)])
    reduce_op = {i + k * n: op for k in range(copies) for i, op in g.coll_reduce_op.items()}
    return Graph(
        names=[f"{name}_c{k}" for k in range(copies) for name in g.names],
        targets=g.targets * copies,
        kinds=np.tile(g.kinds, copies),
        in_ptr=in_ptr, in_idx=in_idx, dep_ptr=dep_ptr, dep_idx=dep_idx,
        flops=np.tile(g.flops, copies),
        buf_ptr=buf_ptr,
        buf_shape=g.buf_shape * copies,
        buf_dtype=g.buf_dtype * copies,
        buf_nbytes=np.tile(g.buf_nbytes, copies),
        buf_storage=np.concatenate([g.buf_storage + k * ns for k in range(copies)]),
        storage_nbytes=np.tile(g.storage_nbytes, copies),
        storage_owner=np.concatenate([g.storage_owner + k * n for k in range(copies)]),
        side_effect=np.tile(g.side_effect, copies),
        coll_type=np.tile(g.coll_type, copies),
        coll_group=np.tile(g.coll_group, copies),
        coll_reduce_op=reduce_op,
        coll_in_bytes=np.tile(g.coll_in_bytes, copies),
        coll_out_bytes=np.tile(g.coll_out_bytes, copies),
        coll_sync=np.tile(g.coll_sync, copies),
        wait_of=wait_of,
        groups=g.groups,
        meta=dict(g.meta),
    )  # fmt: skip


def timed(fn):
    t0 = time.perf_counter()
    out = fn()
    return out, time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=100)
    ap.add_argument("--copies", type=int, default=520)
    args = ap.parse_args()
    import commsched
    from commsched import hardware
    from programs import trace_program

    _, step = trace_program("fsdp_mlp", 16, layers=args.layers, dim=256)
    g = tile(step, args.copies)
    g.validate()
    n = len(g)
    h100 = hardware.get("h100-sxm", num_nodes=2)
    a100 = hardware.get("a100-sxm-80g", num_nodes=2)
    print(f"graph: {len(step)} nodes x {args.copies} copies = {n:,} nodes ({len(g.collectives):,} collectives)")
    rows = []
    _, t_small = timed(lambda: commsched.estimate(step, h100))
    rows.append(("first call, one step", len(step), t_small))
    _, t_first = timed(lambda: commsched.estimate(g, h100))
    rows.append(("first call (analysis + fusion regions + costs)", n, t_first))
    repeats = [timed(lambda: commsched.estimate(g, h100))[1] for _ in range(3)]
    rows.append(("repeat, same profile (best of 3)", n, min(repeats)))
    other = [timed(lambda: commsched.estimate(g, a100))[1] for _ in range(3)]
    rows.append(("repeat, another profile (best of 3)", n, min(other)))
    costs = [timed(lambda: commsched.estimate_costs(g, h100, fusion=False))[1] for _ in range(3)]
    rows.append(("repeat, fusion off (best of 3)", n, min(costs)))
    print("\n| call | nodes | time | nodes/s |\n|---|---|---|---|")
    for name, nodes, t in rows:
        print(f"| {name} | {nodes:,} | {t * 1e3:.1f} ms | {nodes / t:,.0f} |")


if __name__ == "__main__":
    main()

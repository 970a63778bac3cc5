"""Simulator speed on a ~100k-node step (goal: < 0.5 s per simulate), plus the pieces it is made of.

Usage: python benchmarks/bench_sim.py [--layers 200] [--copies 27]
The graph is a traced FSDP-style joint forward+backward MLP step (make_fx over fake tensors, fake process group,
world 64; the default workload of ``commsched demo``) of ``--layers`` layers, repeated ``--copies`` times back to
back (each copy a further step's worth of layers, chained by an ordering edge) to reach ~100k nodes without
tracing for minutes. Costs: a fixed formula (kernels at 400 TFLOP/s or 2 TB/s, collectives at 40 GB/s + 10 us on
the inter-node link), enough to exercise the simulator; it does not depend on the cost model.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def best_of(fn, repeat: int = 3) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def tile_graph(g, copies: int):
    """``copies`` copies of ``g`` back to back: fresh inputs and storages per copy, the first node of each copy after
    its inputs ordered after the last node of the previous copy; one OUTPUT at the end reading every copy's outputs."""
    from commsched.ir import GraphBuilder, OpKind

    b = GraphBuilder(dict(g.meta, tiled=copies))
    for grp in g.groups:
        b.group(grp.name, grp.size, grp.stride)
    out_node = int(np.flatnonzero(g.kinds == OpKind.OUTPUT)[-1])
    outputs: list[int] = []
    prev_last = -1
    owner = g.storage_owner.tolist()
    for k in range(copies):
        ids: dict[int, int] = {}
        storage: dict[int, int] = {}
        first = True
        for i in range(len(g)):
            if i == out_node:
                outputs.extend(ids[j] for j in g.inputs(i).tolist())
                continue
            nid = len(b)
            bufs = []
            for buf in g.buffers(i):
                if buf.storage not in storage:
                    size = int(g.storage_nbytes[buf.storage])
                    storage[buf.storage] = b.new_storage(
                        size, nid if owner[buf.storage] == i else ids[owner[buf.storage]]
                    )
                bufs.append((buf.shape, buf.dtype, buf.nbytes, storage[buf.storage]))
            deps = [ids[d] for d in g.deps(i).tolist()]
            if first and g.kinds[i] != OpKind.INPUT and prev_last >= 0:
                deps.append(prev_last)
                first = False
            ids[i] = b.add_node(
                f"{g.names[i]}__{k}", g.targets[i], OpKind(int(g.kinds[i])), [ids[j] for j in g.inputs(i).tolist()],
                buffers=bufs, flops=float(g.flops[i]), side_effect=bool(g.side_effect[i]), deps=deps,
            )  # fmt: skip
            if g.coll_type[i] >= 0:
                c = g.collective(i)
                b.set_collective(ids[i], c.type, c.group, c.reduce_op, c.in_bytes, c.out_bytes, c.sync)
            if g.wait_of[i] >= 0:
                b.set_wait(ids[i], ids[int(g.wait_of[i])])
        prev_last = len(b) - 1
    b.add_node("output", "output", OpKind.OUTPUT, outputs, side_effect=True)
    return b.build()


def formula_costs(g, slowdown: float, sync_s: float):
    from commsched.cost import CostEstimate, LinkClass
    from commsched.ir import OpKind

    is_coll = g.coll_type >= 0
    node_s = (
        np.where(g.kinds == OpKind.COMPUTE, g.flops / 4e14 + 2e-6, 0)
        + np.where(g.kinds == OpKind.OTHER, (g.in_bytes + g.out_bytes) / 2e12 + 1e-6, 0)
        + np.where(is_coll, g.comm_bytes / 4e10 + 10e-6, 0)
    )
    link = np.where(is_coll, int(LinkClass.INTER_NODE), -1).astype(np.int8)
    lat = np.where(is_coll, 10e-6, 0.0)
    return CostEstimate(node_s, lat, link, compute_slowdown=slowdown, stream_sync_s=sync_s)


def sink_waits_order(g) -> np.ndarray:
    """Waits as late as possible: the most overlap, so the most time-slicing work for the simulator."""
    from commsched.ir.transform import topological_order

    return topological_order(g, (g.wait_of >= 0).astype(np.int64))


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=200)
    ap.add_argument("--copies", type=int, default=27)
    args = ap.parse_args()
    from commsched.memory import memory_profile
    from commsched.sim import simulate_costs
    from commsched.sim.bounds import critical_path_ns

    sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))
    from programs import trace_program  # a traced FSDP-style MLP step (tests/programs.py)

    t0 = time.perf_counter()
    _, base = trace_program("fsdp_mlp", 64, layers=args.layers, dim=1024)
    t_trace = time.perf_counter() - t0
    t0 = time.perf_counter()
    g = tile_graph(base, args.copies)
    t_tile = time.perf_counter() - t0
    print(f"graph: {len(g):,} nodes ({len(base):,} traced x {args.copies}), {len(g.collectives):,} collectives; "
          f"trace {t_trace:.1f} s, tile {t_tile:.1f} s")  # fmt: skip
    orders = {"graph order": np.arange(len(g)), "waits sunk": sink_waits_order(g)}
    rows = []
    for order_name, order in orders.items():
        for slowdown, sync_s in ((1.0, 0.0), (1.15, 2e-6)):
            costs = formula_costs(g, slowdown, sync_s)
            t0 = time.perf_counter()
            simulate_costs(g, costs, order)  # the first call also computes the lower bound (cached per costs)
            t_first = time.perf_counter() - t0
            t, res = best_of(lambda costs=costs, order=order: simulate_costs(g, costs, order))
            te, _ = best_of(lambda costs=costs, order=order: simulate_costs(g, costs, order, engine="events"), 1)
            rows.append((order_name, slowdown, sync_s, t_first, t, te, res))
    t_mem, _ = best_of(lambda: memory_profile(g, orders["waits sunk"]))
    dur = np.rint(formula_costs(g, 1.0, 0.0).node_s * 1e9).astype(np.int64)
    t_cp, _ = best_of(lambda: critical_path_ns(g, dur))
    print("| order | slowdown | sync | first call | simulate_costs | event loop | makespan | overlap | exposed comm |")
    print("|---|---|---|---|---|---|---|---|---|")
    for order_name, slowdown, sync_s, t_first, t, te, res in rows:
        cells = [
            order_name,
            slowdown,
            f"{sync_s * 1e6:.0f} us",
            f"{t_first * 1e3:.0f} ms",
            f"{t * 1e3:.0f} ms",
            f"{te * 1e3:.0f} ms",
        ]
        cells += [
            f"{res.makespan_s * 1e3:.2f} ms",
            f"{100 * res.overlap_ratio:.1f} %",
            f"{res.exposed_comm_s * 1e3:.2f} ms",
        ]
        print("| " + " | ".join(str(c) for c in cells) + " |")
    print(f"pieces: memory_profile {t_mem * 1e3:.0f} ms, critical path {t_cp * 1e3:.0f} ms")


if __name__ == "__main__":
    main()

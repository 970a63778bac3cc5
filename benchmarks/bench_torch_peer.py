"""Wall time of torch's OverlapScheduler (the peer) on traced graphs of growing size, with our costs injected.

Usage: PYTHONPATH=src python benchmarks/bench_torch_peer.py [--layers 53 525 2630] [--repeat 3] [--bucket]
                                                          [--workload llama3-8b --workload-layers 4 32]
Graphs: tests/programs.py's FSDP MLP joint forward+backward step (make_fx over fake tensors, world 8, ~19 nodes per
layer), and, when ``commsched.workloads`` exists, a workload-zoo model (FSDP). Costs: tests/costs_helper.simple_costs
(the scheduler's speed does not depend on the numbers' accuracy). Reports the best of ``--repeat`` runs of the time
inside ``schedule_overlap_bucketing`` (harness deep copy, patching and order mapping excluded), split into FSDP
pre-bucketing (``--bucket`` only), ``OverlapScheduler.__init__`` (estimates, ancestor bitsets, baseline memory) and
``run`` (scheduling + finalise, which buckets with ``--bucket``). "collectives" counts those torch scheduled (after
pre-bucketing).
"""

from __future__ import annotations

import argparse
import platform
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def _fsdp(layers: int, dim: int):
    from programs import trace_program

    return f"fsdp_mlp L={layers} d={dim}", *trace_program("fsdp_mlp", 8, layers=layers, dim=dim)


def _workload(name: str, layers: int):
    from commsched import workloads  # lands with the workload zoo
    from commsched.frontends.fx import from_fx

    built = workloads.build(name, parallel="fsdp", world_size=8, layers=layers)
    gm = getattr(built, "gm", built[0] if isinstance(built, tuple) else built)
    graph = getattr(built, "graph", None) or from_fx(gm)
    return f"{name} fsdp L={layers}", gm, graph


def bench(label: str, gm, graph, repeat: int, bucket: bool) -> dict:
    from commsched.peers import run_torch_overlap_scheduler
    from costs_helper import simple_costs

    costs = simple_costs(graph)
    best = None
    for _ in range(repeat):
        r = run_torch_overlap_scheduler(gm, graph, costs, bucket=bucket)
        if best is None or r.wall_s < best.wall_s:
            best = r
    t = best.stats["time_s"]
    row = {
        "graph": label,
        "nodes": len(graph),
        "collectives": best.stats["num_collectives"],
        "compute": best.stats["num_compute_nodes"],
        "wall_s": best.wall_s,
        "init_s": t["init"],
        "run_s": t["run"],
        "prebucket_s": t["prebucket"],
        "valid": best.valid,
    }
    print(
        f"| {label} | {row['nodes']:,} | {row['collectives']} | {row['compute']} | {row['wall_s']:.3f} s "
        f"| {row['prebucket_s']:.3f} s | {row['init_s']:.3f} s | {row['run_s']:.3f} s "
        f"| {row['nodes'] / row['wall_s']:,.0f} | {row['valid']} |",
        flush=True,
    )
    return row


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("--layers", type=int, nargs="*", default=[53, 525, 2630], help="fsdp_mlp layer counts")
    ap.add_argument("--dim", type=int, default=256)
    ap.add_argument("--workload", default="llama3-8b", help="commsched.workloads model, if the zoo exists")
    ap.add_argument("--workload-layers", type=int, nargs="*", default=[4, 32])
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bucket", action="store_true", help="torch's collective bucketing on")
    args = ap.parse_args()
    import torch

    print(f"# {platform.node()} {platform.machine()}, python {platform.python_version()}, torch {torch.__version__}")
    print(
        "| graph | nodes | collectives | compute nodes | torch wall | pre-bucket | __init__ | run | nodes/s | valid |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|")
    for layers in args.layers:
        t0 = time.perf_counter()
        label, gm, graph = _fsdp(layers, args.dim)
        print(f"<!-- traced {label} in {time.perf_counter() - t0:.1f} s -->", flush=True)
        bench(label, gm, graph, args.repeat, args.bucket)
        del gm, graph
    try:
        import commsched.workloads  # noqa: F401
    except ImportError:
        print(f"<!-- commsched.workloads not available: {args.workload} skipped -->")
        return
    for layers in args.workload_layers:
        label, gm, graph = _workload(args.workload, layers)
        bench(label, gm, graph, args.repeat, args.bucket)


if __name__ == "__main__":
    main()

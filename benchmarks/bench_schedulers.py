"""Schedulers side by side on traced zoo workloads, and the flagship's wall-time scaling.

Usage: python benchmarks/bench_schedulers.py [--quick] [--scaling]
Every order is simulated by commsched's simulator with commsched's cost model (h100-sxm profile, nodes = world / 8);
torch's OverlapScheduler gets the same per-node costs (commsched.peers), so the rows compare schedulers.
Prints markdown tables for benchmarks/RESULTS.md.
"""

from __future__ import annotations

import argparse
import gc
import time

CONFIGS = [  # (preset, parallel, world, layers, seq_len or None for the preset's)
    ("llama3-8b", "fsdp", 8, 8, None),
    ("llama3-8b", "fsdp", 8, 32, None),
    ("llama3-8b", "fsdp+tp", 64, 8, None),
    ("llama3-8b", "fsdp", 256, 8, None),
    ("llama3-8b", "fsdp", 512, 8, None),
    ("llama3-8b", "fsdp", 512, 8, 1024),  # communication-bound: little compute per gathered byte
]


def fmt_ms(s):
    return "-" if s is None else f"{s * 1e3:.2f}"


def compare_table(configs) -> None:
    from commsched.cost import estimate_costs
    from commsched.experiments.compare import compare_schedulers
    from commsched.hardware import get
    from commsched.workloads import build

    for preset, parallel, world, layers, seq_len in configs:
        t0 = time.perf_counter()
        w = build(preset, parallel=parallel, world_size=world, layers=layers, seq_len=seq_len)
        trace_s = time.perf_counter() - t0
        nodes = max(1, world // 8)
        costs = estimate_costs(w.graph, get("h100-sxm", num_nodes=nodes))
        res = compare_schedulers(w.graph, costs, gm=w.graph_module, exact_max_nodes=0)
        base = res.row("input order")
        print(
            f"\n### {preset} / {parallel} / world {world} / {layers} layers"
            f"{'' if seq_len is None else f' / seq {seq_len}'} — {len(w.graph)} nodes, "
            f"h100-sxm x {nodes} nodes (trace {trace_s:.1f} s)\n"
        )
        print(
            f"lower bound {fmt_ms(res.lower_bound_s)} ms ({res.bound_binding}); input peak "
            f"{base.peak_memory_bytes / 2**30:.2f} GiB\n"
        )
        print("| scheduler | step (ms) | vs bound | exposed comm (ms) | overlap | peak (GiB) | wall (s) |")
        print("|---|---|---|---|---|---|---|")
        for r in res.rows:
            if r.makespan_s is None:
                print(f"| {r.scheduler} | - | - | - | - | - | {r.note} |")
                continue
            print(
                f"| {r.scheduler} | {fmt_ms(r.makespan_s)} | +{r.gap_to_bound * 100:.1f} % | "
                f"{fmt_ms(r.exposed_comm_s)} | {r.overlap_ratio:.2f} | {r.peak_memory_bytes / 2**30:.2f} | "
                f"{'-' if r.wall_s is None else f'{r.wall_s:.3f}'} |"
            )
        torch_row, ours, ours_r, ours_t = (
            res.row("torch OverlapScheduler"),
            res.row("overlap (ours)"),
            res.row("overlap (ours, reorder_collectives)"),
            res.row("overlap (ours, reorder, torch's peak as budget)"),
        )
        if torch_row.makespan_s:
            print(
                f"\nours / torch: step {ours.makespan_s / torch_row.makespan_s:.3f} (strict order), "
                f"{ours_r.makespan_s / torch_row.makespan_s:.3f} (reordering), "
                f"{ours_t.makespan_s / torch_row.makespan_s:.3f} (reordering at torch's peak); peak "
                f"{ours.peak_memory_bytes / torch_row.peak_memory_bytes:.3f} / "
                f"{ours_r.peak_memory_bytes / torch_row.peak_memory_bytes:.3f} / "
                f"{ours_t.peak_memory_bytes / torch_row.peak_memory_bytes:.3f}; wall "
                f"{torch_row.wall_s / max(ours.wall_s, 1e-9):.0f}x / "
                f"{torch_row.wall_s / max(ours_r.wall_s, 1e-9):.0f}x "
                "faster than torch"
            )


def scaling(layer_counts) -> None:
    from commsched.cost import estimate_costs
    from commsched.hardware import get
    from commsched.passes import schedule
    from commsched.workloads import build

    print("\n| layers | nodes | overlap CPU (s) | ratio to previous | overlap reorder CPU (s) | ratio |")
    print("|---|---|---|---|---|---|")
    prev = prev_r = None
    for layers in layer_counts:
        g = build("llama3-8b", parallel="fsdp", world_size=8, layers=layers).graph
        costs = estimate_costs(g, get("h100-sxm"))
        walls = []
        for knobs in ({}, {"reorder_collectives": True}):
            best = float("inf")
            for _ in range(5):
                gc.collect()
                t0 = time.process_time()  # CPU time of this process: steady on a shared machine
                schedule(g, costs, "default", **knobs)
                best = min(best, time.process_time() - t0)
            walls.append(best)
        r1 = f"{walls[0] / prev:.2f}x" if prev else "-"
        r2 = f"{walls[1] / prev_r:.2f}x" if prev_r else "-"
        print(f"| {layers} | {len(g)} | {walls[0]:.3f} | {r1} | {walls[1]:.3f} | {r2} |")
        prev, prev_r = walls


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="only the first configuration")
    ap.add_argument("--scaling", action="store_true", help="also the wall-time scaling (traces up to 256 layers)")
    ap.add_argument("--only-scaling", action="store_true", help="skip the comparison tables")
    ap.add_argument("--layers", type=int, nargs="*", default=[32, 64, 128, 256])
    args = ap.parse_args()
    if not args.only_scaling:
        compare_table(CONFIGS[:1] if args.quick else CONFIGS)
    if args.scaling or args.only_scaling:
        scaling(args.layers)


if __name__ == "__main__":
    main()

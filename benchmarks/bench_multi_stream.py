"""Predicted step time, single stream (``overlap``) vs multi-stream (``overlap`` then ``multi_stream``), on the zoo.

Usage: PYTHONPATH=src python benchmarks/bench_multi_stream.py [--layers 4] [--repeat 3] [--alphas 1,0.5,0]
For each workload (h100-sxm, one node per 8 ranks) and each ``compute_interference`` value: the simulated makespan
of overlap's order, multi_stream's predicted makespan (simulated + contention charge), whether it was applied and
which candidate won, the streams used, the cross-stream dependencies, the peak memory change, and the wall time of
the multi_stream pass alone (best of ``--repeat``). Prints a Markdown table.
"""

from __future__ import annotations

import argparse
import time

WORKLOADS = [
    ("llama3-8b", "fsdp", 64, "train"),
    ("llama3-70b", "tp", 8, "train"),
    ("llama3-70b", "tp+sp", 8, "train"),
    ("llama3-70b", "fsdp+tp", 64, "train"),
    ("mixtral-8x7b", "ep", 8, "train"),
    ("llama3-8b", "ddp", 16, "train"),
    ("llama3-70b", "tp", 8, "decode"),
    ("llama3-70b", "tp+sp", 8, "decode"),
    ("mixtral-8x7b", "ep", 8, "decode"),
]


def run(preset: str, parallel: str, world: int, mode: str, layers: int, alphas: list[float], repeat: int) -> list:
    from commsched.cost import estimate_costs
    from commsched.hardware import get as get_hardware
    from commsched.memory import memory_profile
    from commsched.passes import schedule
    from commsched.sim import simulate_costs
    from commsched.workloads import build

    w = build(preset, parallel=parallel, world_size=world, layers=layers, mode=mode)
    g = w.graph
    costs = estimate_costs(g, get_hardware("h100-sxm", num_nodes=max(1, world // 8)))
    single = schedule(g, costs, ["overlap"])
    base = simulate_costs(g, costs, single.order)
    rows = []
    for alpha in alphas:
        walls = []
        for _ in range(repeat):
            t0 = time.perf_counter()
            s = schedule(g, costs, ["multi_stream"], order=single.order, compute_interference=alpha)
            walls.append(time.perf_counter() - t0)
        st = s.stats[-1]
        applied = s.streams is not None
        note = st.notes[-1]
        winner = note.split(":")[0].removeprefix("applied ") if applied else "-"
        best = min((r for r in st.rows if r["fits"]), key=lambda r: r["predicted_s"], default=None)
        predicted_s = best["predicted_s"] if applied else base.makespan_s
        rows.append(
            {
                "workload": f"{preset} {parallel} {mode} w{world}",
                "nodes": len(g),
                "alpha": alpha,
                "single_ms": base.makespan_s * 1e3,
                "multi_ms": predicted_s * 1e3,
                "best_tried_ms": best["predicted_s"] * 1e3 if best else float("nan"),
                "gain": 1 - predicted_s / base.makespan_s,
                "applied": applied,
                "winner": winner,
                "streams": best["streams_used"] if applied else 1,
                "cross": best["cross_stream_edges"] if applied else 0,
                "peak_ratio": memory_profile(g, s.order).peak_bytes / base.peak_memory_bytes,
                "wall_s": min(walls),
                "refused": dict(st.refused),
            }
        )
    return rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--alphas", default="1,0.5,0", help="compute_interference values, comma-separated")
    args = ap.parse_args()
    alphas = [float(a) for a in args.alphas.split(",")]
    print(
        "| workload | nodes | compute_interference | single-stream | best multi-stream candidate | applied "
        "| result | gain | winning candidate | streams | cross-stream deps | peak vs single | pass wall |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|---|---|")
    for preset, parallel, world, mode in WORKLOADS:
        for r in run(preset, parallel, world, mode, args.layers, alphas, args.repeat):
            assert r["multi_ms"] <= r["single_ms"] * (1 + 1e-12), r  # the acceptance criterion
            print(
                f"| {r['workload']} | {r['nodes']:,} | {r['alpha']:g} | {r['single_ms']:.3f} ms | "
                f"{r['best_tried_ms']:.3f} ms | {'yes' if r['applied'] else 'no'} | {r['multi_ms']:.3f} ms | "
                f"{r['gain'] * 100:.1f} % | "
                f"{r['winner']} | {r['streams']} | {r['cross']:,} | {r['peak_ratio']:.3f} | "
                f"{r['wall_s'] * 1e3:.0f} ms |",
                flush=True,
            )


if __name__ == "__main__":
    main()

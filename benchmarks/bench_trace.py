"""Trace time and node counts of zoo workloads (make_fx over fake tensors + from_fx), per world size and depth.

Usage: python benchmarks/bench_trace.py [--repeat 3] [--cold]
Warm times are the best of ``--repeat`` traces in one process after a warm-up trace (torch's first trace pays
for lazy imports and kernel registration); ``--cold`` also times ``commsched trace`` as a user sees it: a fresh
Python process that imports torch and traces once.
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = [
    ("llama3-8b", "fsdp", 8, 4),
    ("llama3-8b", "fsdp", 1024, 4),
    ("llama3-8b", "fsdp", 8, 32),
    ("llama3-8b", "fsdp", 1024, 32),
    ("mixtral-8x7b", "ep", 8, 4),
    ("mixtral-8x7b", "ep", 1024, 4),
    ("mixtral-8x7b", "ep", 8, 32),
    ("mixtral-8x7b", "ep", 1024, 32),
]


def warm(preset: str, parallel: str, world: int, layers: int, repeat: int) -> dict:
    from commsched.frontends.fake_pg import fake_process_group
    from commsched.frontends.fx import from_fx
    from commsched.workloads import build

    totals, imports = [], []
    with fake_process_group(world):  # kept open so that from_fx can resolve the subgroups again below
        for _ in range(repeat):
            t0 = time.perf_counter()
            w = build(preset, parallel=parallel, world_size=world, layers=layers)
            totals.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            from_fx(w.graph_module)
            imports.append(time.perf_counter() - t0)
    return {"total_s": min(totals), "from_fx_s": min(imports), "fx_nodes": len(w.graph_module.graph.nodes), "w": w}


def cold(preset: str, parallel: str, world: int, layers: int) -> float:
    src = Path(__file__).resolve().parents[1] / "src"
    code = (
        f"import sys; sys.path.insert(0, {str(src)!r}); from commsched.workloads import build; "
        f"build({preset!r}, parallel={parallel!r}, world_size={world}, layers={layers})"
    )
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - t0


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="also time a fresh process per configuration")
    args = ap.parse_args()
    from commsched.workloads import build

    build("llama-tiny", parallel="fsdp", world_size=8, layers=1)  # warm-up
    print(
        "| workload | world | layers | IR nodes | collectives | trace (make_fx) | from_fx | total warm |"
        + (" cold process |" if args.cold else "")
    )
    print("|---|---|---|---|---|---|---|---|" + ("---|" if args.cold else ""))
    for preset, parallel, world, layers in CONFIGS:
        r = warm(preset, parallel, world, layers, args.repeat)
        g = r["w"].graph
        row = (
            f"| {preset} {parallel} | {world} | {layers} | {len(g):,} | {len(g.collectives):,} | "
            f"{r['total_s'] - r['from_fx_s']:.2f} s | {r['from_fx_s']:.2f} s | {r['total_s']:.2f} s |"
        )
        if args.cold:
            row += f" {cold(preset, parallel, world, layers):.2f} s |"
        print(row, flush=True)


if __name__ == "__main__":
    main()

"""Collective cost estimates per second: ``plan_collective`` one size at a time (uncached: every size new) against
``collective_times_s`` vectorised over sizes for one group (what a bucket-plan search asks), same numbers bit for bit.

Usage: python benchmarks/bench_collective_throughput.py [--sizes 1000000]
"""

from __future__ import annotations

import argparse
import time

import numpy as np

from commsched import hardware
from commsched.cost.collectives import _plan_cached, collective_times_s, plan_collective

GROUPS = [("all_reduce", 8), ("all_gather", 64), ("reduce_scatter", 512), ("all_to_all", 64), ("all_reduce", 1024)]


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--sizes", type=int, default=1_000_000)
    args = ap.parse_args()
    hw = hardware.get("h100-sxm", num_nodes=128)
    sizes = np.random.default_rng(0).integers(1 << 10, 1 << 34, args.sizes)
    print("| group | scalar (estimates/s) | vectorised (estimates/s) | ratio |")
    print("|---|---|---|---|")
    for kind, n in GROUPS:
        few = sizes[:20_000].tolist()
        _plan_cached.cache_clear()
        t0 = time.perf_counter()
        scalar = [plan_collective(kind, s, n, hw).time_s for s in few]
        scalar_rate = len(few) / (time.perf_counter() - t0)
        t0 = time.perf_counter()
        vec = collective_times_s(kind, sizes, n, hw)
        vec_rate = len(sizes) / (time.perf_counter() - t0)
        assert vec[: len(few)].tolist() == scalar  # the same numbers
        print(f"| {kind} x {n} | {scalar_rate:,.0f} | {vec_rate:,.0f} | {vec_rate / scalar_rate:.0f}x |")


if __name__ == "__main__":
    main()

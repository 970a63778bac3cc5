"""Wall time of a what-if sweep with 1 and with 2 worker processes, and where the time goes.

Usage: python benchmarks/bench_sweep.py [--preset llama3-8b] [--parallel fsdp] [--world-sizes 8,64,512]
       [--hardware h100-sxm,b200] [--layers 4] [--jobs 1,2] [--repeat 1]
Two measurements per job count: (1) ``commsched sweep`` as a fresh process, end to end (what a user waits for:
imports, torch's warm-up, tracing, estimating, scheduling, simulating, the table); (2) ``run_sweep`` called in this
process after a warm-up trace (what a library caller that already traced something waits for; spawned workers
still start cold). Prints wall times, the per-stage sums over configurations, and the sweep's rows.
"""

from __future__ import annotations

import argparse
import os
import platform
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--preset", default="llama3-8b")
    ap.add_argument("--parallel", default="fsdp")
    ap.add_argument("--world-sizes", default="8,64,512")
    ap.add_argument("--hardware", default="h100-sxm,b200")
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--jobs", default="1,2")
    ap.add_argument("--repeat", type=int, default=1)
    ap.add_argument("--no-cli", action="store_true", help="skip the fresh-process CLI runs")
    args = ap.parse_args()

    from commsched.experiments.sweep import run_sweep
    from commsched.workloads import build

    worlds = [int(w) for w in args.world_sizes.split(",")]
    profiles = args.hardware.split(",")
    parallels = args.parallel.split(",")
    kw = {"parallel": parallels, "world_sizes": worlds, "hardware": profiles, "layers": args.layers}
    print(
        f"machine: {platform.processor() or platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}"
    )
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"sweep: {args.preset} {args.parallel} world {worlds} x {profiles}, {args.layers} layers (load {load:.1f})")
    job_counts = [int(j) for j in args.jobs.split(",")]
    root = Path(__file__).resolve().parents[1]
    env = {**os.environ, "PYTHONPATH": str(root / "src")}
    cli = [sys.executable, "-m", "commsched.cli", "sweep", args.preset, "-p", args.parallel, "-w", args.world_sizes]
    cli += ["-H", args.hardware, "-l", str(args.layers)]
    for jobs in [] if args.no_cli else job_counts:
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            out = subprocess.run([*cli, "-j", str(jobs)], env=env, capture_output=True, text=True, check=True)
            wall = time.perf_counter() - t0
            summary = [line for line in out.stdout.splitlines() if "configurations in" in line]
            print(f"cli jobs={jobs}: {wall:.2f} s wall ({summary[-1].strip() if summary else '?'})")

    build("llama-tiny", parallel="fsdp", world_size=8, layers=1)  # import torch and warm make_fx in this process
    last = None
    for jobs in job_counts:
        for _ in range(args.repeat):
            t0 = time.perf_counter()
            rows = run_sweep(args.preset, processes=jobs, **kw)
            wall = time.perf_counter() - t0
            traces = {(r.parallel, r.world_size): r.trace_wall_s for r in rows}
            stages = {
                "trace": sum(traces.values()),
                "estimate": sum(r.estimate_wall_s for r in rows if r.ok),
                "schedule": sum(r.schedule_wall_s for r in rows if r.ok),
                "simulate": sum(r.simulate_wall_s for r in rows if r.ok),
            }
            per = ", ".join(f"{k} {v:.2f} s" for k, v in stages.items())
            failed = sum(not r.ok for r in rows)
            by_worker = len({(r.parallel, r.world_size) for r in rows if r.pid != os.getpid()})
            n = len(rows)
            print(f"run_sweep jobs={jobs}: {n} configurations ({failed} failed) in {wall:.2f} s wall; sums: {per}")
            print(f"  {by_worker} of {len(worlds) * len(parallels)} traces counted from workers")
            last = rows

    print(
        "\n| parallel | world | hardware | nodes | graph nodes | step traced | step scheduled | exposed comm | peak |"
    )
    print("|---|---|---|---|---|---|---|---|---|")
    for r in last or []:
        if not r.ok:
            print(f"| {r.parallel} | {r.world_size} | {r.hardware} | error: {r.error} |")
            continue
        print(
            f"| {r.parallel} | {r.world_size} | {r.hardware} | {r.num_nodes} | {r.num_graph_nodes} "
            f"| {r.step_time_input_s * 1e3:.1f} ms | {r.step_time_s * 1e3:.1f} ms | {r.exposed_comm_s * 1e3:.1f} ms "
            f"| {r.peak_memory_bytes / 2**30:.2f} GiB |"
        )


if __name__ == "__main__":
    main()

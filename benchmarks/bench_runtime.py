"""Real runs on the shaped harness: measured vs predicted step time of the original order, commsched's order and
torch's OverlapScheduler order, and the measured speedups.

Usage (root, iproute2): python benchmarks/bench_runtime.py [--preset llama-tiny] [--parallel fsdp] [--seq-len 256]
    [--batch 2] [--bandwidth 2gbit] [--iters 10] [--repeat 1] [--costs measured] [--compute-nice 10] [--calibrate]
    [--json out.json]

Each configuration runs ``world_size`` gloo ranks inside a fresh network namespace whose loopback is shaped with tc
tbf (``commsched.runtime.shaped_network``); the ranks calibrate the link (every distinct collective of the step),
the compute slowdown while communicating and every op, rank 0 plans and predicts, and every order runs ``iters``
times in rotation. Prints a markdown table (the figures in benchmarks/RESULTS.md) with the load average around the
run: the machine is shared, and other jobs' load slows the ranks. ``--calibrate`` first runs ``commsched calibrate
--device cpu`` into a temporary profile folder, so the ``profile`` cost source is this machine's fit of the moment.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import subprocess
import sys
import tempfile
import time

from commsched.report.run_report import RunReport

ORDERS = ("original", "overlap", "torch")


def _ms(s: float) -> str:
    return f"{s * 1e3:.1f} ms"


@dataclasses.dataclass(frozen=True)
class BenchRun:
    """One configuration's run report and the machine's state around it (the JSON adds it under ``bench``)."""

    report: RunReport
    wall_s: float
    load_before: float
    load_after: float
    bandwidth: str

    def to_dict(self) -> dict:
        bench = {k: v for k, v in dataclasses.asdict(self).items() if k != "report"}
        return {**self.report.to_dict(), "bench": bench}


def run_one(args: argparse.Namespace, seq_len: int, bandwidth: str) -> BenchRun:
    from commsched.runtime import RunConfig, run_local, shaped_network
    from commsched.workloads import resolve

    spec = resolve(
        args.preset,
        parallel=args.parallel,
        world_size=args.world_size,
        layers=args.layers,
        seq_len=seq_len,
        batch=args.batch,
        dtype="float32",
        attention="sdpa",
    )
    cfg = RunConfig(
        spec=spec,
        variants=ORDERS,
        iters=args.iters,
        warmup=args.warmup,
        costs=args.costs,
        compute_nice=args.compute_nice,
    )
    load_before = os.getloadavg()[0]
    t0 = time.perf_counter()
    with shaped_network(bandwidth) as net:
        report = run_local(cfg, network=net)
    return BenchRun(
        report=report,
        wall_s=time.perf_counter() - t0,
        load_before=load_before,
        load_after=os.getloadavg()[0],
        bandwidth=bandwidth,
    )


def table(runs: list[BenchRun]) -> str:
    lines = [
        "| config | order | predicted | measured median (p25-p75) | error | measured min | error vs min "
        "| speedup (median) | speedup (min) | predicted speedup | without comm slowdown: predicted, error, speedup "
        "| bit-identical |",
        "|---|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for run in runs:
        rep = run.report
        config = (
            f"{rep.preset} {rep.parallel} w{rep.world_size} seq {rep.seq_len}x{rep.batch}, "
            f"{run.bandwidth}, load {run.load_before:.1f}-{run.load_after:.1f}"
        )
        base = rep.variants.get("original")
        for name, v in rep.variants.items():
            m = v.measured
            plain = v.predicted.get("measured, comm unslowed")
            alt = "-"
            if plain is not None and base is not None:
                alt = (
                    f"{_ms(plain)}, {(plain / m.median_s - 1) * 100:+.1f}%, "
                    f"{base.predicted['measured, comm unslowed'] / plain:.3f}x"
                )
            lines.append(
                f"| {config} | {name} | {_ms(v.predicted[rep.costs])} | {_ms(m.median_s)} "
                f"({_ms(m.p25_s)}-{_ms(m.p75_s)}) | {v.prediction_error * 100:+.1f}% | {_ms(m.min_s)} "
                f"| {v.prediction_error_vs_min * 100:+.1f}% | {v.speedup_measured:.3f}x "
                f"| {v.speedup_measured_min:.3f}x | {v.speedup_predicted:.3f}x | {alt} | {v.bit_identical} |"
            )
            config = ""
        ours, torch_ = rep.variants.get("overlap"), rep.variants.get("torch")
        if ours and torch_:
            lines.append(
                f"| | ours vs torch | | | | | | {torch_.measured.median_s / ours.measured.median_s:.3f}x "
                f"| {torch_.measured.min_s / ours.measured.min_s:.3f}x "
                f"| {torch_.predicted[rep.costs] / ours.predicted[rep.costs]:.3f}x | | |"
            )
    return "\n".join(lines)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--preset", default="llama-tiny")
    ap.add_argument("--parallel", default="fsdp")
    ap.add_argument("--world-size", type=int, default=2)
    ap.add_argument("--layers", type=int, default=None)
    ap.add_argument("--seq-len", type=int, nargs="+", default=[256])
    ap.add_argument("--batch", type=int, default=2)
    ap.add_argument("--bandwidth", nargs="+", default=["2gbit"])
    ap.add_argument("--iters", type=int, default=10)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=1, help="runs of each configuration")
    ap.add_argument("--costs", default="measured", choices=("measured", "profile"))
    ap.add_argument("--compute-nice", type=int, default=10, help="niceness increment of compute (0: none)")
    ap.add_argument("--calibrate", action="store_true", help="calibrate cpu-local first (~30 s)")
    ap.add_argument("--json", default=None, help="write every report (all step times) here")
    args = ap.parse_args()

    profile_dir = tempfile.TemporaryDirectory(prefix="commsched-profile-")  # removed when main returns
    if args.calibrate:
        folder = profile_dir.name
        cmd = [sys.executable, "-m", "commsched.cli", "calibrate", "--device", "cpu", "-o", f"{folder}/cpu-local.toml"]
        subprocess.run(cmd, check=True)
        os.environ["COMMSCHED_PROFILE_DIR"] = folder  # the spawned ranks inherit it
    runs = []
    for _ in range(args.repeat):
        for bandwidth in args.bandwidth:
            for seq_len in args.seq_len:
                run = run_one(args, seq_len, bandwidth)
                runs.append(run)
                print(f"done: seq {seq_len}, {bandwidth}: {run.wall_s:.0f} s", flush=True)
                if run.report.teardown_error:
                    print(f"  warning: {run.report.teardown_error}", flush=True)
    print(f"\nmachine: {platform.machine()}, {os.cpu_count()} cores; costs: {args.costs}\n")
    print(table(runs))
    for run in runs:
        rep = run.report
        probe = rep.link.interference
        totals = rep.cost_totals[rep.costs]
        print(
            f"\nseq {rep.seq_len}, {run.bandwidth}: compute {_ms(totals.compute_s)}, collectives "
            f"{_ms(totals.collectives_s)} ({rep.graph.collectives}), slowdown x{probe.compute_slowdown:.2f}"
            f" compute, x{probe.comm_slowdown:.2f} comm"
            f" (probe: comm {_ms(probe.comm_s)} using {_ms(probe.comm_cpu_s)} CPU, compute "
            f"{_ms(probe.compute_s)}, both "
            f"{_ms(probe.overlapped_s)}); profile predictions: "
            + ", ".join(f"{k} {_ms(v.predicted['profile'])}" for k, v in rep.variants.items())
        )
    if args.json:
        with open(args.json, "w") as f:
            json.dump([run.to_dict() for run in runs], f, indent=1)


if __name__ == "__main__":
    main()

"""Pipeline speed and optimisation on a 405B-class job (issue 39's "Speed" and "Optimising" acceptance).

Usage: python benchmarks/bench_pipeline.py [speed] [optimize] [--check-scaling]

``speed``: ``commsched pipeline``'s work for llama3-405b, fsdp+tp, world 512, TP 8, PP 8, Interleaved1F1B, V 2, M 32,
seq 8192 on h100-sxm (``simulate_job``), timed as a fresh process does it: cold (an empty cache folder: every stage
traced, torch's schedule lowered) and warm (the same folder again: the stage costs and the lowered schedule read
back). Wall seconds of the whole process (imports included), each the median of ``--repeats``. ``--check-scaling``
also traces each distinct stage in full and reports the layer-scaled costs' largest relative difference.

``optimize``: :func:`commsched.pipeline.optimize.optimize_pipeline` on the same model with torchtitan's 405B recipe's
batch (``tests/data/torchtitan/llama3_405b.toml``: local_batch_size 2 on 512 / TP 8 = 64 data-parallel ranks at
PP 1, so 128 sequences a step; at PP 8 the 8 FSDP replicas take 16 each), 80 GB per GPU, against 1F1B at M = P
(torchtitan's old default). Prints every try and the verdicts as markdown.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import platform
import resource
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

JOB = dict(preset="llama3-405b", parallel="fsdp+tp", world_size=512, tp_size=8, pp_size=8, seq_len=8192)
SPEED = dict(schedule="Interleaved1F1B", microbatches=32, stages_per_rank=2)
RECIPE_BATCH = 16  # sequences per FSDP replica per step (module docstring)
HARDWARE = "h100-sxm"
_ONE_STEP = f"""
import time; t = time.perf_counter()
from commsched.pipeline.job import PipelineJob, simulate_job
step = simulate_job(PipelineJob(**{ {**JOB, **SPEED}!r}), {HARDWARE!r})
print(step.step_s, time.perf_counter() - t)
"""


def _process(cache: str) -> tuple[float, float, float]:
    """(wall seconds, CPU seconds of a fresh process simulating the step with ``cache``, the step it printed). On a
    shared machine the CPU seconds are what a free one's wall would be: the process runs on one core."""
    env = {**os.environ, "COMMSCHED_CACHE_DIR": cache, "PYTHONPATH": str(ROOT / "src")}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    out = subprocess.run([sys.executable, "-c", _ONE_STEP], env=env, check=True, capture_output=True, text=True)
    wall = time.perf_counter() - t0
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime - before.ru_utime + after.ru_stime - before.ru_stime
    return wall, cpu, float(out.stdout.split()[0])


def speed(repeats: int, check_scaling: bool) -> None:
    cold, warm, steps = [], [], set()
    for _ in range(repeats):
        with tempfile.TemporaryDirectory() as cache:
            *times, step = _process(cache)
            cold.append(times)
            steps.add(step)
            for _ in range(repeats):
                *times, step = _process(cache)
                warm.append(times)
                steps.add(step)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"command: simulate_job({JOB | SPEED}, {HARDWARE!r}) in a fresh process")
    for name, runs in (("cold (empty cache)", cold), ("warm", warm)):
        wall, cpu = statistics.median(w for w, _ in runs), statistics.median(c for _, c in runs)
        print(f"{name}: wall {wall:.1f} s, CPU {cpu:.1f} s (median of {len(runs)}; wall/CPU "
              f"{', '.join(f'{w:.1f}/{c:.1f}' for w, c in runs)})")  # fmt: skip
    print(f"step {', '.join(f'{s * 1e3:.1f} ms' for s in sorted(steps))}")
    if check_scaling:
        _check_scaling()


def _check_scaling() -> None:
    """Every distinct stage traced in full against its layer-scaled costs."""
    from commsched.pipeline.cache import stage_record
    from commsched.pipeline.job import PipelineJob
    from commsched.pipeline.stages import stage_seconds, trace_stage

    job = PipelineJob(**JOB, **SPEED).resolve()
    worst = 0.0
    for shape in sorted({s.shape for s in job.stages}):
        scaled = stage_record(job.compute, shape, HARDWARE, disk=False)
        full = trace_stage(job.compute, *shape)
        secs = stage_seconds(full, HARDWARE)
        for name in ("forward_s", "backward_s", "backward_input_s", "backward_weight_s"):
            worst = max(worst, abs(getattr(scaled.times, name) / getattr(secs, name) - 1))
        worst = max(worst, abs(scaled.activation_bytes / full.activation_bytes - 1))
    print(f"layer scaling against full traces of {len({s.shape for s in job.stages})} stages: largest relative "
          f"difference {worst:.2e}")  # fmt: skip


def optimize(budget_gb: float) -> None:
    from commsched.pipeline.job import PipelineJob
    from commsched.pipeline.optimize import optimize_pipeline

    recipe = _recipe_options(PipelineJob)
    if not recipe:
        print("PipelineJob takes no activation checkpointing yet: the recipe's AC (mode = full) is left out")
    job = PipelineJob(**JOB, schedule="1F1B", microbatches=8, batch=RECIPE_BATCH, **recipe)
    t0 = time.perf_counter()
    plan = optimize_pipeline(job, HARDWARE, int(budget_gb * 1e9))
    print(f"optimize_pipeline({job}, {HARDWARE!r}, {budget_gb} GB): {time.perf_counter() - t0:.0f} s\n")
    print("| plan | step | peak | verdict |\n|---|---:|---:|---|")
    for t in plan.tried:
        step = "-" if t.step_s is None else f"{t.step_s * 1e3:.1f} ms"
        peak = "-" if t.peak_memory_bytes is None else f"{t.peak_memory_bytes / 2**30:.1f} GiB"
        print(f"| {t.label} | {step} | {peak} | {t.verdict[:160]} |")
    print(f"\n{plan.summary()}")


def _recipe_options(job_cls: type) -> dict[str, str]:
    """The recipe's activation checkpointing (``[activation_checkpoint] mode = "full"``) where the job takes it."""
    return {"ac": "full"} if "ac" in {f.name for f in dataclasses.fields(job_cls)} else {}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("parts", nargs="*", default=["speed", "optimize"], choices=["speed", "optimize"])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--check-scaling", action="store_true")
    ap.add_argument("--memory-budget", type=float, default=80.0, metavar="GB")
    args = ap.parse_args()
    if "speed" in args.parts:
        speed(args.repeats, args.check_scaling)
    if "optimize" in args.parts:
        optimize(args.memory_budget)


if __name__ == "__main__":
    main()

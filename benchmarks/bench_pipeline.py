"""Pipeline speed and optimisation on a 405B-class job (issue 39's "Speed" and "Optimising" acceptance).

Usage: python benchmarks/bench_pipeline.py [speed] [optimize] [--check-scaling]

``speed``: ``commsched pipeline``'s work for llama3-405b, fsdp+tp, world 512, TP 8, PP 8, Interleaved1F1B, V 2, M 32,
seq 8192 on h100-sxm (``simulate_job``), timed as a fresh process does it: cold (an empty cache folder: every stage
traced, torch's schedule lowered) and warm (the same folder again: the stage costs and the lowered schedule read
back). Wall seconds of the whole process (imports included), each the median of ``--repeats``. ``--check-scaling``
also traces each distinct stage in full and reports the layer-scaled costs' largest relative difference.

``optimize``: :func:`commsched.pipeline.optimize.optimize_pipeline` on the same model with torchtitan's 405B recipe
(``tests/data/torchtitan/llama3_405b.toml``): its batch (local_batch_size 2 on 512 / TP 8 = 64 data-parallel ranks
at PP 1, so 128 sequences a step; at PP 8 the 8 FSDP replicas take 16 each), its TP as torchtitan applies it (with
sequence parallelism: ``parallelize_llama``'s ``SequenceParallel`` norms), its ``[activation_checkpoint] mode =
"full"`` and its compile; each schedule, M and V also tried under AC none and selective-op (``ac_policies``),
80 GB per GPU, against 1F1B at M = P (torchtitan's old default) with the recipe's AC. The recipe's float8 and async
TP are left out (float8's one-byte gathered weights would only lower the peaks). Prints every try and the verdicts
as markdown.
"""

from __future__ import annotations

import argparse
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
RECIPE = dict(parallel="fsdp+tp+sp", ac="full", compile=True)  # the recipe's TP (with SP), AC and compile
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


def optimize(budget_gb: float, ac_search: bool) -> None:
    from commsched.pipeline.job import PipelineJob
    from commsched.pipeline.optimize import AC_POLICIES, optimize_pipeline

    job = PipelineJob(**{**JOB, **RECIPE}, schedule="1F1B", microbatches=8, batch=RECIPE_BATCH)
    acs = AC_POLICIES if ac_search else ()
    t0 = time.perf_counter()
    plan = optimize_pipeline(job, HARDWARE, int(budget_gb * 1e9), ac_policies=acs)
    print(f"optimize_pipeline({job}, {HARDWARE!r}, {budget_gb} GB, ac_policies={acs}): "
          f"{time.perf_counter() - t0:.0f} s\n")  # fmt: skip
    print("| plan | step | peak | verdict |\n|---|---:|---:|---|")
    for t in plan.tried:
        step = "-" if t.step_s is None else f"{t.step_s * 1e3:.1f} ms"
        peak = "-" if t.peak_memory_bytes is None else f"{t.peak_memory_bytes / 2**30:.1f} GiB"
        print(f"| {t.label} | {step} | {peak} | {t.verdict[:160]} |")
    print(f"\n{plan.summary()}")


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("parts", nargs="*", default=["speed", "optimize"], choices=["speed", "optimize"])
    ap.add_argument("--repeats", type=int, default=1)
    ap.add_argument("--check-scaling", action="store_true")
    ap.add_argument("--memory-budget", type=float, default=80.0, metavar="GB")
    ap.add_argument("--no-ac-search", dest="ac_search", action="store_false", help="only the recipe's AC")
    args = ap.parse_args()
    if "speed" in args.parts:
        speed(args.repeats, args.check_scaling)
    if "optimize" in args.parts:
        optimize(args.memory_budget, args.ac_search)


if __name__ == "__main__":
    main()

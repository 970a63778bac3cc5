"""``commsched plan``'s speed (issue 40's acceptance: >= 500 candidates judged in 60 s on 2 cores, llama3-70b on
512 GPUs, warm cache; a cold run's time reported).

Usage: python benchmarks/bench_plan.py [--sample N | --kinds K,... | --first N] [--warm-runs R] [--jobs J]
       [--cache-dir DIR] [--warm-only] [--profile] [--per-layout] [--pin-fingerprint]

A sample of ``--sample`` layouts without PP (evenly spaced over the step lower bound's order of those that pass the
memory bound, so every degree mix and AC policy is in it) of ``plan llama3-70b --gpus 512 -H h100-sxm --seq-len
8192`` is planned twice in this process with ``--jobs`` workers: cold (``--cache-dir`` empty: every layout traced at
2 and 4 layers) and warm (the same folder: traces read back; ``resume=False``, so no stored row is taken). Each run
prints wall and CPU seconds (this process and its finished workers), candidates judged and judged per second, and
the warm ranking is checked equal to the cold one. ``--profile`` runs the warm judging in this process under
cProfile instead (one worker's view of where a candidate's time goes). ``--kinds`` takes one layout of each named
kind (``KINDS``: degree mixes, AC, float8, PP) instead of the even sample, ``--first`` the first N layouts plan
judges (its order, PP included: the acceptance's "500 candidates"); ``--warm-runs`` runs the warm plan R times (the
first run after a change to the cost model writes the traces' cost analyses again); ``--per-layout`` prints the
plan's setup CPU and each layout's CPU-s judged alone (framework round, optimize round; the optimise round's
bounds) and stops; ``--pin-fingerprint`` keys the trace cache without the source fingerprint, so one cold fill
serves every later edit of the code (measurements only: a pinned cache may hold traces of older code; the cost
analyses beside them are keyed by the cost package's files, so they are never stale).
"""

from __future__ import annotations

import argparse
import cProfile
import os
import platform
import pstats
import resource
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

REQUEST = dict(preset="llama3-70b", gpus=512, hardware="h100-sxm", seq_len=8192)
TARGET = 500  # candidates judged in 60 s (the acceptance)


def _cpu_s() -> float:
    own, kids = resource.getrusage(resource.RUSAGE_SELF), resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + kids.ru_utime + kids.ru_stime


def first_layouts(req, n: int | None = None) -> list:
    """The first ``n`` (default: all) layouts plan judges: those the memory bound keeps, in the step bound's order
    (ties in enumeration order, as ``plan`` sorts them), PP included."""
    from commsched.plan.enumerate import enumerate_layouts
    from commsched.plan.prune import memory_lower_bound_bytes, step_lower_bound_s
    from commsched.plan.search import plan_hardware

    hw = plan_hardware(req)
    peaks = dict(hw.compute.peak_flops)
    peak = max(peaks.get("float8_e4m3fn", 0.0), peaks.get(req.dtype, 0.0))
    fits = [lay for lay in enumerate_layouts(req, hw.gpus_per_node, "float8_e4m3fn" in peaks)
            if memory_lower_bound_bytes(req, lay) <= hw.compute.hbm_capacity_bytes]  # fmt: skip
    fits.sort(key=lambda lay: step_lower_bound_s(req, lay, peak, hw))
    return fits[:n]


def is_warm(req, lay, hw) -> bool:
    """Whether a layout's traces are in the cache: without PP, its traces at plan's depths; with PP, its job judged
    here with tracing refused (then this process forgets every stage and job it read, so the timed plan starts as
    cold in memory as a fresh worker)."""
    import dataclasses

    import commsched.pipeline.cache as stage_cache
    from commsched.execute.cache import trace_path
    from commsched.plan import judge
    from commsched.plan.layout import step_config
    from commsched.plan.scale import layer_counts
    from commsched.plan.traced import trace_key_of

    if lay.pp == 1:
        return all(trace_path(trace_key_of(step_config(req, lay, n))).is_file() for n in layer_counts(req, lay))

    def refuse(*args, **kwargs):
        raise LookupError("not cached")

    tracer = stage_cache.trace_stage
    stage_cache.trace_stage = refuse
    try:
        spec = {"request": dataclasses.asdict(req), "hardware": hw, "cache": True, "optimize": False,
                "layouts": [lay.to_dict()]}  # fmt: skip
        return judge.judge_task(spec)[0]["error"] is None
    finally:
        stage_cache.trace_stage = tracer
        stage_cache._TRACED.clear()
        stage_cache._RECORDS.clear()
        judge._JOBS.clear()


def sample_layouts(req, n: int) -> list:
    """``n`` layouts without PP, evenly spaced over the step bound's order of those the memory bound keeps."""
    fits = [lay for lay in first_layouts(req) if lay.pp == 1]
    step = max(1, len(fits) // n)
    return fits[::step][:n]


KINDS = {  # one layout of each kind (the first in the step bound's order): degree mixes, AC policies, float8, PP
    "fsdp": lambda lay: lay.fsdp == lay.world_size and lay.ac == "full" and lay.float8 == "none",
    "hsdp": lambda lay: lay.dp_replicate > 1 and lay.tp == 1 and lay.cp == 1 and lay.pp == 1,
    "tp+sp": lambda lay: lay.tp == 8 and lay.sp and lay.cp == 1 and lay.dp_replicate == 1 and lay.pp == 1,
    "tp": lambda lay: lay.tp == 4 and not lay.sp and lay.pp == 1,
    "cp": lambda lay: lay.cp > 1 and lay.pp == 1,
    "cp 8": lambda lay: lay.cp == 8 and lay.tp == 1 and lay.dp_replicate == 1 and lay.float8 == "none",
    "cp 32": lambda lay: lay.cp == 32 and lay.tp == 1 and lay.dp_replicate == 1 and lay.float8 == "none",
    "float8": lambda lay: lay.float8 != "none" and lay.tp == 2 and lay.pp == 1,
    "ac selective-op": lambda lay: lay.ac == "selective-op" and lay.tp == 1 and lay.pp == 1,
    "pp 1F1B": lambda lay: lay.pp_schedule == "1F1B" and lay.ac == "full",
    "pp interleaved": lambda lay: lay.pp_schedule == "Interleaved1F1B" and lay.ac == "full",
}


def kind_layouts(req, kinds: list[str]) -> dict:
    """The first layout of each of ``kinds`` (``KINDS``) in the step bound's order of those the memory bound keeps."""
    fits = first_layouts(req)
    chosen: dict = {}
    for kind in kinds:
        chosen[kind] = next(lay for lay in fits if KINDS[kind](lay) and lay not in chosen.values())
    return chosen


def timed_plan(req, chosen: set, jobs: int) -> tuple[object, float, float]:
    """(the PlanResult of ``req`` over ``chosen``, wall seconds, CPU seconds with the workers')."""
    from commsched.plan import plan

    cpu0, t0 = _cpu_s(), time.perf_counter()
    result = plan(req, jobs=jobs, resume=False, only=chosen.__contains__)
    return result, time.perf_counter() - t0, _cpu_s() - cpu0


def per_layout_cpu(req, kinds: dict) -> list[tuple[str, float, float, str]]:
    """(kind, CPU-s of the framework round, CPU-s of the optimize round, the round's bounds) of each layout judged
    alone in this process, as a worker judges it (its traces read from the cache, nothing kept from the layout
    before). The bounds: the simulated lower bound at depth (the optimise round's prune before h-planspeed3), the
    bound on the optimised step from the first round (:func:`optimised_step_lower_bound_s`, its prune since), and
    the optimised step the round then gives."""
    import dataclasses

    from commsched.plan import judge, traced
    from commsched.plan.prune import optimised_step_lower_bound_s
    from commsched.plan.search import plan_hardware

    hw = plan_hardware(req)
    judge.warm_imports()
    out = []
    for kind, lay in kinds.items():
        traced._MEMORY.clear()
        judge._JOBS.clear()
        spec = {"request": dataclasses.asdict(req), "hardware": hw, "cache": True, "optimize": False,
                "layouts": [lay.to_dict()]}  # fmt: skip
        t0 = time.process_time()
        first = judge.judge_task(spec)[0]
        t1 = time.process_time()
        bounds = ""
        if lay.pp == 1 and first["error"] is None:
            second = judge.judge_task({**spec, "optimize": True, "framework_points": [first["points"]]})[0]
            bound_s = optimised_step_lower_bound_s(first)
            bounds = (f"; framework {first['framework_step_s']:.4f} s, simulated bound {first['lower_bound_s']:.4f} "
                      f"s, optimised bound {bound_s:.4f} s, optimised {second['optimized_step_s']:.4f} s, peak "
                      f"{first['peak_memory_bytes'] / 2**30:.1f} GiB")  # fmt: skip
        out.append((kind, t1 - t0, time.process_time() - t1, bounds))
    return out


def setup_cpu(req) -> float:
    """CPU-s a plan spends before judging: enumerating every layout and bounding each (memory, then step)."""
    from commsched.plan.enumerate import enumerate_layouts
    from commsched.plan.prune import memory_lower_bound_bytes, step_lower_bound_s
    from commsched.plan.search import plan_hardware

    t0 = time.process_time()
    hw = plan_hardware(req)
    layouts = list(enumerate_layouts(req, hw.gpus_per_node, True))
    fits = [lay for lay in layouts if memory_lower_bound_bytes(req, lay) <= hw.compute.hbm_capacity_bytes]
    fits.sort(key=lambda lay: step_lower_bound_s(req, lay, 1.0))
    print(f"setup: {len(layouts)} layouts enumerated, {len(fits)} fit the memory bound "
          f"({sum(lay.pp > 1 for lay in fits)} with PP)")  # fmt: skip
    return time.process_time() - t0


def _line(name: str, result, wall_s: float, cpu_s: float) -> None:
    judged = result.candidates_judged
    fits = sum(j.layout.pp == 1 for j in result.ranked)  # without PP, within the HBM: the optimize round's
    print(f"{name}: {judged} judged (+{result.pruned_bound} pruned by the step bound; {result.over_memory} over the "
          f"HBM; {fits - result.not_optimised} of {fits} fitting without PP optimised), wall {wall_s:.1f} s, "
          f"CPU {cpu_s:.1f} s, {judged / wall_s:.2f} judged/s wall, {judged / cpu_s:.2f} judged/CPU-s; "
          f"{TARGET} at this rate: {TARGET * wall_s / judged:.0f} s wall")  # fmt: skip


def _table(result) -> list:
    return [(j.layout, j.step_s, j.framework_step_s, j.peak_memory_bytes) for j in result.ranked]


def main() -> None:
    from commsched.plan import PlanRequest

    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--sample", type=int, default=12)
    ap.add_argument("--jobs", type=int, default=2)
    ap.add_argument("--cache-dir", default=None, help="kept between runs (default: a temporary folder)")
    ap.add_argument("--warm-only", action="store_true", help="the cache folder is warm already: skip the cold run")
    ap.add_argument("--profile", action="store_true", help="the warm run in this process under cProfile")
    ap.add_argument(
        "--per-layout", action="store_true", help="CPU-s of each layout judged alone (warm cache), then stop"
    )
    ap.add_argument("--first", type=int, default=None, help="the first N layouts in plan's order (PP included)")
    ap.add_argument("--skip-cold", action="store_true", help="leave out the chosen layouts whose traces are not cached")
    ap.add_argument(
        "--no-features",
        action="store_true",
        help="the cost analyses neither read nor kept (the code before they were cached, to compare)",
    )
    ap.add_argument("--warm-runs", type=int, default=1, help="warm runs (the first writes the cost analyses)")
    ap.add_argument("--kinds", default=None, help=f"comma-separated, instead of --sample: {', '.join(KINDS)}")
    ap.add_argument(
        "--pin-fingerprint",
        action="store_true",
        help="cache keys without the source fingerprint (a cache filled once serves every edit)",
    )
    args = ap.parse_args()
    if args.pin_fingerprint:
        from commsched.execute import base

        base.source_fingerprint = lambda: "dev"  # before versions() is first called (it is cached)
    if args.no_features:  # this process and the workers it forks: every trace analysed again
        from commsched.execute import cache as trace_cache

        trace_cache.load_features = lambda key, graph, root=None: False
        trace_cache.store_features = lambda key, graph, root=None: None
    cache = args.cache_dir or tempfile.mkdtemp(prefix="bench_plan_")
    os.environ["COMMSCHED_CACHE_DIR"] = cache
    req = PlanRequest(**REQUEST)
    if args.kinds:
        kinds = kind_layouts(req, args.kinds.split(","))
        for kind, lay in kinds.items():
            print(f"  {kind:16s} {lay.label()}")
        chosen = set(kinds.values())
    elif args.first:
        chosen = set(first_layouts(req, args.first))
    else:
        chosen = set(sample_layouts(req, args.sample))
    if args.skip_cold:
        from commsched.plan.search import plan_hardware

        hw = plan_hardware(req)
        cold_ones = [lay for lay in chosen if not is_warm(req, lay, hw)]
        chosen -= set(cold_ones)
        kinds: dict = {}
        for lay in cold_ones:
            kind = "pp" if lay.pp > 1 else f"cp {lay.cp}"
            kinds[kind] = kinds.get(kind, 0) + 1
        print(f"--skip-cold: {len(cold_ones)} layouts left out (not cached: {kinds})")
    if args.per_layout:
        print(f"setup CPU: {setup_cpu(req):.2f} s")
        layouts = kinds if args.kinds else {lay.label(): lay for lay in chosen}
        for kind, fw_s, opt_s, bounds in per_layout_cpu(req, layouts):
            print(f"  {kind:16s} framework round {fw_s:.3f} CPU-s, optimize round {opt_s:.3f} CPU-s{bounds}")
        return
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"command: plan({REQUEST}, jobs={args.jobs}, resume=False) over {len(chosen)} sampled layouts; cache {cache}")
    cold = None
    if not args.warm_only:
        cold, wall, cpu = timed_plan(req, chosen, args.jobs)
        _line("cold", cold, wall, cpu)
    if args.profile:
        profiler = cProfile.Profile()
        profiler.enable()
        warm, wall, cpu = timed_plan(req, chosen, 1)
        profiler.disable()
        pstats.Stats(profiler).sort_stats("cumulative").print_stats(40)
        _line("warm", warm, wall, cpu)
    else:
        for k in range(args.warm_runs):
            warm, wall, cpu = timed_plan(req, chosen, args.jobs)
            _line(f"warm {k + 1}", warm, wall, cpu)
    print(f"load average after: {os.getloadavg()[0]:.2f}")
    if cold is not None:
        print(f"warm ranking equal to the cold one: {_table(cold) == _table(warm)}")
    for j in sorted(warm.ranked, key=lambda j: -j.wall_s)[:20]:
        print(f"  {j.layout.label():55s} {j.wall_s:.2f} s in its task(s), {j.how}, kept {j.kept}")
    for j in warm.ranked[:3]:
        print(f"  {j.layout.label():55s} step {j.step_s:.3f} s  {j.tokens_per_s_per_gpu:,.0f} tokens/s/GPU")


if __name__ == "__main__":
    main()

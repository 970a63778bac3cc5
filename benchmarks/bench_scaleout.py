"""Scaling out a sweep (issue 24): the trace cache, the local pool, Ray; and the same rows on every backend.

Usage: python benchmarks/bench_scaleout.py [--layers 2] [--world-sizes 8,64,512,1024] [--repeat 2] [--no-ray]
       [--pairs-only] [--against SRC]
The sweep: llama3-8b, {fsdp, ddp} x world sizes x {h100-sxm, b200} (16 configurations by default). Measured:
(1) ``commsched sweep`` as fresh processes with an empty cache (``-j 1``), then the same command again, twice each
way: with the rows of the finished sweep stored (the row store answers; nothing is computed) and with the trace
cache only (the row store emptied first: every configuration estimated, scheduled and simulated); (2)
``--no-cache`` with ``-j 1`` and ``-j 2`` alternating, ``--repeat`` times each (wall and CPU seconds, the median
ratio); (3) ``--ray-address local -j 2 --no-cache`` (a private Ray instance, started by the run); (4) with a Ray
head on 127.0.0.1 already up (``ray start --block``, stopped by its pid): a second sweep on warm actors against a
second sweep on a warm local pool of 2, in this process. Then checks that every backend gave the same rows (wall
times, pids and hosts aside). Prints the load average around each figure: the machine is shared.
``--pairs-only``: (2) alone. ``--against SRC``: each pair also runs the code under SRC (e.g. main's checkout's
``src``, copied too), alternating with this checkout's, and each ``-j 2`` run gives its worker's CPU seconds
and the most memory it wrote (``Private_Dirty``), read from ``/proc`` every 50 ms while it runs.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import resource
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
TMP = SRC = Path()
TICK_S = 1 / os.sysconf("SC_CLK_TCK")


def snapshot() -> None:
    """Copy the source: every process of the benchmark runs the same code (the rows carry its hash) even if the
    checkout changes meanwhile. Only in the main process (spawned workers import this module too, and get the
    snapshot through sys.path)."""
    global TMP, SRC
    TMP = Path(tempfile.mkdtemp(prefix="scaleout"))
    SRC = TMP / "src"
    # numba's compiled loops are cached next to their modules: copied too (with their sources' times, so that they
    # stay valid), or the first process would compile them again (minutes on a busy machine)
    shutil.copytree(ROOT / "src" / "commsched", SRC / "commsched", ignore=shutil.ignore_patterns("*.pyc"))
    sys.path.insert(0, str(SRC))
    sys.path.insert(0, str(ROOT / "tests" / "execute"))


def load() -> str:
    return f"load {os.getloadavg()[0]:.1f}"


def cli(args: list[str], cache: Path, home: Path, out: Path) -> tuple[float, list]:
    """``commsched sweep ARGS --json OUT`` in a fresh process; (wall seconds, rows)."""
    wall, _, rows = cli_cpu(args, cache, home, out)
    return wall, rows


def cli_cpu(args: list[str], cache: Path, home: Path, out: Path, src: Path | None = None) -> tuple[float, float, list]:
    """:func:`cli` and the CPU seconds (user + system) of the process and its workers: (wall, CPU, rows)."""
    wall, cpu, _, rows = cli_procs(args, cache, home, out, src)
    return wall, cpu, rows


def cli_procs(args: list[str], cache: Path, home: Path, out: Path,
              src: Path | None = None) -> tuple[float, float, dict, list]:  # fmt: skip
    """:func:`cli_cpu` of the code under ``src`` (default: the snapshot), and what ``/proc`` showed of its
    worker processes: {pid: (CPU seconds, most Private_Dirty bytes)}: (wall, CPU, workers, rows)."""
    env = {**os.environ, "PYTHONPATH": str(src or SRC), "COMMSCHED_CACHE_DIR": str(cache), "HOME": str(home)}
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    t0 = time.perf_counter()
    proc = subprocess.Popen([sys.executable, "-m", "commsched", "sweep", *args, "--json", str(out)], env=env,
                            stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, cwd=home)  # fmt: skip
    workers: dict[int, tuple[float, int]] = {}
    while proc.poll() is None:
        for pid in _children(proc.pid):
            cpu_s, dirty = _proc_figures(pid)
            if cpu_s is not None:
                workers[pid] = (cpu_s, max(dirty, workers.get(pid, (0, 0))[1]))
        time.sleep(0.05)
    wall = time.perf_counter() - t0
    if proc.returncode != 0:
        raise SystemExit(f"sweep failed: {proc.stderr.read().decode()[-2000:]}")
    after = resource.getrusage(resource.RUSAGE_CHILDREN)  # workers are reaped by the CLI: counted in its figures
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    return wall, cpu, workers, json.loads(out.read_text())["rows"]


def _children(pid: int) -> list[int]:
    try:
        return [int(c) for c in Path(f"/proc/{pid}/task/{pid}/children").read_text().split()]
    except OSError:
        return []


def _proc_figures(pid: int) -> tuple[float | None, int]:
    """(user + system CPU seconds, Private_Dirty bytes) of a live process; (None, 0) once it is gone."""
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        rollup = Path(f"/proc/{pid}/smaps_rollup").read_text()
    except OSError:
        return None, 0
    dirty = sum(int(line.split()[1]) * 1024 for line in rollup.splitlines() if line.startswith("Private_Dirty"))
    return (int(fields[11]) + int(fields[12])) * TICK_S, dirty


def stripped(rows: list) -> list:
    from commsched.experiments.sweep import SweepRow

    return [(r if isinstance(r, SweepRow) else SweepRow.from_dict(r)).result_dict() for r in rows]


def in_process(executor, kw: dict) -> tuple[float, float, list]:
    """Two sweeps on one executor: (first wall, second wall, the second's rows)."""
    from commsched.experiments.sweep import run_sweep

    t0 = time.perf_counter()
    run_sweep("llama3-8b", **kw, executor=executor)
    t1 = time.perf_counter()
    rows = run_sweep("llama3-8b", **kw, executor=executor)
    return t1 - t0, time.perf_counter() - t1, rows


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=2)
    ap.add_argument("--world-sizes", default="8,64,512,1024")
    ap.add_argument("--repeat", type=int, default=2)
    ap.add_argument("--no-ray", action="store_true")
    ap.add_argument("--pairs-only", action="store_true", help="only the --no-cache -j 1 / -j 2 pairs")
    ap.add_argument("--against", type=Path, help="a second source tree (its src) to alternate with, pair by pair")
    args = ap.parse_args()
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs, Python {sys.version.split()[0]}, {load()}")
    sweep = ["llama3-8b", "-p", "fsdp,ddp", "-w", args.world_sizes, "-H", "h100-sxm,b200", "-l", str(args.layers)]
    tmp = TMP
    home = tmp / "home"
    home.mkdir()
    results: dict[str, list] = {}
    if args.pairs_only:
        cli(["llama-tiny", "-w", "2", "-l", "1", "-j", "1", "--no-cache"], tmp / "c0", home, tmp / "0.json")
        _pairs(args, sweep, home, results)
        return _check_rows(results)

    # untimed: a first process after a while reads torch's libraries from disk; no timed run should pay for that
    cli(["llama-tiny", "-w", "2", "-l", "1", "-j", "1", "--no-cache"], tmp / "c0", home, tmp / "0.json")
    cold, results["jobs 1 (cold cache)"] = cli([*sweep, "-j", "1"], tmp / "cache", home, tmp / "a.json")
    print(f"cold cache, -j 1: {cold:.2f} s ({load()})")
    for i in range(2):
        stored, results[f"rows stored {i}"] = cli(sweep, tmp / "cache", home, tmp / "b.json")
        print(f"same command, rows stored: {stored:.2f} s ({load()}): {cold / stored:.1f}x faster than cold")
        shutil.rmtree(tmp / "cache" / "sweeps")
        warm, results[f"warm trace cache {i}"] = cli(sweep, tmp / "cache", home, tmp / "b.json")
        print(f"same command, trace cache only: {warm:.2f} s ({load()}): {cold / warm:.1f}x faster than cold")

    _pairs(args, sweep, home, results)
    if not args.no_ray:
        ray_wall, results["ray local"] = cli([*sweep, "-j", "2", "--no-cache", "--ray-address", "local"],
                                             tmp / "c3", home, tmp / "e.json")  # fmt: skip
        print(f"--ray-address local -j 2 --no-cache (starts Ray): {ray_wall:.2f} s ({load()})")
        _warm_backends(args, results)

    _check_rows(results)


def _pairs(args, sweep: list[str], home: Path, results: dict) -> None:
    """``--no-cache`` ``-j 1`` then ``-j 2``, ``--repeat`` times; with ``--against``, each pair runs both trees,
    the first tree alternating from pair to pair."""
    trees = [("this", None)]
    if args.against is not None:
        other = TMP / "against"
        shutil.copytree(args.against / "commsched", other / "commsched", ignore=shutil.ignore_patterns("*.pyc"))
        trees.append(("against", other))
    ratios: dict[str, list[float]] = {name: [] for name, _ in trees}
    bounds: dict[str, list[float]] = {name: [] for name, _ in trees}
    for i in range(args.repeat):
        for name, src in trees if i % 2 == 0 else trees[::-1]:
            key = "" if src is None else f" ({name})"
            run = [*sweep, "--no-cache", "-j"]
            one, cpu1, _, results[f"jobs 1 #{i}{key}"] = cli_procs([*run, "1"], TMP / "c1", home, TMP / "c.json", src)
            print(f"{name}: --no-cache -j 1: {one:.2f} s, CPU {cpu1:.2f} s ({load()}); "
                  f"{_serial_and_work(one, results[f'jobs 1 #{i}{key}'])}")  # fmt: skip
            two, cpu2, workers, results[f"jobs 2 #{i}{key}"] = cli_procs([*run, "2"], TMP / "c2", home,
                                                                          TMP / "d.json", src)  # fmt: skip
            ratios[name].append(two / one)
            bounds[name].append(_halved_bound(one, results[f"jobs 1 #{i}{key}"]))
            seen = ", ".join(f"worker CPU {c:.2f} s, wrote {d / 2**20:.0f} MiB" for c, d in workers.values())
            print(f"{name}: --no-cache -j 2: {two:.2f} s, CPU {cpu2:.2f} s ({seen}; {load()}): "
                  f"{two / one:.2f}x the -j 1 wall before it; {_split(results[f'jobs 2 #{i}{key}'])}; "
                  f"{_serial_and_work(two, results[f'jobs 2 #{i}{key}'])}")  # fmt: skip
    for name, r in ratios.items():
        print(f"{name}: -j 2 / -j 1, median of {len(r)}: {statistics.median(r):.2f}x (the -j 1 runs' serial part "
              f"with their work halved exactly: median {statistics.median(bounds[name]):.2f}x)")  # fmt: skip


def _work_by_pid(rows: list) -> dict[int, float]:
    """Seconds each process spent in tasks, from the rows' stage walls: each task's trace once (its rows, one per
    hardware profile, repeat it), every row's estimate, schedule and simulate."""
    work: dict[int, float] = {}
    traced: set[tuple] = set()
    for r in rows:
        key = (r["pid"], r["parallel"], r["world_size"], r["fsdp_bucket"])
        stages = sum(r[k] or 0.0 for k in ("estimate_wall_s", "schedule_wall_s", "simulate_wall_s"))
        work[r["pid"]] = work.get(r["pid"], 0.0) + stages + (0.0 if key in traced else r["trace_wall_s"] or 0.0)
        traced.add(key)
    return work


def _serial_and_work(wall: float, rows: list) -> str:
    """A run's wall split into the busiest process's task seconds and the rest ("serial": interpreter, imports,
    forking, writing, exit), and the other processes' task seconds."""
    work = sorted(_work_by_pid(rows).values(), reverse=True)
    others = f" (other process(es): {', '.join(f'{w:.2f}' for w in work[1:])} s)" if len(work) > 1 else ""
    return f"serial {wall - work[0]:.2f} s + tasks {work[0]:.2f} s{others}"


def _halved_bound(wall_1: float, rows_1: list) -> float:
    """What ``-j 2`` / ``-j 1`` would be if two processes split a ``-j 1`` run's task seconds exactly in half and
    ran each as fast as one process alone, its serial part unchanged."""
    work = sum(_work_by_pid(rows_1).values())
    return (wall_1 - work / 2) / wall_1


def _split(rows: list) -> str:
    """Which process ran which configurations, and the slowest estimate + schedule + simulate of each (seconds:
    a process that loads numba's compiled loops on a first call pays it there)."""
    by_pid: dict[int, list] = {}
    for r in rows:
        by_pid.setdefault(r["pid"], []).append(r)
    parts = []
    for pid_rows in by_pid.values():
        stages = max(sum(r[k] or 0.0 for k in ("estimate_wall_s", "schedule_wall_s", "simulate_wall_s"))
                     for r in pid_rows)  # fmt: skip
        tasks = dict.fromkeys(f"{r['parallel']} {r['world_size']}" for r in pid_rows)
        parts.append(f"{', '.join(tasks)} (slowest stages {stages:.3f} s)")
    return "; ".join(parts)


def _check_rows(results: dict) -> None:
    """Every run's rows equal the first ``-j 1`` run's (wall times, pids, hosts and, across trees, versions
    aside); exits non-zero if not."""
    versions = ("commsched_version", "torch_version", "numpy_version")
    want = [{k: v for k, v in r.items() if k not in versions} for r in stripped(results["jobs 1 #0"])]
    same = {}
    for name, rows in results.items():
        same[name] = [{k: v for k, v in r.items() if k not in versions} for r in stripped(rows)] == want
        print(f"rows equal to --no-cache -j 1: {name}: {same[name]} ({len(rows)} rows)")
    if not all(same.values()):
        raise SystemExit("rows differ between backends")


def _warm_backends(args, results: dict) -> None:
    """A warm local pool of 2 and warm actors on a head that is up, each timed on its second sweep."""
    from test_ray import Head

    from commsched.execute.local import LocalExecutor
    from commsched.execute.ray_backend import RayExecutor

    kw = {"parallel": ["fsdp", "ddp"], "world_sizes": [int(w) for w in args.world_sizes.split(",")],
          "hardware": ["h100-sxm", "b200"], "layers": args.layers, "cache": False, "resume": False}  # fmt: skip
    with LocalExecutor(jobs=2) as ex:
        first, local_s, results["local pool (warm)"] = in_process(ex, kw)
    print(f"local pool of 2, this process tracing too: first {first:.2f} s, warm {local_s:.2f} s ({load()})")
    with LocalExecutor(jobs=2, in_process=False) as ex:
        first, workers_s, results["local workers only (warm)"] = in_process(ex, kw)
    print(f"local pool, 2 workers only: first {first:.2f} s, warm {workers_s:.2f} s ({load()})")
    head = Head(src=SRC)
    try:
        t0 = time.perf_counter()
        ex = RayExecutor(head.address)
        connect = time.perf_counter() - t0
        try:
            first, ray_s, results["ray head (warm)"] = in_process(ex, kw)
        finally:
            ex.close()
    finally:
        head.stop()
    print(f"Ray head up (2 CPUs): connect {connect:.2f} s, first sweep {first:.2f} s (actors warm up), "
          f"warm {ray_s:.2f} s ({load()}): {ray_s / workers_s:.2f}x the 2 local workers, "
          f"{ray_s / local_s:.2f}x the local pool")  # fmt: skip


if __name__ == "__main__":
    snapshot()
    try:
        main()
    finally:
        shutil.rmtree(TMP, ignore_errors=True)

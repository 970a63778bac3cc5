"""What-if sweeps: one workload preset over parallelisms x world sizes x FSDP buckets x hardware x optimize on/off.

``run_sweep("llama3-8b", parallel="fsdp", world_sizes=[8, 64, 512], hardware=["h100-sxm", "b200"], layers=4)``
returns one :class:`SweepRow` per configuration: the simulated step time in the traced order and in the scheduled
(or optimized) program, exposed communication, overlap, peak memory, the lower bound, and how long each stage took.

Work is split by trace: each (parallel, world_size, fsdp_bucket) is one task (:mod:`commsched.experiments.sweep_task`),
traced once (or read from the trace cache, :mod:`commsched.execute.cache`), then estimated, scheduled and simulated on
every hardware profile (tracing takes seconds, the rest tens of milliseconds, so shipping graphs between processes
would cost more than it saves). Tasks run on an executor (:mod:`commsched.execute`): the local pool by default (this
process and ``jobs - 1`` workers, forked once it has imported what a trace imports), or Ray with ``ray_address``.
Hardware profiles are resolved here and travel inside the task by content, so a calibrated profile in this user's
folder gives the same rows on a remote worker. Every backend gives the same rows, apart from :data:`RUN_FIELDS`
(wall times, where a row ran, cache hits).

A configuration that fails, in its trace or on one profile, or whose worker dies, becomes a row with ``error`` set;
the sweep itself only raises for input that is wrong everywhere (an unknown preset, parallelism, profile or pass) or
for a run that cannot go on (:class:`commsched.execute.ExecutorError`: mixed versions, a lost Ray head). Finished
rows are kept in the row store as they come in, so a sweep interrupted (Ctrl-C) resumes where it stopped, and a
sweep run again (trace cache on) takes its stored rows.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any

from commsched.experiments import sweep_pipeline
from commsched.experiments.sweep_pipeline import PipelineSweep
from commsched.experiments.sweep_row import RUN_FIELDS, SweepRow
from commsched.experiments.sweep_task import build_options, error_rows, warm_imports

SWEEP_FORMAT = "commsched.sweep"
SWEEP_VERSION = 3  # 3: the pipeline fields (pp_size ... mfu); 2: optimize, fsdp_bucket, optimize_kept, trace_cached,
# host and the versions in every row
TASK_FN = "commsched.experiments.sweep_task:run_task"
__all__ = ["RUN_FIELDS", "PipelineSweep", "SweepRow", "build_options", "default_processes", "run_sweep",
           "sweep_to_dict"]  # fmt: skip


def _check_workload(preset: str, parallels: Sequence[str], pipeline: bool) -> None:
    """Reject a preset or parallelism that would fail every configuration (imports torch: seconds)."""
    from commsched.workloads import PARALLELISMS, get_preset

    get_preset(preset)  # ValueError naming the known presets
    for p in parallels:
        if p not in PARALLELISMS:
            raise ValueError(f"parallel {p!r}: expected one of {', '.join(PARALLELISMS)}")
    if pipeline:
        sweep_pipeline.check_parallel(parallels)


def _checked_pipeline(pipeline: PipelineSweep | None, dims: dict[str, list],
                      build_kw: dict[str, Any]) -> PipelineSweep | None:  # fmt: skip
    """``pipeline`` checked, and the sweep's dimensions and options a pipeline sweep does not take refused (one
    line each)."""
    if pipeline is None:
        return None
    sweep_pipeline.check_options(build_kw)
    if dims["optimize"] != [False]:
        raise ValueError("optimize: a pipeline sweep simulates the schedules as torch runs them; expected off")
    if dims["fsdp_bucket"] != ["param"]:
        raise ValueError("fsdp_bucket: a pipeline times FSDP2's per-block collectives already; expected param")
    return pipeline.checked()


def _all_cached(tasks: list[dict[str, Any]]) -> bool:
    """Whether this machine's trace cache holds every task's trace (then its names were valid when traced)."""
    from commsched.execute.cache import trace_key, trace_path

    def key(t: dict[str, Any]) -> str:
        return trace_key(
            t["preset"], t["parallel"], t["world_size"], t["layers"], build_options(t["parallel"], t["build_kw"])
        )

    return all(t["cache"] and not any(t["optimize"]) and trace_path(key(t)).is_file() for t in tasks)


def _profiles(hardware: Sequence[str]) -> list:
    """The profiles, resolved here (user folder included) so they travel by content; an unknown name is an error
    before any process starts."""
    from commsched import hardware as hw_profiles

    profiles = []
    for h in hardware:
        try:
            profiles.append((h, hw_profiles.get(h)))
        except FileNotFoundError as exc:
            raise ValueError(str(exc)) from None
    return profiles


def _check_schedule(schedule: str | None) -> None:
    """Reject pass names that would fail every configuration (imports the passes and numba: a sweep whose rows
    are all stored skips it, as its names were checked when they were computed)."""
    from commsched.passes import resolve_passes

    if schedule is not None:
        try:
            resolve_passes(schedule)
        except ValueError as exc:
            raise ValueError(f"schedule {schedule!r}: {exc}") from None


def _as_list(value: Any, what: str) -> list[Any]:
    items = [value] if isinstance(value, (str, int, bool)) else list(value)
    if not items:
        raise ValueError(f"{what}: expected at least one value")
    if len(set(items)) != len(items):
        raise ValueError(f"{what}: duplicate values in {items}")
    return items


def _dimensions(parallel: Any, world_sizes: Any, fsdp_bucket: Any, optimize: Any) -> dict[str, list]:
    """The swept values of each dimension, checked."""
    dims = {
        "parallel": _as_list(parallel, "parallel"),
        "world_sizes": _as_list(world_sizes, "world_sizes"),
        "fsdp_bucket": _as_list(fsdp_bucket, "fsdp_bucket"),
        "optimize": _as_list(optimize, "optimize"),
    }
    for w in dims["world_sizes"]:
        if not isinstance(w, int) or isinstance(w, bool) or w < 1:
            raise ValueError(f"world_sizes: {w!r} is not a positive integer")
    for b in dims["fsdp_bucket"]:
        if b not in ("param", "block"):
            raise ValueError(f"fsdp_bucket {b!r}: expected param or block")
    return dims


def default_processes() -> int:
    """One per CPU. Workers warm up before they take a trace and this process traces too, so an extra process
    costs little even where it cannot help (benchmarks/RESULTS.md: about even on 2 busy cores for 1 s traces,
    1.3-1.5x faster for 8 s ones)."""
    from commsched.execute.base import default_jobs

    return default_jobs()


def _tasks(preset: str, dims: dict[str, list], profiles: list, layers: int | None, schedule: str | None,
           gpus_per_node: int | None, cache: bool, build_kw: dict[str, Any]) -> list[dict[str, Any]]:  # fmt: skip
    """One task spec per (parallel, world size, FSDP buckets), in that nested order."""
    tasks = []
    for p in dims["parallel"]:
        for w in dims["world_sizes"]:
            for bucket in dims["fsdp_bucket"]:
                kw = dict(sorted({**build_kw, **({"fsdp_bucket": bucket} if bucket != "param" else {})}.items()))
                tasks.append({
                    "index": len(tasks), "preset": preset, "parallel": p, "world_size": w, "layers": layers,
                    "schedule": schedule, "gpus_per_node": gpus_per_node, "build_kw": kw, "hardware": profiles,
                    "optimize": dims["optimize"], "cache": cache,
                })  # fmt: skip
    return tasks


def _store_key(tasks: list[dict[str, Any]]) -> list:
    """The row store's configuration: the task specs with each profile as its data."""
    from commsched.hardware import hardware_to_dict

    return [{**t, "hardware": [(n, hardware_to_dict(hw)) for n, hw in t["hardware"]]} for t in tasks]


def run_sweep(
    preset: str,
    *,
    parallel: str | Sequence[str],
    world_sizes: int | Sequence[int],
    hardware: str | Sequence[str],
    layers: int | None = None,
    schedule: str | None = "default",
    optimize: bool | Sequence[bool] = False,
    fsdp_bucket: str | Sequence[str] = "param",
    processes: int | None = None,
    in_process: bool = True,
    ray_address: str | None = None,
    executor: Any = None,
    cache: bool = True,
    resume: bool = True,
    gpus_per_node: int | None = None,
    progress: bool = False,
    console: Any = None,
    on_rows: Callable[[list[SweepRow]], None] | None = None,
    pipeline: PipelineSweep | None = None,
    **build_kw: Any,
) -> list[SweepRow]:
    """Simulate ``preset`` for every (parallel, world_size, fsdp_bucket, hardware, optimize), rows in that nested
    order of the arguments.

    ``schedule``: a pass preset or comma-separated passes for :func:`commsched.passes.schedule` ("default" is our
    scheduler), or None to report the traced order only. ``optimize``: False, True or both (``[False, True]``):
    True runs :func:`commsched.optimize.optimize` (the program's collectives too) instead of ``schedule``.
    ``fsdp_bucket``: FSDP collective granularities ("param", "block"). Where: ``processes`` local processes
    (default one per CPU; this one included unless ``in_process=False``; 1 runs everything here), or Ray at
    ``ray_address`` ("local" or a head's address), or a given ``executor`` (kept open). ``cache``: read and fill
    the trace cache. ``resume``: keep finished rows in the row store and take those of an earlier run of the
    same sweep (interrupted, or finished with ``cache``: then nothing is computed). Nodes per configuration:
    ``ceil(world_size / gpus_per_node)`` (the profile's unless given).
    ``build_kw`` go to :func:`commsched.workloads.build` (``seq_len``, ``batch``, ``mode``, ``tp_size``, ...);
    ``tp_size`` / ``ep_size`` only to parallelisms with a tp / ep dimension. ``progress`` shows one rich progress
    bar on ``console`` (default: stderr); ``on_rows`` receives each task's rows, in this process, as they finish.
    ``pipeline``: sweep pipeline schedules instead (:mod:`commsched.experiments.sweep_pipeline`): one row per
    (parallel, world size, P, schedule, M, V, hardware), ``schedule`` / ``optimize`` / ``fsdp_bucket`` unused.
    Raises ValueError for names that fail everywhere; a failing configuration is a row with ``error`` set.
    """
    from commsched.execute.cache import RowStore

    dims = _dimensions(parallel, world_sizes, fsdp_bucket, optimize)
    for name, value in (("processes", processes), ("gpus_per_node", gpus_per_node)):
        if value is not None and value < 1:
            raise ValueError(f"{name}={value}: expected >= 1")
    pipeline = _checked_pipeline(pipeline, dims, build_kw)
    names = _as_list(hardware, "hardware")
    profiles = _profiles(names)
    if pipeline is None:
        tasks, task_fn = _tasks(preset, dims, profiles, layers, schedule, gpus_per_node, cache, build_kw), TASK_FN
    else:
        tasks = sweep_pipeline.pipeline_tasks(preset, dims["parallel"], dims["world_sizes"], pipeline, profiles,
                                              layers, gpus_per_node, build_kw)  # fmt: skip
        task_fn = sweep_pipeline.TASK_FN
    store = RowStore(_store_key(tasks)) if resume else None
    results = store.load() if store is not None else {}
    todo = [t for t in tasks if t["index"] not in results]
    all_cached = bool(todo) and pipeline is None and _all_cached(todo)
    if todo and not all_cached and ray_address is None and executor is None and _forks():
        warm_imports()  # what checking the names and tracing import (torch, numba): once, the collector paused
    if todo and pipeline is None:
        _check_schedule(schedule)
    if not todo or (all_cached and ray_address is None and executor is None):
        processes = 1  # nothing to trace: estimating and simulating here beats starting workers (and torch)
    elif ray_address is None and executor is None:
        # local workers start (import torch, warm up) while this process checks the names, importing torch too
        executor = _early_pool(processes, in_process, len(todo),
                               lambda: _check_workload(preset, dims["parallel"], pipeline is not None))  # fmt: skip
    else:
        _check_workload(preset, dims["parallel"], pipeline is not None)
    own = executor is not None and getattr(executor, "_sweep_owned", False)
    bar = _Progress(len(tasks) * len(names) * len(dims["optimize"]), console) if progress else None
    if own:
        executor.progress = bar
    if bar is not None and results:
        bar.advance(sum(len(r) for r in results.values()), f"{len(results)} task(s) from an earlier run")
    lost: set[int] = set()  # tasks whose worker died: their error rows are not stored (a re-run retries them)

    def fail(spec: dict[str, Any], text: str) -> list[dict[str, Any]]:
        lost.add(spec["index"])
        return error_rows(spec, text)

    def finish(i: int, rows: list[dict[str, Any]]) -> None:
        task = todo[i]
        results[task["index"]] = rows
        if store is not None and task["index"] not in lost:
            store.add(task["index"], rows)
        if bar is not None:
            bar.advance(len(rows), f"{task['parallel']} world {task['world_size']}")
        if on_rows is not None:
            on_rows([SweepRow.from_dict(r) for r in rows])

    try:
        if todo:
            _execute(task_fn, todo, fail, finish, bar, executor, processes, in_process, ray_address)
    finally:
        if own:
            executor.close()
        if bar is not None:
            bar.close()
    if store is not None:
        store.finish(keep=cache)
    return [SweepRow.from_dict(row) for t in tasks for row in results[t["index"]]]


def _forks() -> bool:
    """Whether a local pool would fork its workers (spawned ones start before this process imports torch)."""
    from commsched.execute.local import default_start

    return default_start() == "fork"


def _early_pool(processes: int | None, in_process: bool, n_tasks: int, check: Callable[[], None]) -> Any:
    """A local pool whose workers are already starting, then ``check()`` here; the pool is closed if it raises."""
    from commsched.execute.local import LocalExecutor

    pool = LocalExecutor(jobs=processes, in_process=in_process)
    pool._sweep_owned = True  # run_sweep closes it
    try:
        pool.prestart(n_tasks)
        check()
    except BaseException:
        pool.close()
        raise
    return pool


def _execute(task_fn: str, todo: list, fail: Callable, finish: Callable, bar: Any, executor: Any, processes: int | None,
             in_process: bool, ray_address: str | None) -> None:  # fmt: skip
    """Run ``todo`` (tasks of ``task_fn``) on ``executor``, or on one made here (and closed, also after Ctrl-C)."""
    from commsched.execute.factory import make_executor
    from commsched.execute.local import LocalExecutor

    own = executor is None
    if own:
        if ray_address is None:
            executor = LocalExecutor(jobs=processes, in_process=in_process, progress=bar)
        else:
            executor = make_executor(jobs=processes, ray_address=ray_address, progress=bar)
    try:
        executor.map(task_fn, todo, fail=fail, on_result=finish)
    finally:
        if own:
            executor.close()


class _Progress:
    """A rich progress bar counting configurations (a trace finishes all its hardware rows at once)."""

    def __init__(self, total: int, console: Any) -> None:
        from rich.console import Console
        from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeElapsedColumn

        self._progress = Progress(
            TextColumn("[progress.description]{task.description}"),
            BarColumn(),
            MofNCompleteColumn(),
            TimeElapsedColumn(),
            console=console or Console(stderr=True),
            transient=True,
        )
        self._progress.start()
        self._task = self._progress.add_task("sweep", total=total)

    def describe(self, text: str) -> None:
        self._progress.update(self._task, description=text)

    def advance(self, n: int, what: str) -> None:
        self._progress.update(self._task, advance=n, description=f"done {what}")

    def close(self) -> None:
        self._progress.stop()


def sweep_to_dict(rows: Sequence[SweepRow], **context: Any) -> dict[str, Any]:
    """The rows as a versioned JSON object (``context``: e.g. the command line, the wall time)."""
    return {"format": SWEEP_FORMAT, "version": SWEEP_VERSION, **context, "rows": [r.to_dict() for r in rows]}

"""What-if sweeps: one workload preset over parallelisms x world sizes x hardware profiles.

``run_sweep("llama3-8b", parallel="fsdp", world_sizes=[8, 64, 512], hardware=["h100-sxm", "b200"], layers=4)``
returns one :class:`SweepRow` per (parallel, world_size, hardware): the simulated step time in the traced order
and in the scheduled order, exposed communication, overlap, peak memory, the lower bound, and how long each
stage took.

Work is split by trace: each (parallel, world_size) is traced once, in one process, which then estimates, schedules
and simulates it on every hardware profile (tracing takes seconds, the rest tens of milliseconds, so shipping graphs
between processes would cost more than it saves). With ``processes = N > 1``, this process and N - 1 workers of a
``ProcessPoolExecutor`` take traces from one list, each the next when it is free (this process has imported torch
anyway, so it works rather than waits). Workers are *spawned*: fresh interpreters that import torch themselves,
because torch after ``fork`` can deadlock on locks or threads the parent held. A worker starts with a warm-up
(imports, a tiny trace: seconds) and only then takes a trace, so extra processes never hold work this process could
have done; they pay off for long traces or many cores (benchmarks/RESULTS.md).

A configuration that fails, in its trace or on one profile, or whose worker dies, becomes a row with ``error`` set;
the sweep itself only raises for input that is wrong everywhere (an unknown preset, parallelism, profile or pass).
"""

from __future__ import annotations

import collections
import dataclasses
import math
import multiprocessing
import os
import queue
import signal
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

SWEEP_FORMAT = "commsched.sweep"
SWEEP_VERSION = 1


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepRow:
    """One configuration of a sweep. ``*_input_*`` fields are the traced (program) order; the others the order the
    ``schedule`` passes chose (the same as the input order when ``schedule`` is None). ``error`` is set, and the
    metrics are NaN / -1, when the configuration failed; ``trace_wall_s`` is shared by the rows of one trace."""

    preset: str
    parallel: str
    world_size: int
    hardware: str
    num_nodes: int = -1
    gpus_per_node: int = -1
    layers: int = -1
    schedule: str | None = None
    num_graph_nodes: int = -1
    tokens_per_step: int = -1
    fsdp_pad_bytes: int = -1  # bytes of padding in each FSDP all_gather (shards rounded up to divide the world)
    step_time_input_s: float = math.nan
    step_time_s: float = math.nan
    exposed_comm_input_s: float = math.nan
    exposed_comm_s: float = math.nan
    overlap_ratio_input: float = math.nan
    overlap_ratio: float = math.nan
    peak_memory_input_bytes: int = -1
    peak_memory_bytes: int = -1
    lower_bound_s: float = math.nan
    trace_wall_s: float = math.nan
    estimate_wall_s: float = math.nan
    schedule_wall_s: float = math.nan
    simulate_wall_s: float = math.nan
    pid: int = -1  # the process that traced and simulated this configuration
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def speedup(self) -> float:
        """Input-order step time / scheduled step time."""
        return self.step_time_input_s / self.step_time_s if self.ok and self.step_time_s > 0 else math.nan

    @property
    def compute_bound_s(self) -> float:
        """The part of the scheduled step not spent waiting on communication (step time - exposed comm)."""
        return self.step_time_s - self.exposed_comm_s

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values; NaN becomes None."""
        d = dataclasses.asdict(self)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "<row>") -> SweepRow:
        """The inverse of :meth:`to_dict`; an unknown or missing field is a ValueError naming it."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}")
        missing = sorted(k for k in ("preset", "parallel", "world_size", "hardware") if k not in data)
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}")
        kw = {k: (math.nan if v is None and fields[k].type == "float" else v) for k, v in data.items()}
        return cls(**kw)


@dataclasses.dataclass(frozen=True)
class _TraceTask:
    """What one worker does: trace one (preset, parallel, world_size), then evaluate it on every profile."""

    index: int
    preset: str
    parallel: str
    world_size: int
    hardware: tuple[str, ...]
    layers: int | None
    schedule: str | None
    gpus_per_node: int | None
    build_kw: tuple[tuple[str, Any], ...]


def _error_text(stage: str, exc: BaseException) -> str:
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{stage}: {type(exc).__name__}" + (f": {msg}" if msg else "")


def _error_rows(task: _TraceTask, error: str, **fields: Any) -> list[SweepRow]:
    return [
        SweepRow(
            preset=task.preset,
            parallel=task.parallel,
            world_size=task.world_size,
            hardware=h,
            schedule=task.schedule,
            error=error,
            **fields,
        )
        for h in task.hardware
    ]


def _evaluate(task: _TraceTask, workload: Any, hardware: str, trace_wall_s: float) -> SweepRow:
    """Estimate, schedule and simulate one traced workload on one hardware profile."""
    from commsched import hardware as hw_profiles
    from commsched.cost import estimate_costs
    from commsched.passes import schedule as run_schedule
    from commsched.report.step import predict
    from commsched.sim import simulate_costs

    g, meta = workload.graph, workload.meta
    common = {
        "preset": task.preset,
        "parallel": task.parallel,
        "world_size": task.world_size,
        "hardware": hardware,
        "layers": int(meta.get("layers", -1)),
        "schedule": task.schedule,
        "num_graph_nodes": len(g),
        "tokens_per_step": int(meta.get("tokens_per_step", -1)),
        "fsdp_pad_bytes": int(meta.get("padding", {}).get("fsdp_all_gather_pad_bytes", 0)),
        "trace_wall_s": trace_wall_s,
        "pid": os.getpid(),
    }
    stage = "hardware"
    try:
        hw = hw_profiles.for_graph(hardware, world_size=task.world_size, gpus_per_node=task.gpus_per_node)
        common.update(num_nodes=hw.num_nodes, gpus_per_node=hw.gpus_per_node)
        stage = "estimate"
        t0 = time.perf_counter()
        costs = estimate_costs(g, hw)
        t1 = time.perf_counter()
        stage = "schedule"
        sched = None if task.schedule is None else run_schedule(g, costs, task.schedule)
        t2 = time.perf_counter()
        stage = "simulate"
        before = simulate_costs(g, costs)
        # the schedule's one step time: with several compute streams, plus the contention its pass charged
        step = None if sched is None else predict(g, costs, sched.order, sched.streams, sched.compute_interference)
        after = before if step is None else step.sim
        t3 = time.perf_counter()
    except Exception as exc:  # one failing configuration must not sink the sweep
        return SweepRow(**common, error=_error_text(stage, exc))
    return SweepRow(
        **common,
        step_time_input_s=before.makespan_s,
        step_time_s=after.makespan_s if step is None else step.makespan_s,
        exposed_comm_input_s=before.exposed_comm_s,
        exposed_comm_s=after.exposed_comm_s,
        overlap_ratio_input=before.overlap_ratio,
        overlap_ratio=after.overlap_ratio,
        peak_memory_input_bytes=before.peak_memory_bytes,
        peak_memory_bytes=after.peak_memory_bytes,
        lower_bound_s=after.lower_bound_s,
        estimate_wall_s=t1 - t0,
        schedule_wall_s=t2 - t1,
        simulate_wall_s=t3 - t2,
    )


# a degree option only means something to the parallelisms with that mesh dimension; sweeping "fsdp,fsdp+tp" with
# tp_size=8 gives it to fsdp+tp alone (the workload builder rejects tp_size for fsdp)
_DEGREE_OPTIONS = {"tp_size": "tp", "ep_size": "ep"}


def build_options(parallel: str, build_kw: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``build_kw`` that :func:`commsched.workloads.build` should get for ``parallel``."""
    dims = set(parallel.split("+"))
    return {k: v for k, v in build_kw.items() if k not in _DEGREE_OPTIONS or _DEGREE_OPTIONS[k] in dims}


def _run_task(task: _TraceTask) -> list[SweepRow]:
    """Worker entry point (must be importable by name for spawned processes). Never raises for a bad config."""
    from commsched.workloads import build

    t0 = time.perf_counter()
    try:
        workload = build(
            task.preset,
            parallel=task.parallel,
            world_size=task.world_size,
            layers=task.layers,
            **build_options(task.parallel, dict(task.build_kw)),
        )
    except Exception as exc:
        return _error_rows(task, _error_text("trace", exc), trace_wall_s=time.perf_counter() - t0, pid=os.getpid())
    trace_wall_s = time.perf_counter() - t0
    return [_evaluate(task, workload, h, trace_wall_s) for h in task.hardware]


def _check_names(preset: str, parallels: Sequence[str], hardware: Sequence[str], schedule: str | None) -> None:
    """Reject names that would fail every configuration, before starting any process."""
    from commsched import hardware as hw_profiles
    from commsched.passes import resolve_passes
    from commsched.workloads import PARALLELISMS, get_preset

    get_preset(preset)  # ValueError naming the known presets
    for p in parallels:
        if p not in PARALLELISMS:
            raise ValueError(f"parallel {p!r}: expected one of {', '.join(PARALLELISMS)}")
    for h in hardware:
        try:
            hw_profiles.get(h)
        except FileNotFoundError as exc:
            raise ValueError(str(exc)) from None
    if schedule is not None:
        try:
            resolve_passes(schedule)
        except ValueError as exc:
            raise ValueError(f"schedule {schedule!r}: {exc}") from None


def _as_list(value: str | Sequence[Any], what: str) -> list[Any]:
    items = [value] if isinstance(value, (str, int)) else list(value)
    if not items:
        raise ValueError(f"{what}: expected at least one value")
    if len(set(items)) != len(items):
        raise ValueError(f"{what}: duplicate values in {items}")
    return items


def _spawn_context() -> multiprocessing.context.BaseContext:
    return multiprocessing.get_context("spawn")


def _worker_init() -> None:
    # Ctrl-C reaches the whole process group: a worker just exits (its task becomes error rows) and the sweeping
    # process raises KeyboardInterrupt, rather than every worker printing a traceback from deep inside torch
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))


def default_processes() -> int:
    """One per CPU. Workers warm up before they take a trace and this process traces too, so an extra process
    costs little even where it cannot help (benchmarks/RESULTS.md: about even on 2 busy cores for 1 s traces,
    1.3-1.5x faster for 8 s ones)."""
    return os.cpu_count() or 1


def run_sweep(
    preset: str,
    *,
    parallel: str | Sequence[str],
    world_sizes: int | Sequence[int],
    hardware: str | Sequence[str],
    layers: int | None = None,
    schedule: str | None = "default",
    processes: int | None = None,
    in_process: bool = True,
    gpus_per_node: int | None = None,
    progress: bool = False,
    console: Any = None,
    on_rows: Callable[[list[SweepRow]], None] | None = None,
    **build_kw: Any,
) -> list[SweepRow]:
    """Simulate ``preset`` for every (parallel, world_size, hardware), rows in that nested order of the arguments.

    ``schedule``: a pass preset or comma-separated passes for :func:`commsched.passes.schedule` ("default" is our
    scheduler), or None to report the traced order only. ``processes``: processes tracing at once, this one
    included (default: one per trace, at most one per CPU); 1 runs everything in this process.
    ``in_process=False`` keeps this process out of it: ``processes`` spawned workers do all the traces (unless their
    pool breaks, then the rest run here). Nodes per
    configuration: ``ceil(world_size / gpus_per_node)`` (the profile's GPUs per node unless ``gpus_per_node`` is
    given). ``build_kw`` go to :func:`commsched.workloads.build` (``seq_len``, ``batch``, ``mode``, ``tp_size``,
    ...); ``tp_size`` / ``ep_size`` only to parallelisms with a tp / ep dimension. ``progress`` shows a rich
    progress bar on ``console`` (default: stderr); ``on_rows`` receives each trace's rows, in this process, as
    they finish.
    Raises ValueError for names that fail everywhere; a failing configuration is a row with ``error`` set.
    """
    parallels = _as_list(parallel, "parallel")
    worlds = _as_list(world_sizes, "world_sizes")
    profiles = tuple(_as_list(hardware, "hardware"))
    for w in worlds:
        if not isinstance(w, int) or isinstance(w, bool) or w < 1:
            raise ValueError(f"world_sizes: {w!r} is not a positive integer")
    if processes is not None and processes < 1:
        raise ValueError(f"processes={processes}: expected >= 1")
    if gpus_per_node is not None and gpus_per_node < 1:
        raise ValueError(f"gpus_per_node={gpus_per_node}: expected >= 1")
    _check_names(preset, parallels, profiles, schedule)

    tasks = [
        _TraceTask(i, preset, p, w, profiles, layers, schedule, gpus_per_node, tuple(sorted(build_kw.items())))
        for i, (p, w) in enumerate((p, w) for p in parallels for w in worlds)
    ]
    jobs = min(len(tasks), processes or default_processes())
    workers = jobs if not in_process else jobs - 1
    results: dict[int, list[SweepRow]] = {}
    bar = _Progress(len(tasks) * len(profiles), console) if progress else None

    def finish(task: _TraceTask, rows: list[SweepRow]) -> None:
        results[task.index] = rows
        if bar is not None:
            bar.advance(len(rows), f"{task.parallel} world {task.world_size}")
        if on_rows is not None:
            on_rows(rows)

    try:
        if workers == 0:
            for task in tasks:
                if bar is not None:
                    bar.describe(f"tracing {task.parallel} world {task.world_size}")
                finish(task, _run_task(task))
        else:
            _run_pool(tasks, workers, in_process, finish, bar)
    finally:
        if bar is not None:
            bar.close()
    return [row for i in range(len(tasks)) for row in results[i]]


def _warm_up() -> int:
    """A worker's first call: import torch and trace a tiny model, so that the lazy imports of the first trace
    (sympy, dynamo: seconds) happen before the worker asks for real work."""
    from commsched.workloads import build

    build("llama-tiny", parallel="fsdp", world_size=2, layers=1)
    return os.getpid()


class _Board:
    """The shared state of a pooled sweep: tasks not handed out (``todo``), tasks a worker is on (``in_flight``,
    in hand-out order), tasks finished (``done``). Callbacks run on the pool's result thread, so every access holds
    ``lock``; finished rows travel to the sweeping thread through ``finished`` (None: a wake-up)."""

    def __init__(self, tasks: list[_TraceTask], run_here: bool) -> None:
        self.todo = collections.deque(tasks)
        self.in_flight: dict[int, _TraceTask] = {}
        self.done: set[int] = set()
        self.run_here = run_here
        self.lock = threading.Lock()
        self.finished: queue.SimpleQueue[tuple[_TraceTask, list[SweepRow]] | None] = queue.SimpleQueue()

    def next_for_worker(self) -> _TraceTask | None:
        with self.lock:
            if not self.todo:
                return None
            task = self.todo.popleft()
            self.in_flight[task.index] = task
            return task

    def give_back(self, task: _TraceTask) -> None:
        """A task the pool refused (broken or shut down): this process will run it."""
        with self.lock:
            self.in_flight.pop(task.index, None)
            self.todo.appendleft(task)
            self.run_here = True
        self.finished.put(None)

    def next_for_here(self) -> _TraceTask | None:
        """The last task not handed out, if this process traces too (or took over from a failed pool).

        It does not re-run a task a worker holds, to finish first: tried, it lost on a busy machine, since this
        process cannot stop its copy when the worker's result comes in."""
        with self.lock:
            return self.todo.pop() if self.run_here and self.todo else None

    def record(self, task: _TraceTask, rows: list[SweepRow], finish: Callable) -> None:
        """Count the result of ``task``, once (called on the sweeping thread only)."""
        with self.lock:
            self.in_flight.pop(task.index, None)
            first = task.index not in self.done
            self.done.add(task.index)
        if first:
            finish(task, rows)


def _run_pool(tasks: list[_TraceTask], workers: int, in_process: bool, finish: Callable, bar: _Progress | None) -> None:
    """Run ``tasks`` in ``workers`` spawned processes and, if ``in_process``, in this one; each takes the next task
    when it is free.

    Workers take tasks from the front of the list, this process from the back. A worker gets its first task only
    once it has warmed up, so a slow start never holds a task, and its next task from the pool's result thread
    (a done-callback submits it), so it never waits on this process. A dead worker's task becomes error rows; if
    the pool breaks, the tasks not yet handed out run here. At the end, workers still busy are terminated.
    """
    board = _Board(tasks, in_process)

    def rows_of(task: _TraceTask, fut: Future) -> list[SweepRow]:
        try:
            return fut.result()
        # the worker died (killed, out of memory), could not start, or was interrupted; BaseException too, because
        # anything raised here would kill the pool's result thread and leave the workers waiting forever
        except BaseException as exc:
            return _error_rows(task, _error_text("worker", exc))

    def feed(pool: ProcessPoolExecutor) -> None:
        task = board.next_for_worker()
        if task is None:
            return
        try:
            fut = pool.submit(_run_task, task)
        except Exception:  # the pool is broken or shutting down
            board.give_back(task)
            return
        fut.add_done_callback(lambda f, t=task: (board.finished.put((t, rows_of(t, f))), feed(pool)))

    def ready(pool: ProcessPoolExecutor, fut: Future) -> None:
        if fut.cancelled() or fut.exception() is not None:
            with board.lock:
                board.run_here = True
            board.finished.put(None)
        else:
            feed(pool)

    if bar is not None:
        bar.describe(f"starting {workers} worker process(es)")
    pool = ProcessPoolExecutor(workers, mp_context=_spawn_context(), initializer=_worker_init)
    try:
        for _ in range(workers):
            pool.submit(_warm_up).add_done_callback(lambda f: ready(pool, f))
        while len(board.done) < len(tasks):
            try:
                item = board.finished.get_nowait()
            except queue.Empty:
                task = board.next_for_here()
                if task is not None:
                    if bar is not None:
                        bar.describe(f"tracing {task.parallel} world {task.world_size}")
                    board.record(task, _run_task(task), finish)
                    continue
                item = board.finished.get()  # workers have every task left, or the pool failed (None)
            if item is not None:
                board.record(*item, finish)
    except BaseException:  # e.g. Ctrl-C: hand out nothing more
        with board.lock:
            board.todo.clear()
        raise
    finally:
        _stop_workers(pool)


def _stop_workers(pool: ProcessPoolExecutor) -> None:
    """Shut ``pool`` down without waiting for calls still running (warm-ups, tasks this process finished first,
    tasks after an interrupt)."""
    if hasattr(pool, "terminate_workers"):  # Python >= 3.14
        pool.terminate_workers()
        return
    # what terminate_workers does, for older Pythons: copy the processes before shutdown forgets them
    processes = dict(getattr(pool, "_processes", None) or {})
    pool.shutdown(wait=False, cancel_futures=True)
    for proc in processes.values():
        try:
            if proc.is_alive():
                proc.terminate()
        except (ValueError, ProcessLookupError):  # already exited and closed
            continue


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

"""The local backend: this process and ``jobs - 1`` spawned worker processes take tasks from one list.

Workers are *spawned*: fresh interpreters that import torch themselves, because torch after ``fork`` can deadlock on
locks or threads the parent held. A worker warms up first (:func:`commsched.execute.base.warm_up`: imports, a tiny
trace, seconds) and only then takes a task, so a slow start never holds work this process could have done; this
process has imported torch anyway, so it works rather than waits. Workers take tasks from the front of the list, this
process from the back. The pool lives as long as the executor, so a second ``map`` finds its workers warm.

A worker that dies (SIGKILL, out of memory) turns its task into ``fail(spec, ...)``; if the pool breaks, the tasks
not handed out run here. Ctrl-C reaches the whole process group: workers exit at once, this process raises
KeyboardInterrupt out of ``map`` and :meth:`LocalExecutor.close` terminates and reaps every worker.
"""

from __future__ import annotations

import collections
import multiprocessing
import os
import queue
import signal
import threading
from collections.abc import Sequence
from concurrent.futures import Future, ProcessPoolExecutor
from typing import Any

from commsched.execute.base import (
    ExecutorError,
    Fail,
    OnResult,
    check_versions,
    default_jobs,
    error_text,
    resolve_fn,
    warm_up,
)


def call(fn: str, spec: Any) -> Any:
    """Run one task (in a worker or here)."""
    return resolve_fn(fn)(spec)


def _worker_init() -> None:
    # Ctrl-C reaches the whole process group: a worker just exits, rather than printing a traceback from deep
    # inside torch; the driver raises KeyboardInterrupt and reaps it
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))


class _Board:
    """The shared state of one ``map``: task indices not handed out (``todo``), being run by a worker
    (``in_flight``), finished (``done``). Callbacks run on the pool's result thread, so every access holds ``lock``;
    finished results travel to the driving thread through ``finished`` (None: a wake-up)."""

    def __init__(self, n: int, run_here: bool) -> None:
        self.todo = collections.deque(range(n))
        self.in_flight: set[int] = set()
        self.done: set[int] = set()
        self.run_here = run_here
        self.lock = threading.Lock()
        self.finished: queue.SimpleQueue[tuple[int, Any] | None] = queue.SimpleQueue()

    def next_for_worker(self) -> int | None:
        with self.lock:
            if not self.todo:
                return None
            index = self.todo.popleft()
            self.in_flight.add(index)
            return index

    def give_back(self, index: int) -> None:
        """A task the pool refused (broken or shut down): this process will run it."""
        with self.lock:
            self.in_flight.discard(index)
            self.todo.appendleft(index)
            self.run_here = True
        self.finished.put(None)

    def fall_back(self) -> None:
        """The pool failed to start: this process runs what is left."""
        with self.lock:
            self.run_here = True
        self.finished.put(None)

    def next_for_here(self) -> int | None:
        """The last task not handed out, if this process runs tasks too (or took over from a failed pool). It never
        re-runs a task a worker holds: tried, it lost on a busy machine, since it cannot stop the worker's copy."""
        with self.lock:
            return self.todo.pop() if self.run_here and self.todo else None

    def record(self, index: int) -> bool:
        """Count ``index`` as done; False if it already was (called on the driving thread only)."""
        with self.lock:
            self.in_flight.discard(index)
            first = index not in self.done
            self.done.add(index)
        return first


class LocalExecutor:
    """``jobs`` processes run tasks: this one (unless ``in_process=False``) and spawned workers (see the module
    docstring). ``jobs=1`` runs every task here, in order."""

    name = "local"

    def __init__(self, *, jobs: int | None = None, in_process: bool = True, progress: Any = None) -> None:
        if jobs is not None and jobs < 1:
            raise ValueError(f"jobs={jobs}: expected >= 1")
        self.jobs = jobs or default_jobs()
        self.in_process = in_process
        self.progress = progress
        self._pool: ProcessPoolExecutor | None = None
        self._warm = 0  # workers that have warmed up
        self._board: _Board | None = None
        self._broken: BaseException | None = None  # why a worker could not start
        self._lock = threading.Lock()

    def _say(self, text: str) -> None:
        if self.progress is not None:
            self.progress.describe(text)

    def map(self, fn: str, specs: Sequence[Any], *, fail: Fail, on_result: OnResult | None = None) -> list[Any]:
        """Results of ``fn`` over ``specs`` in their order (see :class:`commsched.execute.base.Executor`)."""
        n = len(specs)
        results: list[Any] = [None] * n

        def finish(index: int, result: Any) -> None:
            results[index] = result
            if on_result is not None:
                on_result(index, result)

        workers = min(n, self.jobs) - (1 if self.in_process else 0)
        if workers <= 0:
            for i, spec in enumerate(specs):
                finish(i, self._here(fn, spec, fail))
            return results
        self._run_pool(fn, specs, workers, fail, finish)
        return results

    def prestart(self, n_tasks: int) -> LocalExecutor:
        """Start the workers a ``map`` of ``n_tasks`` would use now, so that they import and warm up while this
        process does something else; returns self."""
        workers = min(n_tasks, self.jobs) - (1 if self.in_process else 0)
        if workers > 0:
            self._start(workers)
        return self

    @staticmethod
    def _here(fn: str, spec: Any, fail: Fail) -> Any:
        try:
            return call(fn, spec)
        except Exception as exc:  # a task function that raised after all: its task fails, the run goes on
            return fail(spec, error_text("task", exc))

    def _start(self, workers: int) -> ProcessPoolExecutor:
        if self._pool is None:
            self._say(f"starting {workers} worker process(es)")
            ctx = multiprocessing.get_context("spawn")
            self._pool = ProcessPoolExecutor(workers, mp_context=ctx, initializer=_worker_init)
            for _ in range(workers):
                self._pool.submit(warm_up).add_done_callback(self._on_warm)
        return self._pool

    def _on_warm(self, fut: Future) -> None:
        error: BaseException | None = None
        try:
            info = fut.result()
            check_versions(info, f"worker {info['pid']}")
        except BaseException as exc:  # it could not start, or runs other code (ExecutorError: the run stops)
            error = exc
        with self._lock:
            board = self._board
            self._warm += error is None
            self._broken = self._broken or error
        if board is None:  # between maps: the next map sees _warm / _broken
            return
        if error is None:
            self._feed(board)
        else:
            board.fall_back()

    def _feed(self, board: _Board) -> None:
        index = board.next_for_worker()
        if index is None:
            return
        spec = self._specs[index]
        try:
            fut = self._pool.submit(call, self._fn, spec)
        except Exception:  # the pool is broken or shutting down
            board.give_back(index)
            return

        def done(f: Future) -> None:
            try:
                result = f.result()
            # the worker died (killed, out of memory) or was interrupted; BaseException too, because anything
            # raised here would kill the pool's result thread and leave the workers waiting forever
            except BaseException as exc:
                result = self._fail(spec, error_text("worker", exc))
            board.finished.put((index, result))
            if board is self._board:
                self._feed(board)

        fut.add_done_callback(done)

    def _run_pool(self, fn: str, specs: Sequence[Any], workers: int, fail: Fail, finish) -> None:
        self._fn, self._specs, self._fail = fn, specs, fail
        board = _Board(len(specs), self.in_process)
        pool = self._start(workers)
        with self._lock:
            self._board = board
            warm, broken = self._warm, self._broken
        for _ in range(warm):  # workers warmed by an earlier map take work at once
            self._feed(board)
        if broken is not None:
            board.fall_back()
        try:
            while len(board.done) < len(specs):
                try:
                    item = board.finished.get_nowait()
                except queue.Empty:
                    index = board.next_for_here()
                    if index is not None:
                        if board.record(index):
                            finish(index, self._here(fn, specs[index], fail))
                        continue
                    item = board.finished.get()  # workers have every task left, or the pool failed (None)
                if isinstance(self._broken, ExecutorError):  # a worker of other versions: no run at all
                    raise self._broken
                if item is not None and board.record(item[0]):
                    finish(*item)
        except BaseException:  # e.g. Ctrl-C: hand out nothing more
            with board.lock:
                board.todo.clear()
            raise
        finally:
            with self._lock:
                self._board = None
            if board.in_flight:  # this process finished them first, or an interrupt: workers still busy
                self.close()
        del pool

    def worker_pids(self) -> list[int]:
        """The worker processes alive now (for tests and diagnostics)."""
        procs = dict(getattr(self._pool, "_processes", None) or {})
        return [p.pid for p in procs.values() if p.is_alive()]

    def close(self) -> None:
        """Terminate and reap every worker without waiting for calls still running; idempotent."""
        pool, self._pool = self._pool, None
        self._warm, self._broken = 0, None
        if pool is None:
            return
        processes = list((getattr(pool, "_processes", None) or {}).values())
        pool.shutdown(wait=False, cancel_futures=True)
        for proc in processes:
            try:
                if proc.is_alive():
                    proc.terminate()
            except (ValueError, ProcessLookupError):  # already exited and closed
                continue
        for proc in processes:
            try:
                proc.join(3.0)
                if proc.is_alive():
                    proc.kill()
                    proc.join(1.0)
            except (ValueError, AssertionError):
                continue

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

"""The local backend: this process and ``jobs - 1`` worker processes take tasks from one list.

**How workers start.** Where the platform has ``fork`` (Linux), this process imports what a task imports first (the
``warm_imports`` of the task function's module: for a sweep, torch, a first trace's lazy imports and the passes)
and then forks its workers, which start at once with all that loaded; where the module has no ``warm_imports``, it
runs the first task itself before forking (with ``in_process=False``: after
:func:`commsched.execute.base.warm_up`, a tiny trace). A spawned worker spends seconds of CPU on those imports
again, which on a few busy cores costs more than the work it takes; forking after the imports rather than after a
first task lets the workers trace while this process traces its first configuration (benchmarks/RESULTS.md, issue
24). No thread of this module runs while it forks, and a child opens new stdout / stderr objects (a lock another
thread held at the fork stays held in the child); torch on CPU is used after fork as its DataLoader workers use it,
with one intra-op thread each (a GNU OpenMP pool does not survive a fork). Elsewhere, with ``start="spawn"``, or
once this process has initialised CUDA, workers are spawned (fresh interpreters) and warm up before they take work.

**Who runs what.** Workers take tasks from the front of the list, this process (unless ``in_process=False``) from the
back; a task is never run twice. One thread per worker here sends it a task over a pipe and waits for the reply or
the worker's death. The workers live as long as the executor, so a second ``map`` finds them warm.

**Failures.** A worker that dies (SIGKILL, out of memory) turns its task into ``fail(spec, ...)`` and a replacement
is *spawned* (never forked: this process is then running tasks on other threads, and a fork would copy their
locks) and takes the rest of the work once warm. A worker that cannot start leaves its work to the others and to
this process; one of other versions stops the run (:class:`~commsched.execute.base.ExecutorError`). Ctrl-C reaches
the whole process group: workers exit at once, this process raises KeyboardInterrupt out of ``map`` and
:meth:`LocalExecutor.close` terminates and reaps every worker.
"""

from __future__ import annotations

import collections
import gc
import multiprocessing
import os
import queue
import signal
import sys
import threading
from collections.abc import Sequence
from multiprocessing.connection import wait
from typing import Any

from commsched.execute.base import (
    ExecutorError,
    Fail,
    OnResult,
    call,
    check_versions,
    default_jobs,
    error_text,
    hello,
    versions,
    warm_imports_of,
    warm_up,
)


def default_start() -> str:
    """``fork`` where the platform has it safely (Linux), else ``spawn``."""
    return "fork" if sys.platform == "linux" and "fork" in multiprocessing.get_all_start_methods() else "spawn"


def _worker_main(conn: Any, forked: bool) -> None:
    """A worker's life: warm up (a forked one is warm) and say hello, then answer ``(fn, spec)`` messages with
    ``("ok", result)`` or ``("raised", text)`` until the pipe closes or says None."""
    # Ctrl-C reaches the whole process group: a worker just exits, rather than printing a traceback from deep
    # inside torch; the driver raises KeyboardInterrupt and reaps it
    signal.signal(signal.SIGINT, lambda *_: os._exit(130))
    if forked:
        _after_fork()
    try:
        conn.send(("hello", hello() if forked else warm_up()))
    except Exception as exc:
        conn.send(("error", error_text("warm-up", exc)))
        os._exit(1)
    while True:
        try:
            message = conn.recv()
        except (EOFError, OSError):
            os._exit(0)
        if message is None:
            os._exit(0)
        try:
            reply = ("ok", call(*message))
        except Exception as exc:  # a task function that raised after all: its task fails, the run goes on
            reply = ("raised", error_text("task", exc))
        conn.send(reply)


def _after_fork() -> None:
    """Fresh stdout / stderr objects (their locks may have been held by another thread of the parent), and one
    intra-op thread for torch (see the module docstring)."""
    for name in ("stdout", "stderr"):
        stream = getattr(sys, name)
        try:
            setattr(sys, name, open(stream.fileno(), "w", buffering=1, closefd=False))  # noqa: SIM115
        except (AttributeError, OSError, ValueError):  # not a real file (a test's capture): keep it
            continue
    if "torch" in sys.modules:
        sys.modules["torch"].set_num_threads(1)


def _fork_safe() -> bool:
    """Whether this process may fork workers: not once it has initialised CUDA (a forked child cannot use it)."""
    torch = sys.modules.get("torch")
    return torch is None or not torch.cuda.is_initialized()


class _Died(Exception):
    """The worker process ended before it answered."""


class _Worker:
    """One worker process and this process's end of its pipe."""

    def __init__(self, ctx: Any) -> None:
        self.conn, child = ctx.Pipe()
        self.forked = ctx.get_start_method() == "fork"
        self.proc = ctx.Process(target=_worker_main, args=(child, self.forked), daemon=True, name="commsched-worker")
        self.proc.start()
        child.close()  # only the worker holds its end: its death closes the pipe
        self.lock = threading.Lock()  # held by the one thread talking to it (a map's thread may outlive its map)
        self._stop_lock = threading.Lock()  # a serving thread replacing it and close() may stop it at once

    def reply(self) -> tuple[str, Any]:
        """The worker's next message; _Died if it ended first."""
        try:
            ready = wait([self.conn, self.proc.sentinel])
            if self.conn in ready:  # a reply sent just before dying still counts
                return self.conn.recv()
        except (EOFError, OSError, ValueError):  # it died, or the executor closed (and stopped it)
            pass
        raise _Died(self.how_it_ended())

    def ask(self, fn: str, spec: Any) -> tuple[str, Any]:
        try:
            self.conn.send((fn, spec))
        except (OSError, ValueError):
            raise _Died(self.how_it_ended()) from None
        return self.reply()

    def how_it_ended(self) -> str:
        self.proc.join(1.0)
        code = self.proc.exitcode
        if code is not None and code < 0:
            return f"worker {self.proc.pid} died of signal {signal.Signals(-code).name}"
        return f"worker {self.proc.pid} ended (exit status {code})"

    def stop(self) -> None:
        """Terminate (then kill) and reap the process; idempotent and safe from several threads (a second close
        of the pipe's descriptor would fail, or close another file's)."""
        with self._stop_lock:
            try:
                if self.proc.is_alive():
                    self.proc.terminate()
                self.proc.join(3.0)
                if self.proc.is_alive():
                    self.proc.kill()
                    self.proc.join(1.0)
            except (ValueError, AssertionError):  # already closed
                pass
            if not self.conn.closed:
                self.conn.close()


class _Board:
    """The shared state of one ``map``: task indices not handed out (``todo``), being run by a worker
    (``in_flight``), finished (``done``). Worker threads and the driving thread share it, so every access holds
    ``lock``; finished results travel to the driving thread through ``finished`` (None: a wake-up)."""

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

    def fall_back(self) -> None:
        """No worker can take work: this process runs what is left."""
        with self.lock:
            self.run_here = True
        self.finished.put(None)

    def next_for_here(self) -> int | None:
        """The last task not handed out, if this process runs tasks too (or took over from the workers). It never
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
    """``jobs`` processes run tasks: this one (unless ``in_process=False``) and worker processes, forked or spawned
    (``start``: ``"fork"`` or ``"spawn"``, default :func:`default_start`; see the module docstring). ``jobs=1`` runs
    every task here, in order."""

    name = "local"

    def __init__(self, *, jobs: int | None = None, in_process: bool = True, progress: Any = None,
                 start: str | None = None) -> None:  # fmt: skip
        if jobs is not None and jobs < 1:
            raise ValueError(f"jobs={jobs}: expected >= 1")
        if start not in (None, "fork", "spawn"):
            raise ValueError(f"start={start!r}: expected 'fork' or 'spawn'")
        self.jobs = jobs or default_jobs()
        self.in_process = in_process
        self.progress = progress
        self.start = start or default_start()
        self._workers: list[_Worker] = []
        self._greeted: set[int] = set()  # pids of workers that said hello
        self._board: _Board | None = None
        self._broken: ExecutorError | None = None  # a worker of other versions
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

        workers = self._needed(n)
        if workers <= 0:
            for i, spec in enumerate(specs):
                finish(i, self._here(fn, spec, fail))
            return results
        self._run_pool(fn, specs, workers, fail, finish)
        return results

    def _needed(self, n_tasks: int) -> int:
        return min(n_tasks, self.jobs) - (1 if self.in_process else 0)

    def prestart(self, n_tasks: int) -> LocalExecutor:
        """Spawning: start the workers a ``map`` of ``n_tasks`` would use now, so that they warm up while this
        process does something else (forked workers start in ``map``, warm); returns self."""
        if self.start == "spawn":
            self._start(self._needed(n_tasks))
        return self

    @staticmethod
    def _here(fn: str, spec: Any, fail: Fail) -> Any:
        try:
            return call(fn, spec)
        except Exception as exc:  # a task function that raised after all: its task fails, the run goes on
            return fail(spec, error_text("task", exc))

    def _start(self, workers: int) -> None:
        missing = workers - len(self._workers)
        if missing <= 0:
            return
        start = "fork" if self.start == "fork" and _fork_safe() else "spawn"
        if start == "fork" and not self.in_process:  # else this process has just warmed up (_warm_here)
            self._say("warming up")
            warm_up()  # once per process: the forked workers inherit it
        self._say(f"starting {missing} worker process(es)")
        ctx = multiprocessing.get_context(start)
        # a forked child's collections skip what is frozen: fewer of its pages copied on write. A process that froze
        # its imports (commsched.heap.imports_settled: nearly all it holds) forks as it is: unfreezing after the
        # fork would thaw them too; any other freezes everything for the fork only
        freeze_for_fork = start == "fork" and gc.get_freeze_count() == 0
        if start == "fork":
            versions()  # once, here: a forked worker's hello() answers with it (a hash of the source files)
        if freeze_for_fork:
            gc.freeze()
        try:
            new = [_Worker(ctx) for _ in range(missing)]
        finally:
            if freeze_for_fork:
                gc.unfreeze()
        with self._lock:
            self._workers += new

    def _warm_here(self, fn: str, specs: Sequence[Any], board: _Board, fail: Fail, finish) -> None:
        """Before forking: import what a task imports first (its module's ``warm_imports``), or where the module has
        none (or it fails), run the first task here; the workers forked next start with what this loaded."""
        warm = warm_imports_of(fn)
        if warm is not None:
            self._say("importing torch")
            try:
                warm()
                return
            except Exception:  # e.g. torch cannot load: the first task here turns that into its error result
                pass
        index = board.next_for_here()
        board.record(index)
        finish(index, self._here(fn, specs[index], fail))

    def _serve(self, worker: _Worker, board: _Board) -> None:
        """One worker's thread during a map: greet it, then hand it tasks until none are left. A worker that dies
        fails its task and is replaced; one that cannot start leaves its work to the others and to this process."""
        while True:
            index = None
            try:
                with worker.lock:
                    if worker.proc.pid not in self._greeted:
                        self._greet(worker)
                    index = board.next_for_worker()
                    if index is None:
                        return
                    kind, value = worker.ask(self._fn, self._specs[index])
                result = value if kind == "ok" else self._fail(self._specs[index], value)
                board.finished.put((index, result))
            except _Died as exc:
                if index is None:  # it could not start: no replacement (the next map starts a new one)
                    with self._lock:
                        self._workers = [w for w in self._workers if w is not worker]
                    board.fall_back()
                    return
                board.finished.put((index, self._fail(self._specs[index], f"worker: {exc}")))
                worker = self._replace(worker, board)
                if worker is None:
                    return
            except ExecutorError as exc:  # other versions: the run stops
                self._broken = exc
                board.finished.put(None)
                return
            except Exception as exc:  # this thread's own failure (e.g. Ctrl-C closed the executor under it)
                if index is not None:  # the driver waits for every task: never leave one unanswered
                    board.finished.put((index, self._fail(self._specs[index], error_text("worker", exc))))
                board.fall_back()
                return

    def _greet(self, worker: _Worker) -> None:
        kind, info = worker.reply()
        if kind != "hello":
            worker.stop()
            raise _Died(str(info))
        check_versions(info, f"worker {info['pid']}")
        self._greeted.add(info["pid"])

    def _replace(self, dead: _Worker, board: _Board) -> _Worker | None:
        """A spawned worker in place of ``dead`` (None once the map is over or the executor closed)."""
        dead.stop()
        with self._lock:
            if board is not self._board:
                return None
            new = _Worker(multiprocessing.get_context("spawn"))
            self._workers = [new if w is dead else w for w in self._workers]
        return new

    def _run_pool(self, fn: str, specs: Sequence[Any], workers: int, fail: Fail, finish) -> None:
        self._fn, self._specs, self._fail = fn, specs, fail
        board = _Board(len(specs), self.in_process)
        with self._lock:
            self._board = board
        try:
            if self.start == "fork" and self.in_process and len(self._workers) < workers:
                self._warm_here(fn, specs, board, fail, finish)
            self._start(workers)
            for worker in self._workers[:workers]:
                threading.Thread(target=self._serve, args=(worker, board), daemon=True).start()
            self._drive(board, fn, specs, fail, finish)
        except BaseException:  # e.g. Ctrl-C: hand out nothing more
            with board.lock:
                board.todo.clear()
            raise
        finally:
            with self._lock:
                self._board = None
            if board.in_flight:  # an interrupt or a stopped run: workers still busy
                self.close()

    def _drive(self, board: _Board, fn: str, specs: Sequence[Any], fail: Fail, finish) -> None:
        """This thread: run tasks from the back of the list while there are any, else collect the workers'."""
        while len(board.done) < len(specs):
            try:
                item = board.finished.get_nowait()
            except queue.Empty:
                index = board.next_for_here()
                if index is not None:
                    if board.record(index):
                        finish(index, self._here(fn, specs[index], fail))
                    continue
                item = board.finished.get()  # workers have every task left, or a wake-up (None)
            if self._broken is not None:  # a worker of other versions: no run at all
                raise self._broken
            if item is not None and board.record(item[0]):
                finish(*item)

    def worker_pids(self) -> list[int]:
        """The worker processes alive now (for tests and diagnostics)."""
        return [w.proc.pid for w in list(self._workers) if w.proc.is_alive()]

    def close(self) -> None:
        """Terminate and reap every worker without waiting for calls still running; idempotent."""
        with self._lock:
            workers, self._workers = self._workers, []
            self._broken = None
        for worker in workers:
            try:
                if worker.proc.is_alive():
                    worker.proc.terminate()
            except (ValueError, ProcessLookupError):  # already exited and closed
                continue
        for worker in workers:
            worker.stop()

    def __enter__(self) -> LocalExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

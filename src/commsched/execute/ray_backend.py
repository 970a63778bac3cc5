"""The Ray backend (``pip install 'commsched[ray]'``): long-lived warmed actors, one CPU each, take tasks one at a time.

``RayExecutor("local")`` starts a private Ray instance on this machine (``ray.init(address="local")``: it never
attaches to a cluster that happens to run here) whose workers import this process's commsched; any other address
connects to that running head, whose nodes must have the same commsched, torch and numpy installed (checked: a
worker of other versions ends the run with one line naming both). Each actor warms up once
(:func:`commsched.execute.base.warm_up`) and keeps its process, so the trace cache in its memory and in its node's
cache folder serves every later task. Specs go out and rows come back as plain data.

An actor that dies mid-task (SIGKILL, out of memory) turns its task into ``fail(spec, ...)`` and is replaced; a
lost head ends the run with an ExecutorError naming its address; Ctrl-C kills every actor of this run (the head is
left alone; a ``local`` instance is shut down).
"""

from __future__ import annotations

import os
import socket
import threading
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from commsched.execute.base import ExecutorError, Fail, OnResult, check_versions, default_jobs, error_text

POLL_S = 0.2  # how often the driver wakes up while waiting, so that Ctrl-C is seen at once
HEAD_CHECK_S = 1.0  # how often the driver checks that the head's port still answers
HEAD_LOST_AFTER = 3  # checks that fail in a row before the head counts as lost


def _actor_class(ray: Any) -> Any:
    @ray.remote(num_cpus=1, max_restarts=0, max_concurrency=1)
    class Worker:
        """One warmed worker process: it imports torch and traces a tiny model once, then runs tasks."""

        def __init__(self) -> None:
            from commsched.execute.base import warm_up

            self._info = warm_up()

        def info(self) -> dict[str, Any]:
            return self._info

        def run(self, fn: str, spec: Any) -> Any:
            from commsched.execute.base import call

            return call(fn, spec)

    return Worker


class RayExecutor:
    """Tasks on Ray actors (see the module docstring); ``jobs``: actors (default: the cluster's CPUs, or this
    machine's for ``local``)."""

    name = "ray"

    def __init__(self, address: str, *, jobs: int | None = None, progress: Any = None) -> None:
        import ray

        self.ray, self.address, self.progress = ray, address, progress
        self._say(f"connecting to Ray ({address})")
        self._own = address == "local"
        # ray.init sets variables of this process (RAY_AUTH_MODE, ...) that would follow a later init elsewhere
        self._environ = {k: v for k, v in os.environ.items() if k.startswith("RAY_") or k == "PYTHONBREAKPOINT"}
        try:
            if self._own:
                src = str(Path(__file__).resolve().parents[2])  # the folder that holds this commsched
                path = os.pathsep.join(p for p in (src, os.environ.get("PYTHONPATH", "")) if p)
                ray.init(address="local", num_cpus=jobs or default_jobs(), include_dashboard=False,
                         log_to_driver=False, configure_logging=False, object_store_memory=128 << 20,
                         runtime_env={"env_vars": {"PYTHONPATH": path}})  # fmt: skip
            else:
                ray.init(address=address, log_to_driver=False, configure_logging=False)
        except Exception as exc:
            raise ExecutorError(f"cannot connect to the Ray head at {address}: {error_text('ray', exc)}") from None
        cpus = int(ray.cluster_resources().get("CPU", 1))
        self.jobs = max(1, min(jobs or cpus, cpus))
        self._worker_cls = _actor_class(ray)
        self._actors: list[Any] = []
        self._ready: list[Any] = []
        self._start_error = ""
        self._lost_head = False
        self._head_fails, self._head_checked = 0, time.monotonic()

    def _say(self, text: str) -> None:
        if self.progress is not None:
            self.progress.describe(text)

    def _lost(self, exc: BaseException) -> ExecutorError:
        return ExecutorError(f"lost the Ray head at {self.address}: {error_text('ray', exc)}")

    def _spawn(self) -> Any:
        actor = self._worker_cls.remote()
        self._actors.append(actor)
        return actor

    def map(self, fn: str, specs: Sequence[Any], *, fail: Fail, on_result: OnResult | None = None) -> list[Any]:
        """Results of ``fn`` over ``specs`` in their order (see :class:`commsched.execute.base.Executor`)."""
        ray = self.ray
        n = len(specs)
        results: list[Any] = [None] * n
        todo = list(range(n - 1, -1, -1))  # popped from the end: task order
        starting: dict[Any, Any] = {}  # info ref -> actor still warming up
        running: dict[Any, tuple[Any, int]] = {}  # result ref -> (actor, task index)
        replacements = self.jobs
        want = min(self.jobs, n)
        while len(self._actors) < want:
            actor = self._spawn()
            starting[actor.info.remote()] = actor
        idle = list(self._ready)
        self._say(f"{len(self._ready)} warm Ray actor(s), {len(starting)} starting")
        done = 0
        try:
            while done < n:
                while idle and todo:
                    actor, index = idle.pop(), todo.pop()
                    running[actor.run.remote(fn, specs[index])] = (actor, index)
                self._check_head()
                refs = list(starting) + list(running)
                ready, _ = ray.wait(refs, num_returns=1, timeout=POLL_S) if refs else ([], [])
                for ref in ready:
                    if ref in starting:
                        actor = starting.pop(ref)
                        if self._warmed(ref, actor):
                            idle.append(actor)
                        elif replacements > 0:
                            replacements -= 1
                            new = self._spawn()
                            starting[new.info.remote()] = new
                        continue
                    actor, index = running.pop(ref)
                    results[index], alive = self._result(ref, specs[index], fail)
                    done += 1
                    if on_result is not None:
                        on_result(index, results[index])
                    if alive:
                        idle.append(actor)
                    elif replacements > 0:  # the actor died with its task: a fresh one takes its place
                        replacements -= 1
                        new = self._spawn()
                        starting[new.info.remote()] = new
                if not refs and todo:
                    raise ExecutorError(f"no Ray actor could start on {self.address}: {self._start_error}")
        except BaseException:
            self.close()
            raise
        self._ready = idle + list(starting.values())
        return results

    def _warmed(self, ref: Any, actor: Any) -> bool:
        """Whether a starting actor came up; mixed versions end the run, a lost head too."""
        ray = self.ray
        try:
            info = ray.get(ref)
        except ray.exceptions.RayActorError as exc:  # it could not start (e.g. commsched not importable there)
            self._drop(actor)
            self._start_error = error_text("actor", exc)
            return False
        except ray.exceptions.RayError as exc:
            raise self._lost(exc) from None
        check_versions(info, f"Ray worker {info.get('host')}:{info.get('pid')}")
        return True

    def _result(self, ref: Any, spec: Any, fail: Fail) -> tuple[Any, bool]:
        """(the task's result, whether its actor is still alive)."""
        ray = self.ray
        try:
            return ray.get(ref), True
        except ray.exceptions.RayActorError as exc:  # the worker process died (killed, out of memory)
            return fail(spec, error_text("worker", exc)), False
        except ray.exceptions.RayTaskError as exc:  # the task function raised after all
            return fail(spec, error_text("task", exc.cause if exc.cause else exc)), True
        except ray.exceptions.RayError as exc:
            raise self._lost(exc) from None

    def _check_head(self) -> None:
        """Raise ExecutorError once the head's GCS port has not answered for a few seconds (Ray itself would wait
        a minute, then end this process with a fatal log)."""
        if self._own or time.monotonic() - self._head_checked < HEAD_CHECK_S:
            return
        self._head_checked = time.monotonic()
        host, _, port = self.address.rpartition(":")
        try:
            with socket.create_connection((host, int(port)), timeout=1.0):
                self._head_fails = 0
        except (OSError, ValueError):
            self._head_fails += 1
            if self._head_fails >= HEAD_LOST_AFTER:
                self._lost_head = True
                raise ExecutorError(f"lost the Ray head at {self.address}: it does not answer") from None

    def _drop(self, actor: Any) -> None:
        if actor in self._actors:
            self._actors.remove(actor)

    def close(self) -> None:
        """Kill every actor of this executor (a ``local`` instance is shut down whole); idempotent."""
        ray = self.ray
        if not ray.is_initialized():
            return
        actors, self._actors, self._ready = self._actors, [], []
        if self._lost_head:  # nothing to ask a dead head; its actors died with it, or die when their raylet sees it
            done = threading.Thread(target=ray.shutdown, daemon=True)
            done.start()
            done.join(3.0)
        else:
            for actor in actors:
                try:
                    ray.kill(actor, no_restart=True)
                except Exception:  # already dead
                    continue
            ray.shutdown()
        for key in [k for k in os.environ if k.startswith("RAY_") or k == "PYTHONBREAKPOINT"]:
            if key not in self._environ:
                del os.environ[key]
        os.environ.update(self._environ)

    def __enter__(self) -> RayExecutor:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

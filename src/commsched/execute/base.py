"""The executor interface: map a pure function over task specs, results in task order, on some set of workers.

A task is ``(index, spec)``; the function is named by ``"module:function"`` (so a worker process or a Ray actor
imports it itself) and must be a pure function of its spec: hardware profiles, tables and graphs travel inside the
spec by content, never as a path only the driver can read. It returns plain data (rows: lists and dicts of str,
int, float, None) and never raises for a bad configuration; a task whose worker died or could not run it becomes
``fail(spec, error_text)``, built on the driver. Every backend returns the same list for the same tasks.

Backends: :class:`commsched.execute.local.LocalExecutor` (this process and forked or spawned workers) and
:class:`commsched.execute.ray_backend.RayExecutor` (warmed actors on a Ray cluster), both built on this module;
:func:`commsched.execute.factory.make_executor` picks one. ``import commsched`` imports neither torch nor ray;
``make_executor`` imports a backend when asked for it.
"""

from __future__ import annotations

import functools
import hashlib
import importlib
import os
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any, Protocol

Fail = Callable[[Any, str], Any]
"""``fail(spec, error_text)``: the result of a task that could not run (its worker died, was lost, or refused)"""
OnResult = Callable[[int, Any], None]
"""``on_result(index, result)``: called on the driver's thread as each task finishes, in finishing order"""


class Executor(Protocol):
    """Runs tasks; ``map`` returns their results in task order. ``close`` ends every worker it started (also after
    an interrupt: ``map`` raising KeyboardInterrupt has already stopped handing out work)."""

    name: str

    def map(self, fn: str, specs: Sequence[Any], *, fail: Fail, on_result: OnResult | None = None) -> list[Any]:
        """``[fn(spec) for spec in specs]``, computed wherever the backend runs tasks."""
        ...

    def close(self) -> None:
        """Stop every worker this executor started; idempotent."""
        ...


class ExecutorError(RuntimeError):
    """A run that cannot go on (mixed versions, a lost Ray head); the message is one line for the user."""


def resolve_fn(name: str) -> Callable[[Any], Any]:
    """The function ``"module:function"`` names (imported where the task runs; names come from code, not input)."""
    module, _, attr = name.partition(":")
    if not module or not attr:
        raise ValueError(f"task function {name!r}: expected 'module:function'")
    return getattr(importlib.import_module(module), attr)


def warm_imports_of(fn: str) -> Callable[[], None] | None:
    """The ``warm_imports`` function of task function ``fn``'s module, if it defines one: it imports what that
    module's tasks import first, so that a local pool can fork warm workers before any task has run."""
    module = importlib.import_module(fn.partition(":")[0])
    return getattr(module, "warm_imports", None)


def call(fn: str, spec: Any) -> Any:
    """Run one task: ``fn`` (``"module:function"``, see :func:`resolve_fn`) applied to ``spec``, in this process
    (a worker's, a Ray actor's or the driver's)."""
    return resolve_fn(fn)(spec)


@functools.cache
def source_fingerprint() -> str:
    """A hash of commsched's own source files: two checkouts of one version number with different code differ."""
    root = Path(__file__).resolve().parents[1]
    h = hashlib.sha256()
    for path in sorted(root.rglob("*.py")):
        h.update(str(path.relative_to(root)).encode())
        h.update(path.read_bytes())
    return h.hexdigest()[:12]


@functools.cache
def versions() -> dict[str, str]:
    """The versions that decide a result: commsched (with :func:`source_fingerprint`), torch, numpy. Read from the
    installed distributions, so that a run whose traces are all cached never imports torch (seconds)."""
    from commsched import __version__

    return {
        "commsched_version": f"{__version__}+{source_fingerprint()}",
        "torch_version": _installed("torch"),
        "numpy_version": _installed("numpy"),
    }


def _installed(name: str) -> str:
    """``name``'s version as its distribution records it (as ``name.__version__`` says, e.g. 2.13.0+cpu), else as
    the imported module says."""
    import importlib.metadata

    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:  # e.g. built from source, not installed as a distribution
        return str(importlib.import_module(name).__version__)


def check_versions(theirs: dict[str, str], where: str) -> None:
    """Refuse a worker whose versions differ from this process's: ExecutorError naming both."""
    ours = versions()
    for key, mine in ours.items():
        if theirs.get(key) != mine:
            what = key.removesuffix("_version")
            raise ExecutorError(f"mixed versions: {what} {mine} here, {theirs.get(key)} on {where}; "
                                "install the same commsched, torch and numpy everywhere")  # fmt: skip


def warm_up() -> dict[str, Any]:
    """A worker's first call: import torch and trace a tiny model, so that the lazy imports of a first trace
    (sympy, dynamo: seconds) happen before the worker takes real work; once per process (a forked child inherits
    its parent's). Returns :func:`hello`."""
    _warm_trace()
    return hello()


def hello() -> dict[str, Any]:
    """This process's pid, host and versions (what a worker answers first)."""
    import socket

    return {"pid": os.getpid(), "host": socket.gethostname(), **versions()}


@functools.cache
def _warm_trace() -> None:
    from commsched.workloads import build

    build("llama-tiny", parallel="fsdp", world_size=2, layers=1)


def error_text(stage: str, exc: BaseException) -> str:
    """``"stage: ExceptionType: first line of the message"``, the ``error`` of a failed row."""
    msg = str(exc).strip().splitlines()[0] if str(exc).strip() else ""
    return f"{stage}: {type(exc).__name__}" + (f": {msg}" if msg else "")


def default_jobs() -> int:
    """One per CPU."""
    return os.cpu_count() or 1

"""Choosing a backend: :func:`make_executor` builds the local pool or the Ray backend (it sits above both, which
sit above :mod:`commsched.execute.base`), importing the one it is asked for only then."""

from __future__ import annotations

from typing import Any

from commsched.execute.base import Executor, ExecutorError

EXTRA_HINT = "pip install 'commsched[ray]'"


def ray_available() -> bool:
    """Whether the optional Ray backend can be imported (without importing it)."""
    import importlib.util

    try:
        return importlib.util.find_spec("ray") is not None
    except (ImportError, ValueError):  # a broken install, or ray blocked in sys.modules
        return False


def make_executor(*, jobs: int | None = None, ray_address: str | None = None, progress: Any = None) -> Executor:
    """The local pool (``jobs`` processes, this one included; default one per CPU), or with ``ray_address`` the Ray
    backend (``"local"``: a private Ray instance on this machine; else the address of a running head).
    ``progress``: an object with ``describe(text)`` for start-up messages. Without Ray installed, a
    ``ray_address`` is an ExecutorError naming the extra to install."""
    if ray_address is None:
        from commsched.execute.local import LocalExecutor

        return LocalExecutor(jobs=jobs, progress=progress)
    if not ray_available():
        raise ExecutorError(f"--ray-address needs Ray, which is not installed: {EXTRA_HINT}")
    from commsched.execute.ray_backend import RayExecutor

    return RayExecutor(ray_address, jobs=jobs, progress=progress)

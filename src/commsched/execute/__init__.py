"""Run many independent tasks: one executor interface, a local process pool and an optional Ray backend, plus
the trace cache and the resumable row store (see base.py, local.py, ray_backend.py, factory.py, cache.py).
Importing this package imports neither torch nor ray."""

from commsched.execute.base import Executor, ExecutorError, versions
from commsched.execute.factory import make_executor

__all__ = ["Executor", "ExecutorError", "make_executor", "versions"]

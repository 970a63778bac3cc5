"""Task functions of a module with ``warm_imports`` (a local pool calls it here, then forks): for the executor tests."""

from __future__ import annotations

import os
import time

WARMED_BY: int | None = None  # the process whose warm_imports ran (a forked child inherits it)
FAIL = False  # warm_imports raises, as when torch cannot load


def warm_imports() -> None:
    global WARMED_BY
    if FAIL:
        raise ImportError("cannot import what the tasks need")
    WARMED_BY = os.getpid()


def report(spec: dict) -> dict:
    """After ``spec["sleep_s"]``: the task's x, the process that ran it and the one whose warm_imports it has."""
    time.sleep(spec.get("sleep_s", 0.0))
    return {"x": spec["x"], "pid": os.getpid(), "warmed_by": WARMED_BY}

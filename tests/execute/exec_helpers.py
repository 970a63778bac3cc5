"""Task functions for the executor tests, imported by name in spawned workers (tests/execute is on their sys.path)."""

from __future__ import annotations

import os
import signal
import time


def square_after(spec: dict) -> dict:
    """Sleep ``spec["sleep_s"]``, then return the square of ``spec["x"]`` and the pid that computed it."""
    time.sleep(spec.get("sleep_s", 0.0))
    return {"x": spec["x"], "square": spec["x"] ** 2, "pid": os.getpid()}


def die_in_worker(spec: dict) -> dict:
    """SIGKILL the worker that runs ``spec["die"]`` (never the driver, whose pid is in the spec)."""
    if spec.get("die") and os.getpid() != spec["driver_pid"]:
        os.kill(os.getpid(), signal.SIGKILL)
    return square_after(spec)


def fail(spec: dict, text: str) -> dict:
    return {"x": spec["x"], "error": text}

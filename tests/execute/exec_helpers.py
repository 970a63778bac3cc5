"""Task functions for the executor tests, imported by name in spawned workers (tests/execute is on their sys.path)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]


def square_after(spec: dict) -> dict:
    """Sleep ``spec["sleep_s"]``, then return the square of ``spec["x"]`` and the pid that computed it."""
    time.sleep(spec.get("sleep_s", 0.0))
    return {"x": spec["x"], "square": spec["x"] ** 2, "pid": os.getpid()}


MARKED = False  # set by the first mark_and_report call of a process (a forked child inherits it)


def mark_and_report(spec: dict) -> dict:
    """Whether this process (or the one it was forked from) ran a task before; then mark it."""
    global MARKED
    seen, MARKED = MARKED, True
    time.sleep(spec.get("sleep_s", 0.0))
    return {"x": spec["x"], "pid": os.getpid(), "inherited": seen}


def die_in_worker(spec: dict) -> dict:
    """SIGKILL the worker that runs ``spec["die"]`` (never the driver, whose pid is in the spec)."""
    if spec.get("die") and os.getpid() != spec["driver_pid"]:
        os.kill(os.getpid(), signal.SIGKILL)
    return square_after(spec)


def fail(spec: dict, text: str) -> dict:
    return {"x": spec["x"], "error": text}


def _default_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


def interrupt_cli(args: list[str], tmp_path: Path, ready, env: dict | None = None) -> tuple[int, float, list]:
    """Start ``commsched ARGS`` in its own process group, wait until ``ready(descendants)`` holds, then 2 s more,
    and send SIGINT to the group as a terminal's Ctrl-C does; (exit code, seconds to exit, the descendants seen)."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "COMMSCHED_CACHE_DIR": str(tmp_path / "cache"), **(env or {})}
    # SIGINT as a terminal's shell leaves it: a test run earlier in this process may have left it ignored, and an
    # ignored signal stays ignored in a child (the Ctrl-C would then be lost and the run end normally)
    proc = subprocess.Popen([sys.executable, "-m", "commsched", *args], env=env, cwd=tmp_path,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True,
                            preexec_fn=_default_sigint)  # fmt: skip
    seen: dict[int, psutil.Process] = {}
    deadline = time.monotonic() + 120
    while time.monotonic() < deadline and proc.poll() is None:
        for child in psutil.Process(proc.pid).children(recursive=True):
            seen.setdefault(child.pid, child)
        if ready(list(seen.values())):
            break
        time.sleep(0.2)
    time.sleep(2.0)  # the workers are warming up or tracing
    if proc.poll() is None:
        for child in psutil.Process(proc.pid).children(recursive=True):
            seen.setdefault(child.pid, child)
    t0 = time.monotonic()
    os.killpg(proc.pid, signal.SIGINT)
    try:
        rc = proc.wait(timeout=60)  # the callers bound the exit time themselves; this only ends a hang
    finally:
        if proc.poll() is None:
            proc.kill()
    return rc, time.monotonic() - t0, list(seen.values())


def ray_workers(procs: list) -> list:
    """The processes of commsched's Ray actors among ``procs`` (their title is ``ray::Worker...``)."""
    out = []
    for p in procs:
        try:
            if p.cmdline() and p.cmdline()[0].startswith("ray::Worker"):
                out.append(p)
        except psutil.Error:
            continue
    return out


def alive(procs: list[psutil.Process]) -> list[psutil.Process]:
    out = []
    for p in procs:
        try:
            if p.is_running() and p.status() != psutil.STATUS_ZOMBIE:
                out.append(p)
        except psutil.NoSuchProcess:
            continue
    return out

"""The Ctrl-C safety net of local-pool commands (``cli.common.ctrl_c_deadline``): a process whose cleanup after
Ctrl-C gets stuck still exits 130 within its deadline, with its worker processes killed; one that stops on its own
is not touched."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import psutil

ROOT = Path(__file__).resolve().parents[2]

STUCK = """
import multiprocessing, signal, threading, time
from commsched.cli.common import ctrl_c_deadline

signal.signal(signal.SIGINT, signal.default_int_handler)  # as Python sets it up unless started with SIGINT ignored

def worker():
    time.sleep(60)

if __name__ == "__main__":
    child = multiprocessing.get_context("fork").Process(target=worker)
    child.start()
    print(child.pid, flush=True)
    held = threading.Lock()
    with ctrl_c_deadline(1.0):
        try:
            held.acquire()
            time.sleep(60)
        finally:
            held.acquire()  # a cleanup waiting on what the interrupt left held: never returns
"""

CLEAN = """
import signal, time
from commsched.cli.common import ctrl_c_deadline

signal.signal(signal.SIGINT, signal.default_int_handler)  # as Python sets it up unless started with SIGINT ignored

with ctrl_c_deadline(1.0):
    pass
assert signal.getsignal(signal.SIGINT) is signal.default_int_handler
try:
    with ctrl_c_deadline(1.0):
        print("ready", flush=True)
        time.sleep(60)
except KeyboardInterrupt:
    time.sleep(2.0)  # longer than the deadline: the net must not fire once the block has been left cleanly
    print("cleaned up", flush=True)
"""


def _start(code: str) -> subprocess.Popen:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    return subprocess.Popen([sys.executable, "-c", code], env=env, stdout=subprocess.PIPE, text=True)


def test_a_stuck_cleanup_after_ctrl_c_exits_130_and_kills_the_workers():
    proc = _start(STUCK)
    child = int(proc.stdout.readline())
    time.sleep(0.5)
    t0 = time.monotonic()
    os.kill(proc.pid, signal.SIGINT)  # the parent only: the worker lives on unless the net kills it
    try:
        rc = proc.wait(timeout=10)
        assert rc == 130 and time.monotonic() - t0 < 3.0
        assert not psutil.pid_exists(child) or psutil.Process(child).status() == psutil.STATUS_ZOMBIE
    finally:  # a failing run leaves nothing behind either
        for pid in (proc.pid, child):
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
        proc.wait()


def test_a_run_that_stops_on_its_own_is_left_alone():
    proc = _start(CLEAN)
    assert proc.stdout.readline().strip() == "ready"
    os.kill(proc.pid, signal.SIGINT)
    out, _ = proc.communicate(timeout=10)
    assert proc.returncode == 0 and out.strip() == "cleaned up"

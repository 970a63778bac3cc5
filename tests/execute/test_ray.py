"""The Ray backend: the same rows as the local pool on a private instance and on a head this test starts on
127.0.0.1; a SIGKILLed actor gives error rows; Ctrl-C leaves no actor (and the head untouched). Skipped without Ray
(``pip install 'commsched[ray]'``); each test is light (2 CPUs) and cleans up by process id. The tests share one
head; a private instance runs in a fresh process, started first so that it comes up while the test computes the
rest; the Ctrl-C and lost-head tests have their own."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import tempfile
import threading
import time
from pathlib import Path

import psutil
import pytest
from exec_helpers import ROOT, alive, interrupt_cli, ray_workers

from commsched.execute.factory import ray_available
from commsched.experiments.sweep import SweepRow, run_sweep
from commsched.io import free_port

pytestmark = [
    pytest.mark.ray,
    pytest.mark.slow,
    pytest.mark.skipif(not ray_available(), reason="Ray is not installed: pip install 'commsched[ray]'"),
]
SWEEP = {
    "parallel": ["fsdp", "ddp"],
    "world_sizes": [8, 1024],
    "hardware": ["h100-sxm", "b200"],
    "layers": 2,
    "cache": False,
    "resume": False,
}


class Head:
    """``ray start --head --block`` on 127.0.0.1 with a temporary HOME and temp dir; stopped by its own pid."""

    def __init__(self, src: Path = ROOT / "src") -> None:
        self.home = Path(tempfile.mkdtemp(prefix="rayh", dir="/tmp"))  # short: Ray's socket paths have a limit
        self.port = free_port()
        self.address = f"127.0.0.1:{self.port}"
        env = {**os.environ, "HOME": str(self.home), "PYTHONPATH": str(src),
               "COMMSCHED_CACHE_DIR": str(self.home / "cache")}  # fmt: skip
        cmd = [str(Path(sys.executable).parent / "ray"), "start", "--head", "--node-ip-address", "127.0.0.1",
               "--port", str(self.port), "--num-cpus", "2", "--block", "--include-dashboard=false",
               "--disable-usage-stats", "--temp-dir", str(self.home / "t")]  # fmt: skip
        self.proc = subprocess.Popen(cmd, env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
        self._wait_up()

    def _wait_up(self) -> None:
        deadline = time.monotonic() + 90
        while time.monotonic() < deadline:
            assert self.proc.poll() is None, "ray start exited"
            names = {p.name() for p in self.descendants()}
            if {"gcs_server", "raylet"} <= names:
                time.sleep(3.0)  # the raylet registers with the GCS
                self.started = self.descendants()  # stop() reaps these too, even once orphaned
                return
            time.sleep(0.5)
        raise AssertionError("the Ray head did not come up in 90 s")

    def descendants(self) -> list[psutil.Process]:
        try:
            return psutil.Process(self.proc.pid).children(recursive=True)
        except psutil.NoSuchProcess:
            return []

    def stop(self, *, clean: bool = True) -> None:
        """SIGTERM to ``ray start``, then check that every process of the head is gone (``clean=False``: a head
        whose GCS a test killed leaves its agents orphaned; they are killed by pid without failing)."""
        procs = [psutil.Process(self.proc.pid), *self.descendants()]
        procs += [p for p in self.started if p.pid not in {q.pid for q in procs}]
        self.proc.send_signal(signal.SIGTERM)  # by its own process id, never by name
        self.proc.wait(timeout=60)
        deadline = time.monotonic() + 15
        while alive(procs) and time.monotonic() < deadline:
            time.sleep(0.2)
        left = alive(procs)
        for p in left:  # only this head's own processes, by id
            p.kill()
        shutil.rmtree(self.home, ignore_errors=True)
        assert not left or not clean, f"the head left {[p.pid for p in left]}"


@pytest.fixture(scope="module")
def head():
    h = Head()
    yield h
    h.stop()


class Started:
    """A command started in a fresh process, in a process group of its own, that runs while the test does other
    work: :meth:`output` waits for its stdout (exit code 0), :meth:`stop` ends it if it still runs (Ctrl-C to its
    group, by its id: a private Ray instance of the command is shut down)."""

    def __init__(self, cmd: list[str], env: dict, cwd: Path) -> None:
        self.proc = subprocess.Popen(cmd, env=env, cwd=cwd, stdout=subprocess.PIPE, stderr=subprocess.PIPE,
                                     text=True, start_new_session=True)  # fmt: skip

    def output(self) -> str:
        out, err = self.proc.communicate(timeout=600)
        assert self.proc.returncode == 0, out[-2000:] + err[-2000:]
        return out

    def stop(self) -> None:
        if self.proc.poll() is None:
            os.killpg(self.proc.pid, signal.SIGINT)
            try:
                self.proc.communicate(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.communicate()


def start_sweep_cli(args: list[str], tmp_path: Path) -> Started:
    """``commsched sweep ARGS --json tmp_path/rows.json`` in a fresh process (a private Ray instance in this test
    process would hold Ray's state for a later connection to the head); HOME and the cache are temporary."""
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HOME": str(tmp_path / "home"),
           "COMMSCHED_CACHE_DIR": str(tmp_path / "cache")}  # fmt: skip
    cmd = [sys.executable, "-m", "commsched", "sweep", *args, "--json", str(tmp_path / "rows.json")]
    return Started(cmd, env, tmp_path)


def test_rows_equal_on_every_backend(head, tmp_path):
    rows_of = {**SWEEP, "layers": 1}  # the backends' rows agree or not whatever the step's size
    args = ["llama3-8b", "-p", "fsdp,ddp", "-w", "8,1024", "-H", "h100-sxm,b200", "-l", "1", "--no-cache"]
    ray_local = start_sweep_cli([*args, "-j", "2", "--ray-address", "local"], tmp_path)  # runs meanwhile
    try:
        local1 = run_sweep("llama3-8b", **rows_of, processes=1)
        local2 = run_sweep("llama3-8b", **rows_of, processes=2)
        ray_head = run_sweep("llama3-8b", **rows_of, ray_address=head.address)
        ray_local.output()
    finally:
        ray_local.stop()
    on_ray_local = [SweepRow.from_dict(d) for d in json.loads((tmp_path / "rows.json").read_text())["rows"]]
    assert len(local1) == 8 and all(r.ok for r in local1)
    want = [r.result_dict() for r in local1]
    for name, rows in {"jobs 2": local2, "ray local": on_ray_local, "ray head": ray_head}.items():
        assert [r.result_dict() for r in rows] == want, name
    assert {r.pid for r in ray_head}.isdisjoint({os.getpid()})  # computed on the head's actors
    assert not ray_workers(head.descendants())  # the run's actors are gone, the head is up
    assert {"gcs_server", "raylet"} <= {p.name() for p in head.descendants()}


def test_optimize_gives_the_serial_search_on_ray(head, tmp_path):
    from optimize_helpers import optimized

    from commsched.execute.ray_backend import RayExecutor

    env = {**os.environ, "PYTHONPATH": str(ROOT / "src"), "HOME": str(tmp_path)}
    script = Path(__file__).with_name("optimize_helpers.py")
    local = Started([sys.executable, str(script), "local"], env, tmp_path)  # a private instance, meanwhile
    try:
        serial = optimized("fsdp")
        ex = RayExecutor(head.address)
        try:
            on_head = optimized("fsdp", ex)
        finally:
            ex.close()
        on_local = json.loads(local.output().strip().splitlines()[-1])
    finally:
        local.stop()
    assert sum(t["collectives"] is not None for t in serial["tried"]) >= 20
    assert on_head == serial  # the winner, the candidates' order, every figure and verdict
    assert on_local == json.loads(json.dumps(serial))


def test_a_sigkilled_actor_gives_error_rows_and_the_sweep_completes(head):
    killed: list[int] = []

    def kill_one_busy_actor() -> None:
        deadline = time.monotonic() + 120
        while time.monotonic() < deadline and not killed:
            for p in ray_workers(head.descendants()):
                if p.cmdline()[0].startswith("ray::Worker.run"):
                    time.sleep(0.3)
                    p.send_signal(signal.SIGKILL)
                    killed.append(p.pid)
                    return
            time.sleep(0.1)

    t = threading.Thread(target=kill_one_busy_actor)
    t.start()
    try:
        rows = run_sweep("llama3-8b", **{**SWEEP, "world_sizes": [8, 64, 1024]}, ray_address=head.address)
    finally:
        t.join()
    assert killed, "no actor was seen running a task"
    bad = [r for r in rows if not r.ok]
    assert len(rows) == 12 and len(bad) == 2  # one task: its two hardware rows
    assert all(r.error.startswith("worker: ActorDiedError") or "died" in r.error for r in bad), bad[0].error
    assert len({(r.parallel, r.world_size) for r in bad}) == 1


RAY_EXIT_S = 30.0
"""a Ctrl-C's exit through Ray's teardown: under 5 s on an idle machine, but in the full suite on 2 cores (the other
worker's plan tests running process pools beside Ray's own processes) twice more than 10 s"""


def test_ctrl_c_on_a_head_kills_the_actors_and_leaves_the_head(head, tmp_path):
    # the head itself: its control store and raylet (idle workers of earlier tests may come and go)
    before = {p.pid for p in head.descendants() if p.name() in ("gcs_server", "raylet")}
    assert len(before) == 2
    args = ["sweep", "llama3-8b", "-p", "fsdp,ddp", "-w", "8,64,512", "-l", "2", "--ray-address", head.address]
    rc, exit_s, _ = interrupt_cli(
        args, tmp_path, ready=lambda _: bool(ray_workers(head.descendants())), env={"HOME": str(tmp_path)}
    )
    assert rc == 130 and exit_s < RAY_EXIT_S, exit_s
    deadline = time.monotonic() + 5
    while ray_workers(alive(head.descendants())) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not ray_workers(alive(head.descendants()))
    assert {p.pid for p in alive([psutil.Process(pid) for pid in before if psutil.pid_exists(pid)])} == before


def test_ctrl_c_on_a_private_instance_leaves_nothing(tmp_path):
    args = ["sweep", "llama3-8b", "-p", "fsdp,ddp", "-w", "8,64,512", "-l", "2", "-j", "2", "--ray-address", "local"]
    actors: list[psutil.Process] = []

    def ready(seen: list[psutil.Process]) -> bool:
        actors.extend(ray_workers(seen))  # remembered now: a dead process has no title to read
        return bool(actors)

    rc, exit_s, procs = interrupt_cli(args, tmp_path, ready=ready, env={"HOME": str(tmp_path)})
    assert actors, "no actor started"
    assert rc == 130 and exit_s < RAY_EXIT_S, exit_s
    deadline = time.monotonic() + 5
    while alive(procs) and time.monotonic() < deadline:
        time.sleep(0.2)
    assert not alive(procs), [p.cmdline()[:1] for p in alive(procs)]


def test_a_lost_head_ends_the_run_with_one_line(tmp_path):
    lost = Head()
    proc = None
    try:
        env = {
            **os.environ,
            "PYTHONPATH": str(ROOT / "src"),
            "HOME": str(tmp_path),
            "COMMSCHED_CACHE_DIR": str(tmp_path),
        }
        args = ["sweep", "llama3-8b", "-p", "fsdp,ddp", "-w", "8,64,512", "-l", "2", "--ray-address", lost.address]
        proc = subprocess.Popen([sys.executable, "-m", "commsched", *args], env=env, cwd=tmp_path, text=True,
                                stdout=subprocess.PIPE, stderr=subprocess.PIPE)  # fmt: skip
        deadline = time.monotonic() + 120
        while not ray_workers(lost.descendants()) and time.monotonic() < deadline:
            time.sleep(0.3)
        (gcs,) = [p for p in lost.descendants() if p.name() == "gcs_server"]
        gcs.send_signal(signal.SIGKILL)  # the head's control store dies: the head is lost
        _, err = proc.communicate(timeout=60)
    finally:
        if proc is not None and proc.poll() is None:
            proc.kill()
        lost.stop(clean=False)
    assert proc.returncode == 2
    assert [line for line in err.splitlines() if line.startswith("error")] == [
        f"error: lost the Ray head at {lost.address}: it does not answer"
    ]

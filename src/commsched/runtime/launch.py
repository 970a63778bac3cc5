"""Launching a real run: W local processes (torch.multiprocessing, optionally inside a shaped network namespace),
or the current process as one rank of a ``torchrun`` launch (env:// rendezvous, any number of hosts)."""

from __future__ import annotations

import contextlib
import dataclasses
import os
import signal
import tempfile
import threading
from collections.abc import Callable, Iterator
from pathlib import Path

from commsched.io import atomic_write_text, free_port
from commsched.report.run_report import RunReport
from commsched.report.run_verdict import run_warnings
from commsched.runtime.executor import RunConfig, run_rank
from commsched.runtime.netns import ShapedNetwork

_TORCHRUN_VARS = ("RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT")


def launched_by_torchrun() -> bool:
    """True inside a process that torchrun (or any env:// launcher) started as one rank."""
    return "TORCHELASTIC_RUN_ID" in os.environ or all(v in os.environ for v in _TORCHRUN_VARS)


def enter_rank(rank: int, world: int, port: int, net: ShapedNetwork | None) -> None:
    """Make this spawned process rank ``rank`` of ``world`` (env:// rendezvous on ``port``), inside ``net``."""
    if net is not None:
        net.enter()  # before any socket: the rendezvous and every gloo connection cross the shaped loopback
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), RANK=str(rank), WORLD_SIZE=str(world))
    os.environ["LOCAL_RANK"] = str(rank)


def _entry(rank: int, world: int, port: int, cfg: RunConfig, net: ShapedNetwork | None, backend: str, out: str):
    enter_rank(rank, world, port, net)

    def save(report: RunReport) -> None:
        report.save(Path(out) / "report.json")  # atomically: the parent reads it only whole

    def progress(text: str) -> None:
        atomic_write_text(Path(out) / "progress.txt", text)  # the parent polls it between joins

    run_rank(cfg, backend=backend, on_report=save, on_progress=progress)


def _report_after_exit(folder: Path, exc: BaseException) -> RunReport:
    """The report of a run in which a rank raised or died (``exc``): rank 0 saves it only after the last gather of
    results, so if it exists every rank had finished its steps and the failure came during teardown (gloo can abort
    a rank whose peer closed its sockets first); the report says so in ``teardown_error``. Else RuntimeError."""
    import torch.multiprocessing as mp

    path = folder / "report.json"
    if not path.exists():
        what = "failed" if isinstance(exc, mp.ProcessRaisedException) else "died"
        raise RuntimeError(f"a rank {what}:\n{exc}") from None
    return dataclasses.replace(RunReport.load(path), teardown_error=f"a rank failed after the run completed: {exc}")


@contextlib.contextmanager
def quiet_cpp_warnings():
    # c10d warns once per socket that a client hostname cannot be resolved inside a bare network namespace
    old = os.environ.get("TORCH_CPP_LOG_LEVEL")
    os.environ["TORCH_CPP_LOG_LEVEL"] = "ERROR"
    try:
        yield
    finally:
        if old is None:
            os.environ.pop("TORCH_CPP_LOG_LEVEL", None)
        else:
            os.environ["TORCH_CPP_LOG_LEVEL"] = old


class RunStopped(KeyboardInterrupt):
    """The run was stopped by a signal (SIGINT or SIGTERM): the ranks were terminated on the way out."""

    def __init__(self, signum: int) -> None:
        super().__init__(f"stopped by {signal.Signals(signum).name}")
        self.signum = signum


@contextlib.contextmanager
def signals_stop_the_run() -> Iterator[None]:
    """Inside: SIGTERM and SIGINT raise :class:`RunStopped` in the main thread at once, so every ``finally`` on the
    way out runs (child ranks terminated, the shaped network's namespace and qdiscs deleted) instead of the process
    dying with them left behind. Handlers are restored on exit; outside the main thread this does nothing."""
    if threading.current_thread() is not threading.main_thread():
        yield
        return

    def stop(signum: int, _frame) -> None:
        raise RunStopped(signum)

    old = {sig: signal.signal(sig, stop) for sig in (signal.SIGTERM, signal.SIGINT)}
    try:
        yield
    finally:
        for sig, handler in old.items():
            signal.signal(sig, handler)


def _stop_ranks(processes, grace_s: float = 5.0) -> None:
    """Terminate every rank still running (SIGTERM, then SIGKILL after ``grace_s``) and reap them."""
    import time

    for p in processes:
        if p.is_alive():
            p.terminate()
    deadline = time.monotonic() + grace_s
    for p in processes:
        p.join(max(0.0, deadline - time.monotonic()))
        if p.is_alive():
            p.kill()
            p.join()


def _show_progress(path: Path, shown: str | None, progress: Callable[[str], None] | None) -> str | None:
    """Hand ``progress`` rank 0's progress line when it changed; returns the line shown."""
    if progress is None or not path.exists():
        return shown
    text = path.read_text()
    if text != shown:
        progress(text)
    return text


def join_ranks(context, folder: Path, progress: Callable[[str], None] | None) -> None:
    """Wait for the spawned ranks of ``context`` (``torch.multiprocessing.start_processes(join=False)``), handing
    ``progress`` each new line of ``folder/progress.txt``. A rank that fails raises (``ProcessRaisedException`` /
    ``ProcessExitedException``); any other exit (a signal, Ctrl-C) first stops every rank still running."""
    import torch.multiprocessing as mp

    try:
        shown = None
        while not context.join(timeout=0.5):
            shown = _show_progress(folder / "progress.txt", shown, progress)
    except BaseException as exc:
        # stopped (a signal, Ctrl-C): no rank may outlive the run or its network namespace
        if not isinstance(exc, (mp.ProcessRaisedException, mp.ProcessExitedException)):
            _stop_ranks(context.processes)
        raise


def run_local(
    cfg: RunConfig,
    *,
    network: ShapedNetwork | None = None,
    backend: str | None = None,
    progress: Callable[[str], None] | None = None,
) -> RunReport:
    """Run ``cfg`` on ``spec.plan.world_size`` local processes (spawned; inside ``network`` when given) and return
    rank 0's report, ``network`` described in it. ``backend``: "gloo" (default without CUDA) or "nccl" (default
    with one GPU per rank). Raises RuntimeError when a rank fails (its traceback is in the message), unless it
    failed after every rank had finished its steps (while tearing down): then the report comes back with
    ``teardown_error`` saying so. ``progress``: called with rank 0's latest progress line (ranks started, traced,
    planned, each step) while the ranks run."""
    import torch
    import torch.multiprocessing as mp

    world = cfg.spec.plan.world_size
    if backend is None:
        backend = "nccl" if torch.cuda.is_available() and torch.cuda.device_count() >= world else "gloo"
    if backend not in ("gloo", "nccl"):
        raise ValueError(f"backend={backend!r}: expected 'gloo' or 'nccl'")
    with tempfile.TemporaryDirectory(prefix="commsched-run-") as d, quiet_cpp_warnings():
        context = mp.start_processes(
            _entry, args=(world, free_port(), cfg, network, backend, d), nprocs=world, start_method="spawn", join=False
        )
        try:
            join_ranks(context, Path(d), progress)
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
            report = _report_after_exit(Path(d), exc)
        else:
            path = Path(d) / "report.json"
            if not path.exists():
                raise RuntimeError("rank 0 finished without writing its report")
            report = RunReport.load(path)
    report = dataclasses.replace(report, network=network.describe() if network is not None else None)
    return dataclasses.replace(report, warnings=run_warnings(report))  # their likely causes name the network

"""Real gloo ranks for tests: ``WORLD`` forked processes running one function each, on a free local port."""

from __future__ import annotations

import multiprocessing as mp
from collections.abc import Callable

from commsched.io import free_port


def run_forked_ranks(target: Callable[..., None], world: int, *args: object, timeout_s: float = 60.0) -> None:
    """Run ``target(rank, port, *args)`` on ``world`` forked processes and wait; each must exit 0."""
    ctx, port = mp.get_context("fork"), free_port()
    procs = [ctx.Process(target=target, args=(r, port, *args)) for r in range(world)]
    for p in procs:
        p.start()
    for p in procs:
        p.join(timeout=timeout_s)
        assert p.exitcode == 0, f"rank {procs.index(p)} exited with {p.exitcode}"

"""Measure each node of an FX graph run with real tensors: the ground truth an estimate is checked against."""

from __future__ import annotations

import time
from typing import Any

import torch
import torch.fx


class _TimingInterpreter(torch.fx.Interpreter):
    def __init__(self, gm: torch.fx.GraphModule, sync) -> None:
        super().__init__(gm)
        self.sync = sync
        self.times: dict[str, float] = {}

    def run_node(self, n: torch.fx.Node) -> Any:
        self.current = n.name
        return super().run_node(n)

    def call_function(self, target: Any, args: Any, kwargs: Any) -> Any:
        # time the op alone: the interpreter's own argument handling stays outside the timer
        self.sync()
        t0 = time.perf_counter()
        out = target(*args, **kwargs)
        self.sync()
        self.times[self.current] = time.perf_counter() - t0
        return out


def time_fx_nodes(gm: torch.fx.GraphModule, *args: Any, reps: int = 5, warmup: int = 1) -> dict[str, float]:
    """Wall seconds of every ``call_function`` node, the best of ``reps`` runs of ``gm(*args)`` (eager, one op at a
    time, device synchronised around each op; the best run is the one least disturbed on a shared machine)."""
    cuda = any(isinstance(a, torch.Tensor) and a.is_cuda for a in args)
    sync = torch.cuda.synchronize if cuda else (lambda: None)
    runs: dict[str, list[float]] = {}
    for r in range(warmup + reps):
        interp = _TimingInterpreter(gm, sync)
        with torch.no_grad():
            interp.run(*args)
        if r >= warmup:
            for k, v in interp.times.items():
                runs.setdefault(k, []).append(v)
    return {k: min(v) for k, v in runs.items()}

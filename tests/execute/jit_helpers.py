"""A sweep's task function, reporting what numba's compiled loops had done in the process that ran it: for
tests/execute/test_jit_preload.py (a local pool calls this module's ``warm_imports`` here, then forks)."""

from __future__ import annotations

import os
from typing import Any

from commsched.experiments import sweep_task
from commsched.sim.jit import entry_loops

AFTER_WARM: dict[str, list[int]] | None = None  # loops_state() right after warm_imports (a forked child inherits it)


def specs() -> list[dict[str, Any]]:
    """Two sweep tasks: llama3-8b fsdp, 1 layer, worlds 8 and 64, on h100-sxm, the default schedule."""
    from commsched import hardware

    return [
        {"index": i, "preset": "llama3-8b", "parallel": "fsdp", "world_size": w, "layers": 1, "schedule": "default",
         "gpus_per_node": None, "build_kw": {}, "hardware": [("h100-sxm", hardware.get("h100-sxm"))],
         "optimize": [False], "cache": False}
        for i, w in enumerate((8, 64))
    ]  # fmt: skip


def loops_state() -> dict[str, list[int]]:
    """Each entry loop: [signatures held, loads from the disk cache, compilations] in this process so far."""
    return {
        name: [len(d.signatures), sum(d.stats.cache_hits.values()), sum(d.stats.cache_misses.values())]
        for name, d in entry_loops().items()
    }  # fmt: skip


def warm_imports() -> None:
    """The sweep's warm_imports (numba's cached loops included), then what it left the loops with."""
    global AFTER_WARM
    sweep_task.warm_imports()
    AFTER_WARM = loops_state()


def rows_and_loops(spec: dict[str, Any]) -> dict[str, Any]:
    """A sweep task's rows, the process that ran it, and its loops' state after the task."""
    return {"rows": sweep_task.run_task(spec), "pid": os.getpid(), "loops": loops_state(), "warm": AFTER_WARM}

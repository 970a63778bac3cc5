"""numba's cached compiled loops are loaded by a sweep's ``warm_imports`` (``commsched.sim.jit.load_cached``), before
a local pool forks: the forked worker runs its tasks with the loops it inherited, loading and compiling nothing,
and every row is the one a process without the preload computes."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from commsched.experiments.sweep import SweepRow
from commsched.experiments.sweep_task import run_task
from commsched.pipeline import StageCosts, simulate_pipeline
from commsched.sim import jit

ROOT = Path(__file__).resolve().parents[2]
HERE = Path(__file__).resolve().parent

# a fresh process: a local pool of 2 (this process and a worker forked after jit_helpers.warm_imports) runs two
# sweep tasks; "plain" takes the preload out (each process then loads the loops on their first call)
POOL = """
import json, os, sys
sys.path.insert(0, {here!r})
import commsched.sim.jit as jit
if sys.argv[1] == "plain":
    jit.load_cached = lambda: []
from commsched.execute.local import LocalExecutor
import jit_helpers
specs = jit_helpers.specs()
with LocalExecutor(jobs=2, start="fork") as ex:
    out = ex.map("jit_helpers:rows_and_loops", specs, fail=lambda spec, text: text)
print(json.dumps({{"here": os.getpid(), "out": out}}))
"""


def _pool(mode: str) -> dict:
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", POOL.format(here=str(HERE)), mode], capture_output=True, text=True,
                          env=env, timeout=600)  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    return json.loads(proc.stdout.splitlines()[-1])


def test_every_module_that_compiles_loops_is_listed():
    users = set()
    for path in (ROOT / "src" / "commsched").rglob("*.py"):
        if re.search(r"from commsched\.sim\.jit import .*\bnjit\b", path.read_text()):
            users.add(".".join(path.relative_to(ROOT / "src").with_suffix("").parts))
    assert users == set(jit.LOOP_MODULES)
    if jit.ENABLED:  # the loops Python calls; the rules and helpers they inline are not entries
        names = set(jit.entry_loops())
        assert {"commsched.sim.engine_jit.run_single_stream_jit", "commsched.passes.overlap_jit.kahn_jit"} <= names
        assert not any(name.rsplit(".", 1)[1].startswith("_") for name in names)


@pytest.mark.slow
@pytest.mark.skipif(not jit.ENABLED, reason="COMMSCHED_JIT=0 or numba missing: no compiled loops to load")
def test_forked_worker_inherits_the_loaded_loops_and_rows_are_unchanged():
    from jit_helpers import specs

    want = [SweepRow.from_dict(r).result_dict() for s in specs() for r in run_task(s)]  # also fills numba's cache
    simulate_pipeline("1F1B", 2, 2, None, StageCosts(forward_s=1e-3, backward_s=2e-3), free_comm=True)  # a sweep
    # task runs no pipeline: this fills the pipeline loop's cache (commsched.pipeline.engine_jit)
    for mode in ("preload", "plain"):
        got = _pool(mode)
        out = got["out"]
        assert len({o["pid"] for o in out}) == 2  # this process and the forked worker ran one task each
        assert [SweepRow.from_dict(r).result_dict() for o in out for r in o["rows"]] == want
        for o in out:
            warm = o["warm"]
            assert warm is not None and warm.keys() == o["loops"].keys() == jit.entry_loops().keys()
            if mode == "preload":
                # every loop was loaded from the cache before the fork, and neither process loaded or compiled since
                assert all(held >= 1 and loads >= 1 and compiled == 0 for held, loads, compiled in warm.values())
                assert o["loops"] == warm
            else:  # without it, each process loads what its task calls after the fork: the check above can fail
                assert all(held == 0 for held, _, _ in warm.values()) and o["loops"] != warm

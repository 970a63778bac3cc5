"""A process's first trace settles what tracing imports (``workloads.trace.settle_imports``: torch._dynamo with the
collector paused, then ``gc.freeze``): the graph traced is node for node the one torch's own lazy imports give."""

from __future__ import annotations

import gc
import json
import os
import subprocess
import sys
from pathlib import Path

from commsched.frontends.json_io import graph_to_dict
from commsched.workloads import build
from commsched.workloads.trace import settle_imports

ROOT = Path(__file__).resolve().parents[2]

# a fresh process tracing without settle_imports: make_fx imports torch._dynamo itself, on its first call
WITHOUT = """
import json, sys
import commsched.workloads.trace as trace
trace.settle_imports = lambda: None
w = trace.build("llama3-8b", parallel="fsdp", world_size=8, layers=1)
from commsched.frontends.json_io import graph_to_dict
print(json.dumps({"dynamo": "torch._dynamo" in sys.modules, "frozen": __import__("gc").get_freeze_count(),
                  "code": w.graph_module.code, "graph": graph_to_dict(w.graph)}))
"""


def test_a_trace_is_node_for_node_the_same_with_imports_settled_first():
    env = {**os.environ, "PYTHONPATH": str(ROOT / "src")}
    proc = subprocess.run([sys.executable, "-c", WITHOUT], capture_output=True, text=True, env=env, timeout=600)
    assert proc.returncode == 0, proc.stderr[-2000:]
    theirs = json.loads(proc.stdout)
    assert theirs["dynamo"] and theirs["frozen"] == 0  # torch imported dynamo itself; nothing was frozen there
    w = build("llama3-8b", parallel="fsdp", world_size=8, layers=1)
    assert settle_imports.cache_info().currsize == 1  # settled here
    assert w.graph_module.code == theirs["code"]
    assert json.loads(json.dumps(graph_to_dict(w.graph))) == theirs["graph"]  # names, ops, shapes, bytes, flops


def test_settle_imports_freezes_and_leaves_the_collector_as_it_found_it():
    for enabled in (True, False):
        (gc.enable if enabled else gc.disable)()
        try:
            before = gc.get_freeze_count()
            settle_imports.__wrapped__()  # the function under its once-per-process cache
            assert gc.isenabled() == enabled and gc.get_freeze_count() >= before and gc.get_count()[0] == 0
        finally:
            gc.enable()

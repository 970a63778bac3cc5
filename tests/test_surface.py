"""The public surface, frozen: top-level API, CLI commands, file format versions, module size budget."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import commsched
from commsched.cli import app
from commsched.frontends import json_io
from commsched.passes import pipeline

SRC = Path(commsched.__file__).parent


def test_import_needs_no_torch():
    code = "import sys, commsched; commsched.load_graph; commsched.schedule; print('torch' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "False"


def test_top_level_api():
    for name in commsched.__all__:
        assert getattr(commsched, name) is not None, name
    assert {"from_fx", "schedule", "simulate", "estimate", "load_graph", "save_graph", "apply_schedule"} <= set(
        commsched.__all__
    )


def test_cli_commands():
    names = {c.name or c.callback.__name__ for c in app.registered_commands}
    assert names >= {
        "info",
        "trace",
        "estimate",
        "calibrate",
        "demo",
        "simulate",
        "schedule",
        "check",
        "compare",
        "rewrite",
        "sweep",
        "optimize",
        "predict",
        "run",
        "replay",
    }


def test_format_versions():
    from commsched.report import run_report

    assert (json_io.FORMAT, json_io.VERSION) == ("commsched.graph", 1)
    assert (pipeline.SCHEDULE_FORMAT, pipeline.SCHEDULE_VERSION) == ("commsched.schedule", 1)
    assert (run_report.RUN_REPORT_FORMAT, run_report.RUN_REPORT_VERSION) == ("commsched.run-report", 1)


def test_module_size_budget():
    sizes = {p.relative_to(SRC): len(p.read_text().splitlines()) for p in SRC.rglob("*.py")}
    too_big = {str(k): v for k, v in sizes.items() if v > 600}
    assert not too_big, f"modules over 600 lines (split by responsibility): {too_big}"


def test_function_size_budget_in_the_core():
    """The scheduler and the simulator read at a glance: no function in passes/ or sim/ over 80 lines."""
    import ast

    too_long = {}
    for path in [*SRC.joinpath("passes").rglob("*.py"), *SRC.joinpath("sim").rglob("*.py")]:
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef):
                lines = node.end_lineno - node.lineno + 1
                if lines > 80:
                    too_long[f"{path.relative_to(SRC)}:{node.lineno} {node.name}"] = lines
    assert not too_long, f"functions over 80 lines (split into named steps): {too_long}"


def test_the_graph_imports_nothing_above_it():
    """ir/graph.py is the core data structure: it imports no other commsched module (no import cycles)."""
    import ast

    tree = ast.parse(SRC.joinpath("ir", "graph.py").read_text())
    imported = [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module]
    imported += [a.name for n in ast.walk(tree) if isinstance(n, ast.Import) for a in n.names]
    assert not [m for m in imported if m.startswith("commsched")], imported

"""The benchmark scripts under benchmarks/ as modules, for the tests that re-check RESULTS against stored runs."""

from __future__ import annotations

import functools
import importlib.util
import sys
from pathlib import Path
from types import ModuleType

ROOT = Path(__file__).resolve().parents[1]


@functools.cache
def benchmark(name: str) -> ModuleType:
    """``benchmarks/<name>.py``, loaded once per test process."""
    spec = importlib.util.spec_from_file_location(name, ROOT / "benchmarks" / f"{name}.py")
    module = importlib.util.module_from_spec(spec)
    sys.modules[name] = module  # dataclasses read their module's namespace while the module runs
    spec.loader.exec_module(module)
    return module

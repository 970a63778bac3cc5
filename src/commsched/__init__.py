"""commsched: hide communication behind computation in distributed deep-learning programs.

Pipeline: frontends -> ir -> cost -> passes -> sim -> report -> runtime (see docs/ARCHITECTURE.md).
``import commsched`` needs numpy only; the FX frontend, the workload zoo and the runtime import torch when used.
"""

from commsched import hardware
from commsched.cost import CostEstimate, collective_time_s, estimate, estimate_costs
from commsched.frontends.json_io import load_graph, save_graph
from commsched.ir import CollType, Graph, GraphBuilder, GraphError, OpKind, ProcessGroup
from commsched.memory import IncrementalMemory, memory_profile
from commsched.optimize import Optimized, optimize
from commsched.passes import PASSES, PRESETS, Schedule, ScheduleError, check_schedule, load_schedule, schedule
from commsched.sim import SimResult, simulate, simulate_costs

__version__ = "0.1.0"

_LAZY = {
    "from_fx": "commsched.frontends.fx",
    "fake_process_group": "commsched.frontends.fake_pg",
    "apply_schedule": "commsched.runtime",
    "compare_schedulers": "commsched.experiments.compare",
}


def __getattr__(name: str):
    # torch-backed parts load on first use, so JSON-only users never import torch
    if name in _LAZY:
        import importlib

        return getattr(importlib.import_module(_LAZY[name]), name)
    raise AttributeError(f"module 'commsched' has no attribute {name!r}")


__all__ = [
    "PASSES",
    "PRESETS",
    "CollType",
    "CostEstimate",
    "Graph",
    "GraphBuilder",
    "GraphError",
    "IncrementalMemory",
    "OpKind",
    "Optimized",
    "ProcessGroup",
    "Schedule",
    "ScheduleError",
    "SimResult",
    "apply_schedule",
    "check_schedule",
    "collective_time_s",
    "compare_schedulers",
    "estimate",
    "estimate_costs",
    "fake_process_group",
    "from_fx",
    "hardware",
    "load_graph",
    "load_schedule",
    "memory_profile",
    "optimize",
    "save_graph",
    "schedule",
    "simulate",
    "simulate_costs",
]

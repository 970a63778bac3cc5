"""commsched: hide communication behind computation in distributed deep-learning programs.

Pipeline: frontends -> ir -> cost -> passes -> sim -> report -> runtime (see docs/ARCHITECTURE.md).
``import commsched`` needs numpy only; the FX frontend, the workload zoo and the runtime import torch when used.
"""

__version__ = "0.1.0"

# every public name loads on first use (PEP 562): ``import commsched`` costs nothing, so a command that needs
# little (a sweep whose rows are stored) does not pay for numba and the passes; torch-backed parts never load for
# JSON-only users
from commsched.lazy import lazy_getattr

_LAZY = {
    "hardware": "commsched.hardware",
    "CostEstimate": "commsched.cost",
    "collective_time_s": "commsched.cost",
    "estimate": "commsched.cost",
    "estimate_costs": "commsched.cost",
    "load_graph": "commsched.frontends.json_io",
    "save_graph": "commsched.frontends.json_io",
    "CollType": "commsched.ir",
    "Graph": "commsched.ir",
    "GraphBuilder": "commsched.ir",
    "GraphError": "commsched.ir",
    "OpKind": "commsched.ir",
    "ProcessGroup": "commsched.ir",
    "IncrementalMemory": "commsched.memory",
    "memory_profile": "commsched.memory",
    "Optimized": "commsched.optimize",
    "optimize": "commsched.optimize",
    "PASSES": "commsched.passes",
    "PRESETS": "commsched.passes",
    "Schedule": "commsched.passes",
    "ScheduleError": "commsched.passes",
    "check_schedule": "commsched.passes",
    "load_schedule": "commsched.passes",
    "schedule": "commsched.passes",
    "SimResult": "commsched.sim",
    "simulate": "commsched.sim",
    "simulate_costs": "commsched.sim",
    "from_fx": "commsched.frontends.fx",
    "fake_process_group": "commsched.frontends.fake_pg",
    "trace_fsdp2": "commsched.rewrites.fsdp_trace",
    "apply_schedule": "commsched.runtime",
    "compare_schedulers": "commsched.experiments.compare",
}


__getattr__ = lazy_getattr(__name__, _LAZY)


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
    "trace_fsdp2",
]

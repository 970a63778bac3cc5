"""commsched: hide communication behind computation in distributed deep-learning programs.

Pipeline: frontends -> ir -> cost -> passes -> sim -> report -> runtime (see docs/ARCHITECTURE.md).
"""

from commsched.ir import CollType, Graph, GraphBuilder, GraphError, OpKind, ProcessGroup

__version__ = "0.1.0"


from commsched.frontends.json_io import load_graph, save_graph
from commsched.memory import IncrementalMemory, memory_profile
from commsched.sim import SimResult, simulate, simulate_costs


def __getattr__(name: str):
    # the FX frontend imports torch; keep `import commsched` light for JSON-only users
    if name in ("from_fx", "fake_process_group"):
        from commsched import frontends

        return getattr(frontends, name)
    raise AttributeError(f"module 'commsched' has no attribute {name!r}")


__all__ = [
    "CollType",
    "Graph",
    "GraphBuilder",
    "GraphError",
    "IncrementalMemory",
    "OpKind",
    "ProcessGroup",
    "SimResult",
    "fake_process_group",
    "from_fx",
    "load_graph",
    "memory_profile",
    "save_graph",
    "simulate",
    "simulate_costs",
]

# cost model (commsched.cost, commsched.hardware): numpy only, no torch import
from commsched import hardware  # noqa: E402
from commsched.cost import CostEstimate, collective_time_s, estimate, estimate_costs  # noqa: E402

__all__ += ["CostEstimate", "collective_time_s", "estimate", "estimate_costs", "hardware"]

# runtime (commsched.runtime): imports torch, so it loads on first use like the FX frontend
_RUNTIME_EXPORTS = ("apply_schedule",)
_getattr_before_runtime = __getattr__


def __getattr__(name: str):
    if name in _RUNTIME_EXPORTS:
        from commsched import runtime

        return getattr(runtime, name)
    return _getattr_before_runtime(name)


__all__ += ["apply_schedule"]

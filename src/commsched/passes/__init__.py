"""Scheduling passes: one pass per module, a registry of names, and the pipeline that runs and checks them."""

from commsched.passes import exact, multi_stream, overlap  # noqa: F401  (importing registers the passes)
from commsched.passes.baselines import (  # noqa: F401  (importing registers the seed passes under torch's names)
    framework,
    global_comm_order,
    raise_comms,
    reorder_compute_for_overlap,
    reorder_iterative,
    sink_waits,
    sink_waits_iterative,
)
from commsched.passes.budget import MemoryBudget
from commsched.passes.check import ScheduleError, check_given_order, check_schedule
from commsched.passes.pipeline import (
    PRESETS,
    Schedule,
    check_knobs,
    load_order,
    load_schedule,
    resolve_passes,
    schedule,
)
from commsched.passes.registry import (
    PASSES,
    KnobNamespace,
    PassConfig,
    PassContext,
    PassResult,
    PassStats,
    register_pass,
)

__all__ = [
    "PASSES",
    "PRESETS",
    "KnobNamespace",
    "MemoryBudget",
    "PassConfig",
    "PassContext",
    "PassResult",
    "PassStats",
    "Schedule",
    "ScheduleError",
    "check_given_order",
    "check_knobs",
    "check_schedule",
    "load_order",
    "load_schedule",
    "register_pass",
    "resolve_passes",
    "schedule",
]

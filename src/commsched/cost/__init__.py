"""Cost model: per-node seconds from hardware profiles (compute roofline, NCCL-like collectives, calibration).

Public API: :func:`estimate_costs` (a :class:`CostEstimate` for the simulator and passes), :func:`estimate`
(seconds per node), :func:`resolve_costs` (a CostEstimate as given, or estimated from hardware arguments),
:func:`collective_time_s` / :func:`plan_collective` (one collective), :class:`MeasuredTable` and
:func:`table_from_chrome_trace` (measured times), :func:`align_across_ranks` (same estimates on every rank).
"""

from commsched.cost.align import align_across_ranks, median_across_ranks
from commsched.cost.collectives import CollectivePlan, collective_time_s, plan_collective
from commsched.cost.estimate import estimate, estimate_costs, graph_features, resolve_costs
from commsched.cost.model import CostEstimate, LinkClass
from commsched.cost.opclass import OpClass
from commsched.cost.table import MeasuredTable
from commsched.cost.trace_import import load_measured, table_from_chrome_trace

__all__ = [
    "CollectivePlan",
    "CostEstimate",
    "LinkClass",
    "MeasuredTable",
    "OpClass",
    "align_across_ranks",
    "collective_time_s",
    "estimate",
    "estimate_costs",
    "graph_features",
    "load_measured",
    "median_across_ranks",
    "plan_collective",
    "resolve_costs",
    "table_from_chrome_trace",
]

"""Plain per-node times for tests of scheduling semantics (not of cost accuracy): a crude roofline."""

from __future__ import annotations

import numpy as np

from commsched.cost.model import CostEstimate
from commsched.ir import Graph, OpKind


def simple_costs(g: Graph, *, comm_bytes_per_s: float = 50e9, compute_scale: float = 1.0) -> CostEstimate:
    """Compute: max(flops / 400 TFLOP/s, bytes / 2 TB/s) + 4 us; collectives: 10 us + bytes / comm bandwidth."""
    kinds = g.kinds
    moved = (g.in_bytes + g.out_bytes).astype(np.float64)
    compute = np.maximum(g.flops / 400e12, moved / 2e12) + 4e-6
    node_s = np.where(np.isin(kinds, [OpKind.COMPUTE, OpKind.OTHER]), compute * compute_scale, 0.0)
    is_coll = g.coll_type >= 0
    node_s = np.where(is_coll, 10e-6 + g.comm_bytes / comm_bytes_per_s, node_s)
    latency = np.where(is_coll, 10e-6, 0.0)
    link = np.where(is_coll, 0, -1).astype(np.int8)
    return CostEstimate(node_s=node_s, coll_latency_s=latency, coll_link=link)

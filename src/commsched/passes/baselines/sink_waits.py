"""``sink_waits``: every wait as late as its users allow (the seed's greedy list scheduling)."""

from __future__ import annotations

import numpy as np

from commsched.ir import Graph
from commsched.passes.baselines.comm_list_scheduler import comm_list_schedule
from commsched.passes.registry import PassContext, PassResult, PassStats, register_pass


@register_pass("sink_waits")
def sink_waits(g: Graph, order: np.ndarray, ctx: PassContext) -> PassResult:
    """Greedily delay waits: a wait runs only when no other node is ready. Keeps collective order. O((N+E) log N)."""
    new = comm_list_schedule(g, order, ctx, raise_comms=False, sink_waits=True, reorder_for_overlap=False)
    return PassResult(new, PassStats("sink_waits"))

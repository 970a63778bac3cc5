"""``raise_comms``: every collective as early as its dependencies allow (the seed's greedy list scheduling)."""

from __future__ import annotations

import numpy as np

from commsched.ir import Graph
from commsched.passes.baselines.comm_list_scheduler import comm_list_schedule
from commsched.passes.registry import PassContext, PassResult, PassStats, register_pass


@register_pass("raise_comms")
def raise_comms(g: Graph, order: np.ndarray, ctx: PassContext) -> PassResult:
    """Greedily issue collectives early: nodes that feed the next collective run first. O((N+E) log N)."""
    new = comm_list_schedule(g, order, ctx, raise_comms=True, sink_waits=False, reorder_for_overlap=False)
    return PassResult(new, PassStats("raise_comms"))

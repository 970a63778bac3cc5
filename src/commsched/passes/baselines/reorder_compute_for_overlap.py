"""``reorder_compute_for_overlap``: raise collectives, sink waits, and pack ready compute under each collective."""

from __future__ import annotations

import numpy as np

from commsched.ir import Graph
from commsched.passes.baselines.comm_list_scheduler import comm_list_schedule
from commsched.passes.registry import PassContext, PassResult, PassStats, register_pass


@register_pass("reorder_compute_for_overlap")
def reorder_compute_for_overlap(g: Graph, order: np.ndarray, ctx: PassContext) -> PassResult:
    """After issuing collective N, run the compute needed by collective N+1 that does not wait on N, then other
    ready compute (soonest needed first) until N's estimated time is covered; then what depends on N.
    Keeps collective order. O((N+E) log N)."""
    new = comm_list_schedule(g, order, ctx, raise_comms=True, sink_waits=True, reorder_for_overlap=True)
    return PassResult(new, PassStats("reorder_compute_for_overlap"))

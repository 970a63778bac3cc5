"""``decide_global_ordering_of_comms``: fix the current issue order of all collectives for the passes after it."""

from __future__ import annotations

import numpy as np

from commsched.ir import Graph
from commsched.passes.registry import PassContext, PassResult, PassStats, register_pass


@register_pass("decide_global_ordering_of_comms")
def decide_global_ordering_of_comms(g: Graph, order: np.ndarray, ctx: PassContext) -> PassResult:
    """Chain every collective to the previous one (across all groups) as an ordering constraint, so no later pass
    can change the global collective order: the SPMD guarantee when estimates differ across ranks. O(N)."""
    colls = order[g.coll_type[order] >= 0]
    stats = PassStats("decide_global_ordering_of_comms")
    stats.notes.append(f"fixed the order of {len(colls)} collectives")
    return PassResult(order.copy(), stats, extra_src=colls[:-1].copy(), extra_dst=colls[1:].copy())

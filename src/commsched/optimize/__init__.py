"""``commsched.optimize``: the whole program, not only its order.

``optimize(gm_or_graph, hardware)`` tries program variants (the traced program; bucket plans of its collectives at
several granularities, planned on the traced order and on the scheduled one), schedules each with our ``overlap``
pass, simulates every one with the same cost model, and keeps the fastest whose peak memory stays within the budget
(relative to the traced program's peak). The simulator decides; the bucket planner's heuristics only propose. The
result is never worse than the traced order, and says what was tried and why each variant lost.
"""

from commsched.optimize.search import Optimized, Tried, optimize

__all__ = ["Optimized", "Tried", "optimize"]

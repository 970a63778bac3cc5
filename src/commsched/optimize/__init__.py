"""``commsched.optimize``: the whole program, not only its order.

``optimize(gm_or_graph, hardware)`` tries program variants (the traced program; bucket plans of its collectives at
several granularities, planned on the traced order and on the scheduled one), schedules each with our ``overlap``
pass, simulates every one with the same cost model, and keeps the fastest whose peak memory stays within the budget
(relative to the traced program's peak). The simulator decides; the bucket planner's heuristics only propose. The
result is never worse than the traced order, and says what was tried and why each variant lost.
"""

import sys
import types

from commsched.optimize.search import Optimized, Tried, optimize

__all__ = ["Optimized", "Tried", "optimize"]


class _CallableModule(types.ModuleType):
    """``commsched.optimize(...)`` calls :func:`optimize` even where importing a submodule (``commsched.optimize.
    search``) bound the package, not the function, to that name (``import commsched`` loads its names lazily)."""

    def __call__(self, *args, **kwargs) -> Optimized:
        return optimize(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

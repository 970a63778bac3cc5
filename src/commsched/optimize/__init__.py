"""``commsched.optimize``: the whole program, not only its order.

``optimize(gm_or_graph, hardware)`` tries program variants (the traced program; bucket plans of its collectives;
program transforms: decomposed TP, split batch and sequence, gathers kept for the backward), each proposed by a
variant family (:mod:`commsched.optimize.families`) and judged by the core (:mod:`commsched.optimize.judge`):
scheduled with our ``overlap`` pass and simulated with the same cost model. It keeps the fastest whose peak memory
stays within the budget (relative to the traced program's peak). The simulator decides; a family's heuristics only
propose. The result is never worse than the traced order, and says what was tried and why each variant lost.
"""

import sys
import types

from commsched.optimize.protocol import Tried, Variant
from commsched.optimize.search import Optimized, optimize

__all__ = ["Optimized", "Tried", "Variant", "optimize"]


class _CallableModule(types.ModuleType):
    """``commsched.optimize(...)`` calls :func:`optimize` even where importing a submodule (``commsched.optimize.
    search``) bound the package, not the function, to that name (``import commsched`` loads its names lazily)."""

    def __call__(self, *args, **kwargs) -> Optimized:
        return optimize(*args, **kwargs)


sys.modules[__name__].__class__ = _CallableModule

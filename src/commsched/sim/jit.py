"""Compiled loops: numba when it is installed, else nothing (callers keep their pure-Python loops).

The simulator's and the ``overlap`` pass's inner loops (one list-scheduling attempt, one single-stream simulation, a
keyed topological sort) run thousands of times per ``commsched.optimize`` call; in Python they cost about 10 us per
node and attempt. Their compiled forms (:mod:`commsched.passes.overlap_jit`, :mod:`commsched.sim.engine_jit`) give
bit-identical results (integer nanoseconds; the float work counters follow the same IEEE operations in the same
order, no fast-math) and the tests compare both forms. The timing rules stay in :mod:`commsched.sim.model`: the
kernels compile its scalar rule functions (``comm_start_rule``, ``kernel_wall_rule``, ...), which
:class:`~commsched.sim.model.StreamModel`'s methods call too.

``COMMSCHED_JIT=0`` in the environment turns the compiled loops off (the pure-Python ones run). Compiled code is
cached on disk next to the modules (numba's ``cache=True``), so only the first run on a machine compiles.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from typing import Any

try:  # numba is a dependency; without it (or with COMMSCHED_JIT=0) the pure-Python loops run
    import numba
except ImportError:  # pragma: no cover - exercised only where numba is missing
    numba = None

ENABLED = numba is not None and os.environ.get("COMMSCHED_JIT", "1") != "0"
"""whether the compiled loops are used"""


def njit(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` compiled in nopython mode (cached on disk), or ``fn`` itself when numba is not available."""
    if numba is None:
        return fn
    return numba.njit(cache=True, nogil=True)(fn)


def njit_inline(fn: Callable[..., Any]) -> Callable[..., Any]:
    """:func:`njit`, inlined into its compiled callers (a handler of a loop: no call, no copy of its arguments)."""
    if numba is None:
        return fn
    return numba.njit(cache=True, nogil=True, inline="always")(fn)

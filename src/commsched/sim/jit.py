"""Compiled loops: numba when it is installed, else nothing (callers keep their pure-Python loops).

The simulator's and the ``overlap`` pass's inner loops (one list-scheduling attempt, one single-stream simulation, a
keyed topological sort) run thousands of times per ``commsched.optimize`` call; in Python they cost about 10 us per
node and attempt. Their compiled forms (:mod:`commsched.passes.overlap_jit`, :mod:`commsched.sim.engine_jit`) give
bit-identical results (integer nanoseconds; the float work counters follow the same IEEE operations in the same
order, no fast-math) and the tests compare both forms. The timing rules stay in :mod:`commsched.sim.model`: the
kernels compile its scalar rule functions (``comm_start_rule``, ``kernel_wall_rule``, ...), which
:class:`~commsched.sim.model.StreamModel`'s methods call too.

``COMMSCHED_JIT=0`` in the environment turns the compiled loops off (the pure-Python ones run). Compiled code is
cached on disk next to the modules (numba's ``cache=True``), so only the first run on a machine compiles; every
other process loads it on a loop's first call (about 0.25 s of CPU, most of it numba's target context).
:func:`load_cached` does that loading ahead of time, so that a local pool's forked workers inherit the loaded loops
instead of each paying for it again (benchmarks/RESULTS.md, issue 24).
"""

from __future__ import annotations

import importlib
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


LOOP_MODULES = (
    "commsched.sim.engine_jit",
    "commsched.passes.overlap_jit",
    "commsched.sim.bounds_jit",
    "commsched.passes.baselines.framework_jit",
    "commsched.pipeline.engine_jit",
)
"""the modules that compile loops with :func:`njit` (tests/execute/test_jit_preload.py checks the list is whole)"""


def entry_loops() -> dict[str, Any]:
    """``"module.name"`` -> numba dispatcher, for each compiled loop Python code calls: those bound to a public name
    of a :data:`LOOP_MODULES` module. The private ones (the timing rules, helpers) run only inside those loops,
    whose machine code holds them. Empty when the compiled loops are off. Imports the modules."""
    if not ENABLED:
        return {}
    from numba.core.dispatcher import Dispatcher

    loops = {}
    for name in LOOP_MODULES:
        for attr, value in vars(importlib.import_module(name)).items():
            if not attr.startswith("_") and isinstance(value, Dispatcher):
                loops[f"{name}.{attr}"] = value
    return loops


def load_cached() -> list[str]:
    """Load every specialisation of every :func:`entry_loops` loop that numba's on-disk cache holds for this source,
    numba and machine, as a first call would; compiles nothing the cache lacks (a loop whose cache is missing or
    stale is left to its first call, which compiles it, as before) and writes nothing. Returns
    ``"module.name(signature)"`` of each loaded. Uses numba's cache internals (``Dispatcher._cache``): where they
    differ, it loads nothing (the test suite checks that it loads)."""
    loaded = []
    for name, dispatcher in entry_loops().items():
        for sig in _cached_signatures(dispatcher):
            try:
                dispatcher.compile(sig)  # found in the cache: loaded, not compiled
            except Exception:  # an unreadable cache file: the loop's first call deals with it, as without this
                continue
            loaded.append(f"{name}{sig}")
    return loaded


def _cached_signatures(dispatcher: Any) -> list[Any]:
    """The signatures whose compiled code ``dispatcher``'s cache holds, for this bytecode and machine, not yet
    loaded here, each with its data file present (so that ``compile`` finds it rather than compiling)."""
    try:
        cache = dispatcher._cache
        index = cache._cache_file._load_index()  # {} if missing, of another numba, or stale (the source changed)
        codegen = dispatcher.targetctx.codegen()
        loaded = {tuple(sig) for sig in dispatcher.overloads}
        return [
            key[0] for key, data_name in index.items()
            if cache._index_key(key[0], codegen) == key and tuple(key[0]) not in loaded
            and os.path.exists(os.path.join(cache._cache_path, data_name))
        ]  # fmt: skip
    except Exception:  # numba's internals moved, or an unreadable index: load nothing (a first call deals with it)
        return []

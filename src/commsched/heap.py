"""How commsched's start-up treats Python's cyclic garbage collector (no torch, no numpy: any module may use it).

Importing torch, its dynamo and numba makes about half a million objects that live as long as the process. While
they load, each time the heap has grown by a quarter the collector walks all of it (a full collection), and after
that every full collection walks them again, though none can ever be garbage; the interpreter's exit walks them
once more. :func:`imports_settled` pauses the collector while such imports run and then freezes everything alive
(``gc.freeze``: moved to a generation no collection visits), as Python's documentation suggests for long-lived
start-up state. Objects frozen are still freed by reference counting; only a reference cycle among them that
later becomes garbage is never collected, a bounded one-time cost. Measured on a 2-layer llama3-8b sweep: 1.4 s
of its 7-8 s CPU went to collections and 1-2 s to the exit (benchmarks/RESULTS.md, issue 24).
"""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def imports_settled() -> Iterator[None]:
    """Run the body (imports) with the cyclic collector paused, then freeze every object alive and put the
    collector back as it was. Nesting is harmless (the inner freeze moves what exists so far)."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        if enabled:
            gc.enable()

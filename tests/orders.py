"""Orders for tests: valid topological orders that follow a preferred (e.g. random) order as closely as possible."""

from __future__ import annotations

import numpy as np

from commsched.ir.order import positions
from commsched.ir.transform import topological_order


def topo_fix(g, prefer: np.ndarray) -> np.ndarray:
    """A topological order of ``g`` that follows ``prefer`` where dependencies allow (stable Kahn)."""
    return topological_order(g, positions(np.asarray(prefer)))


def random_topo_order(g, rnd) -> np.ndarray:
    """A random valid order drawn with ``rnd`` (a random.Random)."""
    return topo_fix(g, np.asarray(rnd.sample(range(len(g)), len(g)), np.int32))


def sink_waits_order(g) -> np.ndarray:
    """Waits as late as possible: the most overlap (ties by node id)."""
    return topological_order(g, (g.wait_of >= 0).astype(np.int64))

"""Orders for tests: valid topological orders that follow a preferred (e.g. random) order as closely as possible."""

from __future__ import annotations

import heapq

import numpy as np

from commsched.passes.check import positions


def topo_fix(g, prefer: np.ndarray) -> np.ndarray:
    """A topological order of ``g`` that follows ``prefer`` where dependencies allow (stable Kahn)."""
    rank = positions(np.asarray(prefer))
    ptr, idx = g.successors_csr()
    indeg = np.diff(g.predecessors_csr()[0]).tolist()
    ready = [(rank[i], i) for i in range(len(g)) if indeg[i] == 0]
    heapq.heapify(ready)
    out = []
    while ready:
        _, i = heapq.heappop(ready)
        out.append(i)
        for s in idx[ptr[i] : ptr[i + 1]].tolist():
            indeg[s] -= 1
            if indeg[s] == 0:
                heapq.heappush(ready, (rank[s], s))
    return np.asarray(out, np.int32)


def random_topo_order(g, rnd) -> np.ndarray:
    """A random valid order drawn with ``rnd`` (a random.Random)."""
    return topo_fix(g, np.asarray(rnd.sample(range(len(g)), len(g)), np.int32))

"""The compiled loop of :mod:`commsched.sim.bounds`' exposed-communication term (:mod:`commsched.sim.jit`).

For every collective: the compute work that must run before it starts (its ancestors) or after it ends (what
depends on its wait, or on a synchronous collective itself). Ancestry is carried as one bit per collective per
node (``uint64`` words), propagated once backwards and once forwards over the graph's node order (a topological
order): O(N * C / 64) words, then O(bits set) additions.
"""

from __future__ import annotations

import numpy as np

from commsched.sim.jit import njit


@njit
def bound_compute_ns(p_ptr, p_idx, s_ptr, s_idx, coll_index, done_coll, work_ns, n_colls):
    """Per collective (by ``coll_index``): the work (``work_ns``, int64 per node) of the nodes that must end before
    it starts or cannot start before it ends. ``coll_index``: the collective's number for each collective node,
    else -1; ``done_coll``: for a wait (or a synchronous collective), the number of the collective whose end it
    marks, else -1. ``p_*`` / ``s_*``: predecessor / successor CSR arrays."""
    n = len(coll_index)
    words = (n_colls + 63) // 64
    one = np.uint64(1)
    before = np.zeros((n, words), np.uint64)  # bit c: this node is an ancestor of collective c
    for i in range(n - 1, -1, -1):
        for e in range(s_ptr[i], s_ptr[i + 1]):
            s = s_idx[e]
            for w in range(words):
                before[i, w] |= before[s, w]
            c = coll_index[s]
            if c >= 0:
                before[i, c // 64] |= one << np.uint64(c % 64)
    after = np.zeros((n, words), np.uint64)  # bit c: this node cannot start before collective c ends
    for i in range(n):
        for e in range(p_ptr[i], p_ptr[i + 1]):
            p = p_idx[e]
            for w in range(words):
                after[i, w] |= after[p, w]
            c = done_coll[p]
            if c >= 0:
                after[i, c // 64] |= one << np.uint64(c % 64)
    out = np.zeros(n_colls, np.int64)
    for i in range(n):
        d = work_ns[i]
        if d <= 0:
            continue
        for w in range(words):
            m = before[i, w] | after[i, w]
            b = 0
            while m != 0:
                if m & one:
                    out[w * 64 + b] += d
                m >>= one
                b += 1
    return out

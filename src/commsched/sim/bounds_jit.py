"""The compiled loops behind :mod:`commsched.sim.bounds`' terms that need each collective's ancestry (the exposed
communication, and the comm streams' releases and deliveries by work; :mod:`commsched.sim.jit`).

For every collective: the compute work that must run before it starts (its ancestors), and after it ends (what
depends on its wait, or on a synchronous collective itself). Ancestry is carried as one bit per collective per
node (``uint64`` words), propagated once backwards and once forwards over the graph's node order (a topological
order): O(N * C / 64) words, then O(bits set) additions. Also every node's head and tail (longest paths to and
from it under the simulator's availability rules), O(N + E) each.
"""

from __future__ import annotations

import numpy as np

from commsched.sim.jit import njit


@njit
def _reach(ptr, idx, mark, n_colls, backwards):
    """Per node, bit ``c`` set where an edge path (``ptr`` / ``idx``: successors when ``backwards``, walked from
    the last node; else predecessors, from the first) leads to a node whose ``mark`` is ``c``."""
    n = len(mark)
    one = np.uint64(1)
    bits = np.zeros((n, (n_colls + 63) // 64), np.uint64)
    for k in range(n):
        i = n - 1 - k if backwards else k
        for e in range(ptr[i], ptr[i + 1]):
            j = idx[e]
            for w in range(bits.shape[1]):
                bits[i, w] |= bits[j, w]
            c = mark[j]
            if c >= 0:
                bits[i, c // 64] |= one << np.uint64(c % 64)
    return bits


@njit
def bound_compute_ns(p_ptr, p_idx, s_ptr, s_idx, coll_index, done_coll, work_ns, n_colls):
    """Per collective (by ``coll_index``): row 0, the work (``work_ns``, int64 per node) of the nodes that must end
    before it starts; row 1, of those that cannot start before it ends. ``coll_index``: the collective's number for
    each collective node, else -1; ``done_coll``: for a wait (or a synchronous collective), the number of the
    collective whose end it marks, else -1. ``p_*`` / ``s_*``: predecessor / successor CSR arrays."""
    one = np.uint64(1)
    before = _reach(s_ptr, s_idx, coll_index, n_colls, True)  # bit c: an ancestor of collective c
    after = _reach(p_ptr, p_idx, done_coll, n_colls, False)  # bit c: cannot start before collective c ends
    out = np.zeros((2, n_colls), np.int64)
    for i in range(len(coll_index)):
        d = work_ns[i]
        if d <= 0:
            continue
        for side in range(2):
            bits = before if side == 0 else after
            for w in range(bits.shape[1]):
                m = bits[i, w]
                b = 0
                while m != 0:
                    if m & one:
                        out[side, w * 64 + b] += d
                    m >>= one
                    b += 1
    return out


@njit
def heads_ns(ptr, idx, dur, kinds, wait_of, issue_only, wait_kind):
    """Per node: its earliest start (``ptr`` / ``idx``: predecessor CSR; see :func:`commsched.sim.bounds.heads`).
    ``avail``: when successors may use the node (an async collective from its issue on, everything else from its
    end); a wait starts no earlier than its collective's end."""
    n = len(dur)
    head = np.zeros(n, np.int64)
    avail = np.zeros(n, np.int64)
    for i in range(n):
        m = 0
        for e in range(ptr[i], ptr[i + 1]):
            a = avail[idx[e]]
            if a > m:
                m = a
        if kinds[i] == wait_kind:
            c = wait_of[i]
            m = max(m, head[c] + dur[c])
        head[i] = m
        avail[i] = m if issue_only[i] else m + dur[i]
    return head


@njit
def tails_ns(ptr, idx, dur, kinds, wait_of, issue_only, wait_kind):
    """Per node: the least time from its end (an async collective: its issue) to the end of the step (``ptr`` /
    ``idx``: successor CSR; see :func:`commsched.sim.bounds.heads_and_tails`)."""
    n = len(dur)
    tail = np.zeros(n, np.int64)
    for i in range(n - 1, -1, -1):
        best = 0
        for e in range(ptr[i], ptr[i + 1]):
            s = idx[e]
            # an async collective's tail counts from its issue, which takes no time; others run for dur[s]
            via = tail[s] if issue_only[s] else dur[s] + tail[s]
            if issue_only[i] and kinds[s] == wait_kind and wait_of[s] == i:
                via = dur[i] + tail[s]  # the wait of this collective: after the collective's own time
            if via > best:
                best = via
        tail[i] = best
    return tail

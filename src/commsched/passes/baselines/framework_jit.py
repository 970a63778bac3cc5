"""The compiled loop behind :func:`commsched.passes.baselines.framework.order_by_moves` (:mod:`commsched.sim.jit`):
the move keys pushed forward along edges (max over predecessors) then pulled backward (min over successors). Keys
are float64 and only compared: compiled or run as Python (``py_func``, the compiled loops off), the same keys."""

from __future__ import annotations

from commsched.sim.jit import njit


@njit
def propagate_keys(key, early, by_pos, p_ptr, p_idx, s_ptr, s_idx):
    """``key`` raised to its predecessors' largest in ``by_pos`` order, then ``min(key, early)``, then lowered to its
    successors' smallest in reverse ``by_pos`` order, in place (see ``order_by_moves``)."""
    for k in range(len(by_pos)):
        v = by_pos[k]
        for e in range(p_ptr[v], p_ptr[v + 1]):
            x = key[p_idx[e]]
            if x > key[v]:
                key[v] = x
    for v in range(len(key)):
        if early[v] < key[v]:
            key[v] = early[v]
    for k in range(len(by_pos) - 1, -1, -1):
        u = by_pos[k]
        for e in range(s_ptr[u], s_ptr[u + 1]):
            x = key[s_idx[e]]
            if x < key[u]:
                key[u] = x
    return key

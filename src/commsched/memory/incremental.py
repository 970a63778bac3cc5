"""Incremental peak-memory tracking for passes that move nodes (the seeds' iterative reorder / sink-waits passes).

Moving a run of adjacent nodes only changes the memory curve between the run's old and new places (the *window*):
memory before the window is untouched, and after it the same storages are live, because the same nodes have run.
Inside the window only storages whose last user lies in the window can change where they are freed, and their new
last user is the window user that comes last in the new order. So a query costs O(k) and an applied move
O(k + log N), k being the number of positions the move spans plus the storages those nodes use; a pass that moves a
node one neighbour at a time pays O(1) per step (plus the log-time peak upkeep when it applies the step).
"""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from commsched.ir.graph import Graph, GraphError
from commsched.ir.order import as_order
from commsched.memory.liveness import liveness, memory_profile

_NEG = -(1 << 62)


class IncrementalMemory:
    """The memory curve of an order under moves; semantics as in :mod:`commsched.memory.liveness`.

    ``peak_bytes`` is the exact peak of the current order. :meth:`potential_peak_after_move` answers "what would the
    peak be", :meth:`apply_move` makes the move. The caller keeps the order topologically valid (this class does not
    look at dependencies). Positions are 0-based indices into :attr:`order`.
    """

    def __init__(
        self, g: Graph, order: np.ndarray | Sequence[int] | None = None, *, hold_collective_inputs: bool = True
    ):
        self.graph = g
        n = len(g)
        order = as_order(g, order, dtype=np.int64)
        lv = liveness(g, hold_collective_inputs)
        prof = memory_profile(g, order, hold_collective_inputs=hold_collective_inputs)
        self._order: list[int] = order.tolist()
        self._pos: list[int] = [0] * n
        for p, v in enumerate(self._order):
            self._pos[v] = p
        self._curve: list[int] = prof.curve_bytes.tolist()
        self._last: list[int] = prof.free_position.tolist()  # -1 for storages never freed (never looked up)
        self._size: list[int] = lv.storage_bytes.tolist()
        self._alloc: list[int] = lv.alloc_bytes.tolist()
        ptr, idx = lv.node_storage_ptr.tolist(), lv.node_storage_idx.tolist()
        self._uses: list[list[int]] = [idx[ptr[i] : ptr[i + 1]] for i in range(n)]
        size = 1
        while size < max(n, 1):
            size *= 2
        self._leaf0 = size
        tree = [_NEG] * (2 * size)
        tree[size : size + n] = self._curve
        for i in range(size - 1, 0, -1):
            tree[i] = max(tree[2 * i], tree[2 * i + 1])
        self._tree = tree

    # ------------------------------------------------------------------ state
    @property
    def peak_bytes(self) -> int:
        return self._tree[1] if self._order else 0

    @property
    def order(self) -> np.ndarray:
        """The current order (a copy, int64)."""
        return np.asarray(self._order, np.int64)

    @property
    def curve_bytes(self) -> np.ndarray:
        """Bytes in use while the node at each position runs (a copy, int64)."""
        return np.asarray(self._curve, np.int64)

    def position(self, node: int) -> int:
        return self._pos[node]

    def memory_at(self, position: int) -> int:
        """Bytes in use while the node at ``position`` runs."""
        return self._curve[position]

    # ------------------------------------------------------------------ moves
    def potential_peak_after_move(self, node_or_run: int | Sequence[int], new_position: int) -> int:
        """The peak if ``node_or_run`` (a node id, or node ids adjacent and in order in the current order) moved so
        that its first node lands at ``new_position`` of the new order. Does not change anything."""
        lo, hi, nodes = self._window(node_or_run, new_position)
        if lo == hi:
            return self.peak_bytes
        curve, _ = self._evaluate(lo, hi, nodes)
        peak = self.peak_bytes
        # the peak is unchanged outside the window: look outside only if the window held a peak position
        outside = max(self._query(0, lo), self._query(hi, len(self._order))) if peak in self._curve[lo:hi] else peak
        return max(max(curve), outside)

    def apply_move(self, node_or_run: int | Sequence[int], new_position: int) -> int:
        """Make the move described in :meth:`potential_peak_after_move`; returns the new peak."""
        lo, hi, nodes = self._window(node_or_run, new_position)
        if lo == hi:
            return self.peak_bytes
        curve, last = self._evaluate(lo, hi, nodes)
        self._order[lo:hi] = nodes
        for k, v in enumerate(nodes):
            self._pos[v] = lo + k
        self._curve[lo:hi] = curve
        for s, p in last.items():
            self._last[s] = p
        self._update_tree(lo, hi)
        return self.peak_bytes

    def _window(self, node_or_run: int | Sequence[int], new_position: int) -> tuple[int, int, list[int]]:
        """(lo, hi, new nodes of positions lo..hi-1) of a move."""
        run = [int(node_or_run)] if isinstance(node_or_run, (int, np.integer)) else [int(v) for v in node_or_run]
        n = len(self._order)
        if not run:
            raise GraphError("a move needs at least one node")
        for v in run:
            if not 0 <= v < n:
                raise GraphError(f"node id {v} is out of range: expected 0..{n - 1}")
        a = self._pos[run[0]]
        b = a + len(run)
        if self._order[a:b] != run:
            names = [self.graph.names[v] for v in run]
            raise GraphError(f"nodes {names} are not adjacent and in order in the current order")
        t = int(new_position)
        if not 0 <= t <= n - len(run):
            raise GraphError(f"new position {t} for a run of {len(run)} nodes is out of range 0..{n - len(run)}")
        if t == a:
            return a, a, []
        if t < a:
            return t, b, run + self._order[t:a]
        return a, t + len(run), self._order[b : t + len(run)] + run

    def _evaluate(self, lo: int, hi: int, nodes: list[int]) -> tuple[list[int], dict[int, int]]:
        """Curve values of positions lo..hi-1 holding ``nodes``, and the new last position of each storage whose
        last user is in the window."""
        old_last, uses = self._last, self._uses
        new_last: dict[int, int] = {}
        for k, v in enumerate(nodes):
            p = lo + k
            for s in uses[v]:
                if lo <= old_last[s] < hi:
                    new_last[s] = p  # positions grow with k, so the last assignment is the maximum
        freed = [0] * (hi - lo)
        size = self._size
        for s, p in new_last.items():
            freed[p - lo] += size[s]
        mem = self._curve[lo] - self._alloc[self._order[lo]]  # memory before the window
        alloc = self._alloc
        curve = []
        for k, v in enumerate(nodes):
            mem += alloc[v]
            curve.append(mem)
            mem -= freed[k]
        return curve, new_last

    # ------------------------------------------------------------------ max segment tree over positions
    def _update_tree(self, lo: int, hi: int) -> None:
        tree, base = self._tree, self._leaf0
        tree[base + lo : base + hi] = self._curve[lo:hi]
        lo, hi = (base + lo) // 2, (base + hi - 1) // 2
        while lo >= 1:
            for i in range(lo, hi + 1):
                tree[i] = max(tree[2 * i], tree[2 * i + 1])
            lo, hi = lo // 2, hi // 2

    def _query(self, lo: int, hi: int) -> int:
        """Max of the curve over positions lo..hi-1 (_NEG when empty)."""
        tree, best = self._tree, _NEG
        lo += self._leaf0
        hi += self._leaf0
        while lo < hi:
            if lo & 1:
                best = max(best, tree[lo])
                lo += 1
            if hi & 1:
                hi -= 1
                best = max(best, tree[hi])
            lo //= 2
            hi //= 2
        return best

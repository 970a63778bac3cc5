"""Orders of a graph's nodes: what users pass normalised into one array, positions, the topological check, and each
process group's chain of collectives in issue order. Every module that takes an order goes through here."""

from __future__ import annotations

from collections.abc import Sequence

import numpy as np

from commsched.ir.graph import Graph, GraphError


class ScheduleError(GraphError):
    """An invalid order: the message names the nodes involved and the rule broken."""


OrderLike = Sequence[int | str] | np.ndarray | None


def as_order(g: Graph, order: OrderLike, *, dtype: type = np.int32) -> np.ndarray:
    """``order`` (node ids or names; None: the graph's own order) as a ``dtype`` array, checked to be a permutation
    of the node ids. Raises ScheduleError naming what is wrong. O(N)."""
    n = len(g)
    if order is None:
        return np.arange(n, dtype=dtype)
    if isinstance(order, np.ndarray) and order.dtype.kind in "iu":
        arr = order.astype(dtype, copy=False)
    elif isinstance(order, np.ndarray) and order.dtype.kind not in "OU":
        raise ScheduleError(f"order must hold integer node ids or node names, got dtype {order.dtype}")
    else:
        arr = np.fromiter((g.id_of(x) for x in order), dtype, count=len(order))
    if arr.ndim != 1 or len(arr) != n:
        raise ScheduleError(f"the order has {arr.size} entries; expected one per node ({n})")
    outside = (arr < 0) | (arr >= n)
    if outside.any():
        raise ScheduleError(f"the order names node id {int(arr[outside][0])}, which does not exist (0..{n - 1})")
    seen = np.zeros(n, bool)
    seen[arr] = True
    if not seen.all():
        missing = int(np.flatnonzero(~seen)[0])
        raise ScheduleError(
            f"node {g.names[missing]!r} is missing from the order (another node appears twice); expected a "
            "permutation of the node ids"
        )
    return arr


def positions(order: np.ndarray) -> np.ndarray:
    """Per node id: its position in ``order`` (int64)."""
    pos = np.empty(len(order), np.int64)
    pos[order] = np.arange(len(order))
    return pos


def check_topological(
    g: Graph, order: np.ndarray, extra_src: np.ndarray | None = None, extra_dst: np.ndarray | None = None
) -> None:
    """Raise ScheduleError unless every predecessor (data input, control dep, extra constraint ``extra_src`` before
    ``extra_dst``) of every node comes before it in ``order`` (a permutation); names the earliest offender. O(N + E)."""
    pos = positions(order)
    ptr, src = g.predecessors_csr()
    dst = np.repeat(np.arange(len(g)), np.diff(ptr))
    if extra_src is not None and len(extra_src):
        src = np.concatenate([src, extra_src])
        dst = np.concatenate([dst, extra_dst])
    bad = np.flatnonzero(pos[src] >= pos[dst])
    if len(bad):
        e = int(bad[np.argmin(pos[dst[bad]])])
        s, d = int(src[e]), int(dst[e])
        raise ScheduleError(
            f"node {g.names[d]!r} is scheduled at position {pos[d]} before its predecessor {g.names[s]!r} "
            f"(position {pos[s]}); expected a topological order"
        )


def collective_chains(g: Graph, order: np.ndarray) -> dict[int, np.ndarray]:
    """Per process group index (those with a collective, by first issue): its collectives in the order ``order``
    issues them. O(N + G * C)."""
    colls = order[g.coll_type[order] >= 0]
    groups = g.coll_group[colls]
    return {k: colls[groups == k] for k in dict.fromkeys(groups.tolist())}

"""Schedule validation: every pass result goes through :func:`check_schedule`; every order a user gives (``commsched
check``, ``simulate --order``, :func:`commsched.passes.load_schedule`) through :func:`check_given_order`."""

from __future__ import annotations

from collections.abc import Mapping, Sequence

import numpy as np

from commsched.ir import Graph
from commsched.ir.order import ScheduleError, as_order, check_topological, collective_chains

__all__ = ["ScheduleError", "check_given_order", "check_schedule"]


def check_schedule(
    g: Graph,
    order: np.ndarray | Sequence[int | str],
    reference: np.ndarray | Sequence[int | str] | None = None,
    *,
    allow_collective_reorder: bool = False,
    streams: np.ndarray | None = None,
    extra_src: np.ndarray | None = None,
    extra_dst: np.ndarray | None = None,
    expected_chains: Mapping[int, np.ndarray] | None = None,
) -> np.ndarray:
    """Check that ``order`` is a valid schedule of ``g``; return it as an int32 array.

    Rules: a permutation of all nodes; every predecessor (data input, control dep, extra constraint) before its
    user; unless ``allow_collective_reorder``, every process group issues its collectives in the same order as in
    ``reference`` (default: the graph's own order) — the SPMD rule; and with multi-stream ``streams``, the issue
    order of all collectives is forced by the program (same stream or a dependency path), so FIFO comm streams of
    groups that share ranks cannot be fed in different orders on different ranks (the classic hang).
    ``expected_chains`` (group index -> collective ids in issue order; e.g. a schedule file's recorded
    ``collective_order`` after ``reorder_collectives``) replaces ``reference``'s: the SPMD rule then holds for that
    deliberately reordered sequence, which every rank issues alike because it is written down.
    Raises ScheduleError naming the nodes. O(N + E) (plus O((N + E) * C / 64) with streams).
    """
    order = as_order(g, order)
    check_topological(g, order, extra_src, extra_dst)
    if not allow_collective_reorder:
        recorded = expected_chains is not None
        want = expected_chains if recorded else collective_chains(g, as_order(g, reference))
        got = collective_chains(g, order)
        for grp, colls in want.items():
            mismatch = np.flatnonzero(got[grp] != colls)
            if len(mismatch):
                k = int(mismatch[0])
                ref = "recorded collective_order" if recorded else "reference order"
                raise ScheduleError(
                    f"process group {g.groups[grp].name!r}: collective #{k} is {g.names[got[grp][k]]!r} but the "
                    f"{ref} issues {g.names[colls[k]]!r} there; every rank must issue a group's "
                    "collectives in the same order (SPMD)"
                )
    if streams is not None:
        _check_issue_order_forced(g, order, streams)
    return order


def check_given_order(
    g: Graph,
    order: np.ndarray | Sequence[int | str],
    *,
    streams: np.ndarray | None = None,
    recorded_chains: Mapping[int, np.ndarray] | None = None,
    allow_collective_reorder: bool = False,
    where: str = "",
) -> np.ndarray:
    """The one check of an order a user gives (a schedule file, a list of node names), whoever reads it: the rules
    of :func:`check_schedule` against the graph's own collective order per group, or against the issue order a
    schedule file records after ``reorder_collectives`` (``recorded_chains``), with its ``streams``. Errors begin
    with ``where`` (the file), so every consumer refuses a bad order with the same line."""
    try:
        return check_schedule(g, order, allow_collective_reorder=allow_collective_reorder, streams=streams,
                              expected_chains=recorded_chains)  # fmt: skip
    except ScheduleError as exc:
        raise ScheduleError(f"{where}: {exc}" if where else str(exc)) from None


def _check_issue_order_forced(g: Graph, order: np.ndarray, streams: np.ndarray) -> None:
    """With several compute streams, consecutive collective issues must be ordered by the program itself."""
    colls = order[g.coll_type[order] >= 0]
    if len(colls) < 2:
        return
    coll_bit = {int(c): k for k, c in enumerate(colls.tolist())}
    ptr, idx = g.predecessors_csr()
    reach: dict[int, int] = {}  # node -> bitset of collectives that happen before it (inclusive)
    last_on_stream: dict[int, int] = {}
    for node in order.tolist():
        bits = 0
        for p in idx[ptr[node] : ptr[node + 1]].tolist():
            bits |= reach.get(p, 0)
        s = int(streams[node])
        prev = last_on_stream.get(s)
        if prev is not None:
            bits |= reach[prev]
        k = coll_bit.get(node)
        if k is not None:
            if k > 0 and not (bits >> (k - 1)) & 1:
                prev_coll = int(colls[k - 1])
                raise ScheduleError(
                    f"collective {g.names[node]!r} (stream {s}) may be issued before {g.names[prev_coll]!r} "
                    f"(stream {int(streams[prev_coll])}): nothing in the program orders them, so ranks can feed "
                    "their comm streams in different orders and hang; issue them from one stream or add a dependency"
                )
            bits |= 1 << k
        reach[node] = bits
        last_on_stream[s] = node

"""Shared pieces of the iterative passes (``reorder_communication_preserving_peak_memory``, ``sink_waits_iterative``):
runtimes with the seeds' multipliers, exposed-time walks, groupability facts, and the moving order."""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

from commsched.ir import Graph, OpKind
from commsched.passes.registry import PassConfig, PassContext


@dataclass(frozen=True, kw_only=True)
class RuntimeMultipliers(PassConfig):
    """The seeds' knobs that scale runtime estimates before the iterative passes use them (torch's defaults)."""

    comm_runtime_mult: float = 2.0
    """multiplier on collective runtimes (reorder_sink_runtime_estimations_comm_mult)"""
    non_comm_runtime_mult: float = 1.0
    """multiplier on other runtimes (reorder_sink_runtime_estimations_non_comm_mult)"""


@dataclass
class IterativeView:
    """Per-graph facts the iterative passes read (lists for fast scalar access)."""

    runtime: list[float]  # seconds, with the comm / non-comm multipliers applied
    is_coll: list[bool]
    is_async_coll: list[bool]
    is_wait: list[bool]
    is_view: list[bool]
    is_gemm_like: list[bool]  # nodes with a flop formula: matmuls, attention, convolutions
    is_boundary: list[bool]  # graph inputs and the output: they stay at the ends of the order
    wait_of: list[int]
    preds: list[list[int]]  # data inputs, control deps and constraints fixed by earlier passes
    succs: list[list[int]]


def make_view(g: Graph, ctx: PassContext, comm_mult: float, non_comm_mult: float) -> IterativeView:
    n = len(g)
    is_coll = g.coll_type >= 0
    runtime = np.where(is_coll, ctx.costs.node_s * comm_mult, ctx.costs.node_s * non_comm_mult)
    ptr, idx = g.predecessors_csr()
    preds = [idx[ptr[i] : ptr[i + 1]].tolist() for i in range(n)]
    for s, d in zip(ctx.extra_src.tolist(), ctx.extra_dst.tolist()):
        preds[d].append(s)
    succs: list[list[int]] = [[] for _ in range(n)]
    for d, ps in enumerate(preds):
        for s in ps:
            succs[s].append(d)
    return IterativeView(
        runtime=runtime.tolist(),
        is_coll=is_coll.tolist(),
        is_async_coll=(is_coll & ~g.coll_sync).tolist(),
        is_wait=(g.kinds == OpKind.WAIT).tolist(),
        is_view=(g.kinds == OpKind.VIEW).tolist(),
        is_gemm_like=(g.kinds == OpKind.COMPUTE).tolist(),
        is_boundary=((g.kinds == OpKind.INPUT) | (g.kinds == OpKind.OUTPUT)).tolist(),
        wait_of=g.wait_of.tolist(),
        preds=preds,
        succs=succs,
    )


class MovingOrder:
    """An order as a list plus positions, with the two moves the iterative passes make. O(k) per move."""

    def __init__(self, order: np.ndarray) -> None:
        self.order: list[int] = order.tolist()
        self.pos: list[int] = [0] * len(self.order)
        for p, v in enumerate(self.order):
            self.pos[v] = p

    def prev(self, node: int) -> int | None:
        p = self.pos[node]
        return self.order[p - 1] if p > 0 else None

    def next(self, node: int) -> int | None:
        p = self.pos[node] + 1
        return self.order[p] if p < len(self.order) else None

    def rotate(self, lo: int, hi: int, nodes: list[int]) -> None:
        """Positions lo..hi-1 now hold ``nodes``."""
        self.order[lo:hi] = nodes
        for k, v in enumerate(nodes):
            self.pos[v] = lo + k


def coll_exposure(v: IterativeView, mo: MovingOrder, coll: int) -> tuple[float, float]:
    """(comm_time, comp_time) of a collective: compute that runs between it and its first wait or consumer.

    Async collectives on the way are skipped (they do not compute); a synchronous one ends the window.
    """
    comm = v.runtime[coll]
    comp = 0.0
    users = set(v.succs[coll])
    p = mo.pos[coll] + 1
    order = mo.order
    while p < len(order):
        node = order[p]
        if node in users and not v.is_view[node]:
            break
        if v.is_view[node] and node in users:
            users.update(v.succs[node])  # getitem / views of the output: their users consume it too
        elif v.is_coll[node]:
            if not v.is_async_coll[node]:
                break
        else:
            comp += v.runtime[node]
        p += 1
    return comm, comp


def wait_exposure(v: IterativeView, mo: MovingOrder, wait: int) -> tuple[float, float]:
    """(comm_time, comp_time) of a wait: compute between its collective and the first barrier after it.

    Walking back from the wait, a synchronous collective, or an async collective whose wait was passed, resets the
    compute seen so far (that compute cannot hide the collective being waited on).
    """
    coll = v.wait_of[wait]
    comp = 0.0
    waits_seen: set[int] = set()
    p = mo.pos[wait] - 1
    order = mo.order
    while p >= 0:
        node = order[p]
        if node == coll:
            return v.runtime[coll], comp
        if v.is_wait[node]:
            waits_seen.add(v.wait_of[node])
        elif v.is_coll[node]:
            if not v.is_async_coll[node] or node in waits_seen:
                comp = 0.0
        else:
            comp += v.runtime[node]
        p -= 1
    return 0.0, comp

"""The interface between the cost model and its consumers (simulator, passes).

The simulator never knows how a time was made: it reads a :class:`CostEstimate`.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from enum import IntEnum
from typing import Any

import numpy as np


class LinkClass(IntEnum):
    """The fabric a collective's bandwidth-bound part runs over. Collectives on the same class share it."""

    INTRA_NODE = 0  # NVLink / NVSwitch / xGMI inside one node
    INTER_NODE = 1  # the NICs and the network between nodes


@dataclass(frozen=True, eq=False)
class CostEstimate:
    """Per-node costs of one graph on one hardware configuration (all arrays have one entry per node).

    ``node_s``: standalone duration in seconds: a kernel's time on a compute stream, a collective's time on its
    comm stream when it runs alone; 0 for inputs, views, waits and the output.
    ``coll_latency_s``: the part of a collective's time that does not scale with bandwidth (0 for others); the rest,
    ``node_s - coll_latency_s``, is bandwidth-bound and is shared with concurrent collectives on the same link.
    ``coll_link``: :class:`LinkClass` of each collective's bandwidth-bound part, -1 for non-collectives.
    ``compute_slowdown``: factor (>= 1) by which compute runs slower while any collective is in flight (NCCL kernels
    occupy SMs and memory bandwidth).
    ``comm_slowdown``: factor (>= 1) by which a collective's bandwidth-bound part progresses slower while a kernel
    runs (1 on GPUs; on a CPU, gloo's threads and the socket work compete with compute for the cores).
    ``stream_sync_s``: overhead of one cross-stream dependency (event record + wait).
    ``copy_engine``: per node, a transfer run by the copy engines over NVLink (symmetric memory: async TP's
    per-peer copies, :mod:`commsched.cost.symm_mem`), which occupies no SMs and so does not slow compute
    (:func:`commsched.sim.model.takes_sms`); None: none.
    ``fusion_region``: per node, the fusion region (one fused kernel) it belongs to, -1 for unfused nodes; a region's
    time is spread over its members, so sums are right in any order, and passes can keep a region together.
    """

    node_s: np.ndarray
    coll_latency_s: np.ndarray
    coll_link: np.ndarray
    compute_slowdown: float = 1.0
    stream_sync_s: float = 0.0
    comm_slowdown: float = 1.0
    meta: dict[str, Any] = field(default_factory=dict)
    fusion_region: np.ndarray | None = None
    copy_engine: np.ndarray | None = None

    def __post_init__(self) -> None:
        n = len(self.node_s)
        for name in ("coll_latency_s", "coll_link", "fusion_region", "copy_engine"):
            if getattr(self, name) is not None and len(getattr(self, name)) != n:
                raise ValueError(f"CostEstimate.{name} has {len(getattr(self, name))} entries; expected {n}")
        for name in ("node_s", "coll_latency_s"):
            values = np.asarray(getattr(self, name), np.float64)
            bad = np.flatnonzero(~(np.isfinite(values) & (values >= 0)))
            if len(bad):
                raise ValueError(
                    f"CostEstimate.{name}[{int(bad[0])}] is {values[bad[0]]}; expected finite seconds >= 0"
                )
        for name in ("compute_slowdown", "comm_slowdown"):
            if not 1.0 <= float(getattr(self, name)) < math.inf:
                raise ValueError(f"CostEstimate.{name}={getattr(self, name)}: expected a finite factor >= 1")
        if not 0.0 <= float(self.stream_sync_s) < math.inf:
            raise ValueError(f"CostEstimate.stream_sync_s={self.stream_sync_s}: expected finite seconds >= 0")

    @classmethod
    def from_times(cls, node_s: np.ndarray, coll_link: np.ndarray | None = None, **kw: Any) -> CostEstimate:
        """Costs from plain per-node seconds (all collective time bandwidth-bound, on the intra-node link unless
        ``coll_link`` says otherwise)."""
        node_s = np.asarray(node_s, np.float64)
        link = np.zeros(len(node_s), np.int8) if coll_link is None else np.asarray(coll_link, np.int8)
        return cls(node_s=node_s, coll_latency_s=np.zeros(len(node_s)), coll_link=link, **kw)

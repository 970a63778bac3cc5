"""Graph summaries: counts by kind, collective type and process group; flops; bytes communicated; the share of the
step's compute an activation checkpoint recomputes and float8 training's kernels take."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import TYPE_CHECKING

import numpy as np

from commsched.ir import CollType, Graph, OpKind
from commsched.ir.transform import NODE_TAGS_META

if TYPE_CHECKING:
    from commsched.cost.model import CostEstimate

SHARES = ("recompute", "float8")
"""the parts of a step's compute :func:`compute_shares` reports (the graph's node tags, ``commsched.workloads.tags``)"""
FLOAT8_DTYPES = ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz", "float8_e8m0fnu")


@dataclass
class GraphSummary:
    num_nodes: int
    nodes_by_kind: dict[str, int]
    total_flops: float
    collectives: list[dict] = field(default_factory=list)  # one row per (type, group): count, bytes
    comm_bytes: int = 0  # nccl-tests convention, summed over collectives
    groups: list[dict] = field(default_factory=list)
    shares: dict = field(default_factory=dict)  # compute_shares: recompute and float8, flops and time

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def summarize(g: Graph, costs: CostEstimate | None = None) -> GraphSummary:
    """Counts and totals of a graph (vectorised; O(N)); ``costs``: its estimate, for the time shares."""
    kinds = np.bincount(g.kinds, minlength=len(OpKind))
    rows: dict[tuple[int, int], dict] = {}
    colls = g.collectives
    for _c, t, grp, nb in zip(
        colls.tolist(),
        g.coll_type[colls].tolist(),
        g.coll_group[colls].tolist(),
        g.comm_bytes[colls].tolist(),
        strict=False,
    ):
        row = rows.setdefault(
            (t, grp),
            {
                "type": CollType(t).name.lower(),
                "group": g.groups[grp].name,
                "group_size": g.groups[grp].size,
                "count": 0,
                "bytes": 0,
            },
        )
        row["count"] += 1
        row["bytes"] += nb
    return GraphSummary(
        num_nodes=len(g),
        nodes_by_kind={k.name.lower(): int(kinds[k]) for k in OpKind},
        total_flops=float(g.flops.sum()),
        collectives=[rows[k] for k in sorted(rows)],
        comm_bytes=int(g.comm_bytes.sum()),
        groups=[{"name": p.name, "size": p.size, "stride": p.stride} for p in g.groups],
        shares=compute_shares(g, costs),
    )


def tagged_nodes(g: Graph, tag: str) -> np.ndarray:
    """Ids of the compute nodes (``COMPUTE`` and ``OTHER`` kinds) of one of :data:`SHARES`: the graph's tagged nodes;
    for ``float8`` also, in a graph traced elsewhere, every ``_scaled_mm`` and every kernel writing a float8 tensor."""
    picked = np.zeros(len(g), bool)
    names = g.meta.get(NODE_TAGS_META, {}).get(tag, ())
    picked[[g.index[n] for n in names if n in g.index]] = True
    if tag == "float8":
        float8_buf = np.array([dtype in FLOAT8_DTYPES for dtype in g.buf_dtype], bool)
        picked[np.repeat(np.arange(len(g)), np.diff(g.buf_ptr))[float8_buf]] = True
        picked |= np.array(["_scaled_mm" in t for t in g.targets], bool)
    return np.flatnonzero(picked & np.isin(g.kinds, (OpKind.COMPUTE, OpKind.OTHER)))


def compute_shares(g: Graph, costs: CostEstimate | None = None) -> dict[str, dict]:
    """Per part of :data:`SHARES`: its kernels (``nodes``), their ``flops`` and ``flops_share`` of the step's flops,
    and their ``time_s`` and ``time_share`` of the step's compute time (every kernel but the collectives, one stream,
    serial; None without ``costs``). Zeros for a step without them."""
    compute = np.isin(g.kinds, (OpKind.COMPUTE, OpKind.OTHER))
    total_flops = float(g.flops.sum())
    total_s = float(costs.node_s[compute].sum()) if costs is not None else 0.0
    out = {}
    for tag in SHARES:
        ids = tagged_nodes(g, tag)
        flops = float(g.flops[ids].sum())
        row = {"nodes": len(ids), "flops": flops, "flops_share": flops / total_flops if total_flops else 0.0}
        time_s = float(costs.node_s[ids].sum()) if costs is not None else (None if len(ids) else 0.0)
        share = time_s / total_s if time_s is not None and total_s else (None if time_s is None else 0.0)
        out[tag] = {**row, "time_s": time_s, "time_share": share}
    return out

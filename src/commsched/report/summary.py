"""Graph summaries: counts by kind, collective type and process group; flops; bytes communicated."""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np

from commsched.ir import CollType, Graph, OpKind


@dataclass
class GraphSummary:
    num_nodes: int
    nodes_by_kind: dict[str, int]
    total_flops: float
    collectives: list[dict] = field(default_factory=list)  # one row per (type, group): count, bytes
    comm_bytes: int = 0  # nccl-tests convention, summed over collectives
    groups: list[dict] = field(default_factory=list)

    def to_dict(self) -> dict:
        return self.__dict__.copy()


def summarize(g: Graph) -> GraphSummary:
    """Counts and totals of a graph (vectorised; O(N))."""
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
    )

"""Totals of a cost estimate: compute vs communication, by op class, by collective, and the most expensive ops."""

from __future__ import annotations

from collections import defaultdict

import numpy as np

from commsched.cost.estimate import graph_features
from commsched.cost.model import CostEstimate, LinkClass
from commsched.cost.opclass import OpClass
from commsched.ir import CollType, Graph


def cost_summary(g: Graph, est: CostEstimate, top: int = 10) -> dict:
    """A JSON-ready summary: serial totals (each stream's busy time), per op class, per collective, top ops."""
    f = graph_features(g)
    s = est.node_s
    coll = f.cls == OpClass.COLLECTIVE
    by_class = {OpClass(c).name.lower(): float(s[f.cls == c].sum()) for c in np.unique(f.cls) if c != OpClass.FREE}
    rows: dict[tuple, dict] = defaultdict(lambda: {"count": 0, "time_s": 0.0, "bytes": 0})
    algos = est.meta.get("collective_algorithms", {})
    for i in np.flatnonzero(coll).tolist():
        grp = g.groups[int(g.coll_group[i])]
        key = (CollType(int(g.coll_type[i])).name.lower(), grp.name, grp.size, grp.stride, algos.get(i, ""),
               LinkClass(int(est.coll_link[i])).name.lower())  # fmt: skip
        r = rows[key]
        r["count"] += 1
        r["time_s"] += float(s[i])
        r["bytes"] += int(g.comm_bytes[i])
    order = np.argsort(-s, kind="stable")[:top]
    total_compute = float(s[~coll].sum())
    total_comm = float(s[coll].sum())
    return {
        "hardware": est.meta.get("hardware"),
        "num_nodes": est.meta.get("num_nodes"),
        "gpus_per_node": est.meta.get("gpus_per_node"),
        "compute_s": total_compute,
        "communication_s": total_comm,
        "serial_s": total_compute + total_comm,
        "fusion_regions": est.meta.get("fusion_regions", 0),
        "fused_nodes": int((est.fusion_region >= 0).sum()) if est.fusion_region is not None else 0,
        "by_class_s": by_class,
        "collectives": [
            {"type": k[0], "group": k[1], "group_size": k[2], "stride": k[3], "algorithm": k[4], "link": k[5], **v}
            for k, v in sorted(rows.items(), key=lambda kv: -kv[1]["time_s"])
        ],
        "top_ops": [
            {
                "node": g.names[i],
                "target": g.targets[i],
                "class": OpClass(int(f.cls[i])).name.lower(),
                "time_s": float(s[i]),
                "share": float(s[i] / max(s.sum(), 1e-300)),
                "fusion_region": int(est.fusion_region[i]) if est.fusion_region is not None else -1,
            }
            for i in order.tolist()
            if s[i] > 0
        ],
    }

"""The optimize searches the executor tests compare across backends, on llama3-8b at 8 ranks, 2 layers, with 17
bucket caps (36 candidates): on FSDP, 21 distinct plans get judged; on DDP, a bucket plan wins (so the winner is
rebuilt from a worker's verdict)."""

from __future__ import annotations

import json
import sys

CAPS = tuple((f"cap {m} MiB", {"cap_bytes": m << 20}) for m in (2, 4, 6, 8, 12, 16, 24, 32, 48, 64, 128, 256, 512))
CAPS += tuple((f"structural, cap {m} MiB", {"cap_bytes": m << 20, "early_use": False}) for m in (8, 32, 128, 512))


def optimized(parallel: str, executor=None) -> dict:
    """``optimize(...).to_dict()`` without its wall time, plus the returned graph's size."""
    from commsched.optimize import optimize
    from commsched.workloads import build

    w = build("llama3-8b", parallel=parallel, world_size=8, layers=2)
    o = optimize(w.graph_module, "h100-sxm", group_sizes=w.graph.group_sizes(), granularities=CAPS, executor=executor)
    out = o.to_dict()
    out.pop("wall_s")
    out["returned_nodes"] = len(o.graph)
    return out


if __name__ == "__main__":  # python optimize_helpers.py ADDRESS: the FSDP search on Ray at ADDRESS, JSON on stdout
    from commsched.execute.ray_backend import RayExecutor

    ex = RayExecutor(sys.argv[1], jobs=2)
    try:
        print(json.dumps(optimized("fsdp", ex)))
    finally:
        ex.close()

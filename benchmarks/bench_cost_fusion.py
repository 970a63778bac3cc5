"""Fusion regions: commsched's against torch 2.13's peer (``torch._inductor.fx_passes.fusion_regions``).

Usage: python benchmarks/bench_cost_fusion.py
Both region sets are charged the same way (one launch and the boundary bytes per region, commsched's H100 profile),
so the table compares only which nodes each groups. torch groups connected fusible nodes inside runs of fusible nodes
that are contiguous in program order; commsched also fuses across such runs when no cycle can form.
"""

from __future__ import annotations

import sys
from pathlib import Path

import numpy as np

sys.path.insert(0, str(Path(__file__).resolve().parent))
sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "tests"))


def torch_regions(gm, g) -> np.ndarray:
    from torch._inductor.fx_passes.fusion_regions import build_fusion_regions

    region = np.full(len(g), -1, np.int64)
    ids: dict[int, int] = {}
    for node, members in build_fusion_regions(gm).items():
        rid = ids.setdefault(id(members), len(ids))
        region[g.index[node.name]] = rid
    return region


def main() -> None:
    from bench_cost_cpu import transformer_block_step
    from torch.fx.experimental.proxy_tensor import make_fx

    from commsched import hardware
    from commsched.cost import estimate_costs, graph_features
    from commsched.cost.estimate import _fused_times, _peak_per_node
    from commsched.frontends.fx import from_fx
    from commsched.ir import OpKind
    from programs import trace_program

    hw = hardware.get("h100-sxm", num_nodes=2)
    step, inputs = transformer_block_step(d=1024, heads=16, tokens=2048, ff=4096)
    cases = [("transformer block fwd+bwd", make_fx(step, tracing_mode="fake")(*inputs))]
    cases.append(("FSDP MLP fwd+bwd, 8 layers, world 16", trace_program("fsdp_mlp", 16, layers=8, dim=1024)[0]))
    print("| graph | fusible nodes | regions (nodes) torch 2.13 | regions (nodes) commsched | memory-bound time: "
          "unfused / torch regions / commsched regions |")  # fmt: skip
    print("|---|---|---|---|---|")
    for name, gm in cases:
        g = from_fx(gm)
        f = graph_features(g)
        eager = estimate_costs(g, hw, fusion=False).node_s
        ours = estimate_costs(g, hw).fusion_region
        theirs = torch_regions(gm, g)
        peak = _peak_per_node(f, hw)
        t_theirs = _fused_times(g, f, theirs, eager, peak, hw)
        t_ours = _fused_times(g, f, ours, eager, peak, hw)
        mem = f.fusible & (g.kinds != OpKind.VIEW)

        def count(region, mem=mem):
            members = (region >= 0) & mem
            return f"{len(np.unique(region[members]))} ({int(members.sum())})"

        times = " / ".join(f"{t[mem].sum() * 1e6:.0f} us" for t in (eager, t_theirs, t_ours))
        print(f"| {name} | {int(mem.sum())} | {count(theirs)} | {count(ours)} | {times} |")


if __name__ == "__main__":
    main()

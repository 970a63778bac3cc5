"""Optimality gap of the schedulers against the CP-SAT optimum on graphs small enough for it.

Usage: python benchmarks/bench_exact_gap.py
Graphs: traced zoo steps (llama-tiny, 1 layer) at world 8 on h100-sxm, with compute scaled so that communication
matters; the exact model has no interference and no link sharing, so the costs here have neither
(compute_slowdown 1, one group per link), and the simulator then agrees with the solver's objective.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from commsched.cost import estimate_costs
from commsched.hardware import get
from commsched.memory import memory_profile
from commsched.passes import schedule
from commsched.passes.exact import solve_exact
from commsched.sim import simulate_costs
from commsched.workloads import build

CASES = [
    ("llama-tiny", "fsdp", "train"),
    ("llama-tiny", "tp", "train"),
    ("llama-tiny", "tp", "decode"),
    ("mixtral-tiny", "ep", "decode"),
]


def main() -> None:
    print(
        "| workload | nodes | CP-SAT optimum (us) | status | overlap (us) | gap | overlap reorder (us) | gap | "
        "torch passes (us) | gap | input (us) |"
    )
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    for preset, parallel, mode in CASES:
        g = build(preset, parallel=parallel, world_size=8, layers=1, mode=mode).graph
        costs = estimate_costs(g, get("h100-sxm"))
        # make communication matter (tiny presets are compute-light) and drop what the exact model lacks
        node_s = np.where(g.coll_type >= 0, costs.node_s * 20, costs.node_s)
        costs = dataclasses.replace(
            costs,
            node_s=node_s,
            coll_latency_s=np.minimum(costs.coll_latency_s, node_s),
            compute_slowdown=1.0,
            stream_sync_s=0.0,
        )
        budget = int(memory_profile(g).peak_bytes * 1.05)
        ours = schedule(g, costs, "default")
        ours_r = schedule(g, costs, "default", reorder_collectives=True)
        seed = schedule(g, costs, "torch")
        exact = solve_exact(g, costs, memory_budget_bytes=budget, time_limit_s=60, hint=ours.order)
        t = {k: simulate_costs(g, costs, s.order).makespan_s for k, s in (("o", ours), ("r", ours_r), ("s", seed))}
        base = simulate_costs(g, costs).makespan_s
        opt = exact.makespan_s

        def gap(x, opt=opt):
            return f"{(x / opt - 1) * 100:+.2f} %"

        print(
            f"| {preset} {parallel} {mode} | {len(g)} | {opt * 1e6:.1f} | {exact.status} | {t['o'] * 1e6:.1f} | "
            f"{gap(t['o'])} | {t['r'] * 1e6:.1f} | {gap(t['r'])} | {t['s'] * 1e6:.1f} | {gap(t['s'])} | "
            f"{base * 1e6:.1f} |"
        )


if __name__ == "__main__":
    main()

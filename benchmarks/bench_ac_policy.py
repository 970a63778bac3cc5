"""Per-layer activation checkpointing under a memory budget (issue 38): the AC policy family of ``optimize`` against
torch's ``sac_ilp``, both costed by commsched's simulator.

Usage: python benchmarks/bench_ac_policy.py [--preset llama3-8b] [--layers 4] [--seq-len 4096] [--world 8]
                                            [--hardware h100-sxm] [--ratios 1.0,0.9,0.8,0.7,0.6]
The zoo step (FSDP, no AC) on ``--hardware``; for each budget, a ratio of the step's no-AC peak (each tool its own:
their memory models count different things):
- ours: ``optimize`` with the AC policy family alone in its registry (the other families' variants would blur what
  the policy gains), the budget in bytes: the kept step, its peak and plan, how many plans it probed;
- torch: ``sac_milp`` (:mod:`commsched.peers.torch_sac`) on the same model under the same ratio of its own no-AC
  peak, its per-block discard fractions mapped to the zoo's policies (never discarding less), the step retraced
  with them and scheduled by ``overlap`` under the same byte budget: its step and peak, or why none;
- the uniform policies (none, selective-op, full) scheduled alike, for reference.
Prints a markdown table for RESULTS.md.
"""

from __future__ import annotations

import argparse
import dataclasses
import time


def _scheduled(w, hw, budget_bytes: int):
    """The step ``w`` scheduled by ``overlap`` (collectives reordered) under ``budget_bytes``: a Variant or Tried."""
    from commsched.cost import estimate_costs
    from commsched.optimize.protocol import schedule_variant
    from commsched.passes import MemoryBudget

    costs = estimate_costs(w.graph, hw)
    knobs = {"reorder_collectives": True, "memory_budget": MemoryBudget(bytes=budget_bytes)}
    return schedule_variant("", w.graph, costs, knobs)


def _cell(v, budget_bytes: int) -> str:
    from commsched.optimize.protocol import Variant

    if not isinstance(v, Variant):
        return v.verdict.split(" (")[0]
    over = "" if v.sim.peak_memory_bytes <= budget_bytes else " OVER"
    return f"{v.sim.makespan_s * 1e3:.2f} ms / {v.sim.peak_memory_bytes / 2**30:.2f} GiB{over}"


def _ours(w, hw, budget_bytes: int):
    """``optimize`` with the AC policy family alone: (the Optimized, how many per-layer plans it probed)."""
    import commsched
    import commsched.optimize.search as search
    from commsched.optimize.families import ac_policy
    from commsched.passes import MemoryBudget

    saved, search.FAMILIES = search.FAMILIES, {ac_policy.name: ac_policy}
    try:
        o = commsched.optimize(w.graph_module, hw, memory_budget=MemoryBudget(bytes=budget_bytes))
    finally:
        search.FAMILIES = saved
    plans = {t.label.split(", est.")[0] for t in o.tried if t.label.startswith(ac_policy.LABEL)}
    return o, len(plans)


def run(args) -> list[str]:
    from commsched import hardware
    from commsched.cost import estimate_costs
    from commsched.optimize.families.ac_policy import traced
    from commsched.peers.torch_sac import as_block_policies, ilp_graph, sac_ilp_plan
    from commsched.sim import simulate_costs
    from commsched.workloads import resolve
    from commsched.workloads.ac import per_layer_ac

    spec = resolve(args.preset, parallel="fsdp", world_size=args.world, layers=args.layers, seq_len=args.seq_len)
    uniform = {ac: traced(dataclasses.replace(spec, ac=ac)) for ac in ("none", "selective-op", "full")}
    hw = hardware.for_graph(args.hardware, uniform["none"].graph)
    peaks = {ac: simulate_costs(w.graph, estimate_costs(w.graph, hw)).peak_memory_bytes for ac, w in uniform.items()}
    selective_discard = (peaks["none"] - peaks["selective-op"]) / (peaks["none"] - peaks["full"])
    t0 = time.perf_counter()
    g = ilp_graph(spec, hw)
    torch_stats_s = time.perf_counter() - t0
    lines = [
        f"{args.preset}, {args.layers} layers, seq {args.seq_len}, FSDP over {args.world} ranks, {args.hardware}; "
        f"no-AC peak {peaks['none'] / 2**30:.2f} GiB (program order), all-full {peaks['full'] / 2**30:.2f} GiB; "
        f"selective-op drops {selective_discard:.2f} of a block's saved activations; torch's statistics "
        f"{torch_stats_s:.1f} s",
        "",
        "| budget | ours: kept (plan) | ours: step / peak | probed | wall | sac_ilp: discard per block -> plan | "
        "sac_ilp plan: step / peak | none | selective-op | full |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for ratio in args.ratios:
        budget = int(peaks["none"] * ratio)
        o, probed = _ours(uniform["none"], hw, budget)
        t = time.perf_counter()
        plan = sac_ilp_plan(g, max(spec.plan.fsdp, 1), ratio)
        solve_s = time.perf_counter() - t
        if plan.peak_bytes < 0:
            theirs, mapped = "no solution", "-"
        else:
            policies = as_block_policies(plan, selective_discard)
            mapped = per_layer_ac(policies).partition(":")[2]
            ac = policies[0] if len(set(policies)) == 1 else per_layer_ac(policies)
            theirs = _cell(_scheduled(traced(dataclasses.replace(spec, ac=ac)), hw, budget), budget)
        discard = ", ".join(f"{r:.2f}" for r in plan.discard)
        kept = o.label.split(", est.")[0]
        fits = "" if o.after.peak_memory_bytes <= budget else " OVER"
        lines.append(
            f"| {ratio:.2f} ({budget / 2**30:.2f} GiB) | {kept} | {o.after.makespan_s * 1e3:.2f} ms / "
            f"{o.after.peak_memory_bytes / 2**30:.2f} GiB{fits} | {probed} | {o.wall_s:.0f} s | [{discard}] -> "
            f"{mapped} ({solve_s:.1f} s) | {theirs} | "
            + " | ".join(_cell(_scheduled(w, hw, budget), budget) for w in uniform.values())
            + " |"
        )
        print(lines[-1], flush=True)
    return lines


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    p.add_argument("--preset", default="llama3-8b")
    p.add_argument("--layers", type=int, default=4)
    p.add_argument("--seq-len", type=int, default=4096)
    p.add_argument("--world", type=int, default=8)
    p.add_argument("--hardware", default="h100-sxm")
    p.add_argument("--ratios", type=lambda s: [float(x) for x in s.split(",")], default=[1.0, 0.9, 0.8, 0.7, 0.6])
    print("\n".join(run(p.parse_args())))


if __name__ == "__main__":
    main()

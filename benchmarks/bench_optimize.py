"""``commsched.optimize`` against torch's three overlap configurations, in the same run, with the same costs.

Usage: python benchmarks/bench_optimize.py [--quick] [--case N ...] [--hardware PROFILE]
Per traced zoo step (h100-sxm, nodes = world / 8): the traced order; the step as the framework runs it today
(``experiments/references.py``: FSDP2 eager on the per-block trace, DDP eager, else torch.compile's default order);
torch 2.13's ``schedule_overlap_bucketing``
plain, with collective bucketing, and with FSDP pre-bucketing + bucketing (all fed our per-node costs; bucketed
collectives it creates are costed by our collective model when the result is re-imported); ours reorder-only (the
``overlap`` pass with ``reorder_collectives``); ``optimize`` without program transforms (bucketing and reordering
only); and ``optimize``. Every program is simulated by our simulator with our
cost model; "bound" is the simulator's lower bound of that program. When torch's best configuration peaks above
``optimize``'s default budget (1.05 x the traced peak), ``optimize`` also runs with torch's best's peak as its budget,
so the ratio compares at equal memory. Prints a markdown table for RESULTS.md.
"""

from __future__ import annotations

import argparse
import math
import time

CASES = [  # (preset, parallel, world, layers, seq_len or None, mode[, batch]): the acceptance set
    ("llama3-8b", "fsdp", 8, 4, None, "train"),
    ("llama3-8b", "fsdp", 64, 4, None, "train"),
    ("llama3-8b", "fsdp", 256, 4, None, "train"),
    ("llama3-8b", "fsdp", 512, 16, 2048, "train"),
    ("llama3-70b", "fsdp+tp", 512, 4, None, "train"),
    ("llama3-70b", "fsdp+tp", 1024, 16, None, "train"),
    ("llama3-8b", "tp", 8, 4, None, "train"),
    ("llama3-70b", "tp", 8, 16, None, "decode"),
    ("llama3-8b", "ddp", 64, 4, 2048, "train"),
    ("mixtral-8x7b", "ep", 8, 2, 2048, "train"),
    ("mixtral-8x7b", "fsdp+ep", 64, 2, 2048, "train"),  # EP with FSDP (torchtitan's MoE mesh)
    # issue 18 (program transforms) adds these three
    ("llama3-8b", "tp+sp", 8, 4, None, "prefill"),
    ("mixtral-8x7b", "ep", 8, 2, 2048, "prefill"),
    ("mixtral-8x7b", "ep", 8, 2, None, "decode"),
    # split-batch overlap (issue 18) needs >= 2 sequences: (..., batch)
    ("llama3-8b", "tp+sp", 8, 4, 4096, "prefill", 2),
    ("mixtral-8x7b", "ep", 8, 2, 2048, "prefill", 2),
    ("mixtral-8x7b", "ep", 8, 2, 2048, "train", 2),
]
QUICK = CASES[:2]


def _simulate_fx(gm, sizes, hw, meta):
    """Re-import a (possibly rewritten) module in its node order, cost it on ``hw`` and simulate that order."""
    from commsched import from_fx, simulate_costs
    from commsched.cost import estimate_costs

    g = from_fx(gm, group_sizes=sizes, meta=meta)
    return g, simulate_costs(g, estimate_costs(g, hw))


def case_rows(
    preset, parallel, world, layers, seq_len, mode="train", batch=None, hardware="h100-sxm"
) -> tuple[str, list[tuple]]:
    import commsched
    from commsched.cost import estimate_costs
    from commsched.hardware import for_graph
    from commsched.passes import MemoryBudget
    from commsched.peers import run_torch_overlap_scheduler
    from commsched.workloads import build

    w = build(preset, parallel=parallel, world_size=world, layers=layers, seq_len=seq_len, mode=mode, batch=batch)
    g, gm = w.graph, w.graph_module
    hw = for_graph(hardware, g)
    costs = estimate_costs(g, hw)
    sizes = g.group_sizes()
    base = commsched.simulate_costs(g, costs)
    rows = [("traced order", len(g.collectives), base, None)]
    # what the user runs today (issue 36.9): FSDP2 / DDP eager on the framework's program, torch.compile's order else
    from commsched.experiments.references import TORCH_CONFIGS, framework_program, reference_steps

    fw = framework_program(preset, dict(parallel=parallel, world_size=world, layers=layers, seq_len=seq_len, mode=mode,
                                        batch=batch))  # fmt: skip
    ref = reference_steps(g, hw, framework_graph=None if fw is None else fw.graph).framework
    rows.append((f"framework: {ref.label}", len(ref.sim.graph.collectives), ref.sim, ref.wall_s))
    for label, knobs in TORCH_CONFIGS:
        try:
            r = run_torch_overlap_scheduler(gm, g, costs, **knobs)
        except Exception as exc:  # a configuration torch cannot run here is a row, not a crash
            rows.append((f"{label} (failed: {type(exc).__name__})", None, None, None))
            continue
        g2, sim = _simulate_fx(r.gm, sizes, hw, g.meta)
        rows.append((label, len(g2.collectives), sim, r.wall_s))
    t0 = time.perf_counter()
    s = commsched.schedule(g, costs, "default", reorder_collectives=True)
    rows.append(("ours reorder-only", len(g.collectives), commsched.simulate_costs(g, costs, s.order),
                 time.perf_counter() - t0))  # fmt: skip
    torch_rows = [r for r in rows if r[0].startswith("torch") and r[2] is not None]
    torch_peak = min(torch_rows, key=lambda r: r[2].makespan_s)[2].peak_memory_bytes
    labels = {False: "optimize without transforms", True: "optimize"}
    kept = ""
    for transforms in (False, True):  # issue 18: the same search without and with program transforms
        o = commsched.optimize(gm, hw, group_sizes=sizes, transforms=transforms)
        rows.append((labels[transforms], len(o.graph.collectives), o.after, o.wall_s))
        kept = o.label
        if torch_peak > o.budget_bytes or o.after.peak_memory_bytes > torch_peak:  # compare at torch's memory too
            o2 = commsched.optimize(gm, hw, group_sizes=sizes, memory_budget=MemoryBudget(bytes=torch_peak),
                                    transforms=transforms)  # fmt: skip
            rows.append((f"{labels[transforms]}, torch's best's peak as budget", len(o2.graph.collectives),
                         o2.after, o2.wall_s))  # fmt: skip
            if o2.after.makespan_s < o.after.makespan_s:
                kept += f" (at torch's peak: {o2.label})"
    title = f"{preset} / {parallel} / world {world} / {layers} layers" + (f" / seq {seq_len}" if seq_len else "")
    title += f" / {mode}" if mode != "train" else ""
    title += f" / batch {batch}" if batch else ""
    return f"{title} — {len(g)} nodes, {hardware} x {hw.num_nodes} nodes; optimize kept: {kept}", rows


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="the first two cases only")
    ap.add_argument("--case", action="append", type=int, help="run only this row of CASES (0-based; repeatable)")
    ap.add_argument("--hardware", default="h100-sxm", help="profile (h100-sxm@nccl-defaults: NCCL's constants)")
    args = ap.parse_args()
    ratios: dict[str, list[float]] = {}
    cases = [CASES[i] for i in args.case] if args.case else QUICK if args.quick else CASES
    for case in cases:
        title, rows = case_rows(*case, hardware=args.hardware)
        print(f"\n#### {title}\n")
        print("| program | collectives | step (ms) | bound (ms) | peak (GiB) | wall (s) |")
        print("|---|---|---|---|---|---|")
        for label, n, sim, wall in rows:
            if sim is None:
                print(f"| {label} | - | - | - | - | - |")
                continue
            w = "-" if wall is None else f"{wall:.2f}"
            print(f"| {label} | {n} | {sim.makespan_s * 1e3:.2f} | {sim.lower_bound_s * 1e3:.2f} | "
                  f"{sim.peak_memory_bytes / 2**30:.2f} | {w} |")  # fmt: skip
        torch_rows = [r for r in rows if r[0].startswith("torch") and r[2] is not None]
        if not torch_rows:
            continue
        best = min(torch_rows, key=lambda r: r[2].makespan_s)
        framework = next(r for r in rows if r[0].startswith("framework: "))
        kept = next(r for r in rows if r[0] == "optimize")
        print(f"\noptimize / {framework[0].removeprefix('framework: ')}: "
              f"{kept[2].makespan_s / framework[2].makespan_s:.3f} (peak {kept[2].peak_memory_bytes / 2**30:.2f} vs "
              f"{framework[2].peak_memory_bytes / 2**30:.2f} GiB)")  # fmt: skip
        for key, prefix in (("without", "optimize without transforms"), ("with", "optimize")):
            # the fastest row of this search within torch's best's peak (equal or less memory)
            ours = [r for r in rows if r[0].startswith(prefix) and (key == "without") == ("without" in r[0])
                    and r[2].peak_memory_bytes <= best[2].peak_memory_bytes]  # fmt: skip
            if not ours:
                print(f"\n{prefix} found no program within torch's best's peak")
                continue
            mine = min(ours, key=lambda r: r[2].makespan_s)
            ratios.setdefault(key, []).append(mine[2].makespan_s / best[2].makespan_s)
            print(f"\n{prefix} / torch's best: {ratios[key][-1]:.3f} at {mine[2].peak_memory_bytes / 2**30:.2f} vs "
                  f"{best[2].peak_memory_bytes / 2**30:.2f} GiB, bound {mine[2].lower_bound_s * 1e3:.2f} ms; "
                  f"wall {mine[3]:.2f} s vs {best[3]:.2f} s")  # fmt: skip
    for key, rs in ratios.items():
        geo = math.exp(sum(math.log(r) for r in rs) / len(rs))
        print(f"\ngeomean optimize ({key} transforms) / torch's best over {len(rs)} steps: {geo:.3f} "
              f"(max {max(rs):.3f})")  # fmt: skip


if __name__ == "__main__":
    main()

"""Simulated step time of per-parameter FSDP steps before and after bucketing, and of TP decode steps before and
after the one-shot all_reduce lowering, on the H100 profile.

Usage: python benchmarks/bench_bucketing.py [--layers 4] [--quick]

Per configuration (llama3-8b, FSDP2-style per-parameter all_gathers / reduce_scatters, world 8 / 64 / 512 on
1 / 8 / 64 nodes): the step as traced, and bucketed with the plan made (a) on the traced order, (b) on the order the
flagship scheduler ("default") chose for the traced step; each simulated in the traced order ("none") and after the
flagship scheduler. The zoo's FSDP2 per-unit all_gather ("block") is shown for reference. Wall time: plan + FX
rewrite (not the re-import).
"""

from __future__ import annotations

import argparse
import time

from commsched import from_fx, hardware
from commsched.cost import estimate_costs
from commsched.passes import schedule
from commsched.rewrites import BucketConfig, bucket_collectives
from commsched.rewrites.lower_all_reduce import lower_all_reduces
from commsched.sim import simulate_costs
from commsched.workloads import build


def _sim(graph, hw, preset: str):
    costs = estimate_costs(graph, hw)
    sched = schedule(graph, costs, preset)
    res = simulate_costs(graph, costs, sched.order)
    return res, sched, costs


def _row(label: str, graph, hw, extra: str = "") -> dict:
    out = {"label": label, "colls": len(graph.collectives), "extra": extra}
    for preset in ("none", "default"):
        res, sched, costs = _sim(graph, hw, preset)
        out[preset] = (res.makespan_s, res.exposed_comm_s, res.peak_memory_bytes)
        out[f"{preset}_sched"] = (sched, costs)
    return out


def bucketing(layers: int, worlds: list[int], seqs: list[int | None]) -> None:
    print("| world / seq | step | collectives | traced order | exposed | flagship | exposed | plan + rewrite |")
    print("|---|---|---|---|---|---|---|---|")
    for world in worlds:
        hw = hardware.get("h100-sxm", num_nodes=max(1, world // 8))
        for seq in seqs:
            w = build("llama3-8b", parallel="fsdp", world_size=world, layers=layers, seq_len=seq)
            sizes = {g["name"]: g["size"] for g in w.meta["groups"].values()}
            rows = [_row("per-parameter (traced)", w.graph, hw)]
            t0 = time.perf_counter()
            res, _ = bucket_collectives(w.graph_module, hw, graph=w.graph)
            wall = time.perf_counter() - t0
            rows.append(_row("bucketed, plan on traced order", from_fx(res.gm, group_sizes=sizes), hw, f"{wall:.2f} s"))
            sched, costs = rows[0]["default_sched"]
            t0 = time.perf_counter()
            res, plan2 = bucket_collectives(w.graph_module, hw, graph=w.graph, order=sched.order, costs=costs)
            wall = time.perf_counter() - t0
            rows.append(
                _row("bucketed, plan on flagship order", from_fx(res.gm, group_sizes=sizes), hw, f"{wall:.2f} s")
            )
            greedy, _ = bucket_collectives(w.graph_module, hw, graph=w.graph, config=BucketConfig(overlap_aware=False))
            rows.append(_row("bucketed up to the cap only", from_fx(greedy.gm, group_sizes=sizes), hw))
            wb = build("llama3-8b", parallel="fsdp", world_size=world, layers=layers, seq_len=seq, fsdp_bucket="block")
            rows.append(_row("zoo FSDP2 per-unit (reference)", wb.graph, hw))
            base = rows[0]["default"][0]
            for r in rows:
                n_ms, n_exp, _ = r["none"]
                d_ms, d_exp, _ = r["default"]
                delta = f" ({(d_ms / base - 1) * 100:+.1f} %)" if r is not rows[0] else ""
                head = f"| {world} / {seq or 8192} | {r['label']} | {r['colls']} "
                print(
                    f"{head}| {n_ms * 1e3:.2f} ms | {n_exp * 1e3:.2f} ms "
                    f"| {d_ms * 1e3:.2f} ms{delta} | {d_exp * 1e3:.2f} ms | {r['extra']} |"
                )
            s = plan2.summary()
            print(
                f"|  | flagship-order plan: {s['merged_buckets']} buckets of {s['collectives_merged']} collectives, "
                f"closed by {s['closed_by']}, cap {min(s['caps_bytes'].values()) / 2**20:.0f} MiB |  |  |  |  |  |  |"
            )


def one_shot(layers: int) -> None:
    print("| step | all_reduces | lowered one-shot | traced order | flagship | exposed |")
    print("|---|---|---|---|---|---|")
    hw = hardware.get("h100-sxm")
    for preset, batch in (("llama3-8b", 8), ("llama3-70b", 8), ("llama3-70b", 64)):
        w = build(preset, parallel="tp", world_size=8, layers=layers, mode="decode", batch=batch, seq_len=4096)
        sizes = {g["name"]: g["size"] for g in w.meta["groups"].values()}
        res = lower_all_reduces(w.graph_module, hw, graph=w.graph)
        for label, g in (("NCCL (traced)", w.graph), ("lowered", from_fx(res.gm, group_sizes=sizes))):
            none, _, _ = _sim(g, hw, "none")
            dflt, _, _ = _sim(g, hw, "default")
            shots = res.counts.get("one_shot", 0) if label == "lowered" else 0
            print(
                f"| {preset} tp8 decode batch {batch}, {label} | {len(g.collectives)} | {shots} | "
                f"{none.makespan_s * 1e3:.3f} ms | {dflt.makespan_s * 1e3:.3f} ms "
                f"| {dflt.exposed_comm_s * 1e3:.3f} ms |"
            )


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--quick", action="store_true", help="world 64 only, default sequence length")
    args = ap.parse_args()
    worlds = [64] if args.quick else [8, 64, 512]
    seqs = [None] if args.quick else [None, 2048]
    bucketing(args.layers, worlds, seqs)
    print()
    one_shot(args.layers)


if __name__ == "__main__":
    main()

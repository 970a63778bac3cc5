"""Trace time and node counts of zoo workloads (make_fx over fake tensors + from_fx), per world size and depth.

Usage: python benchmarks/bench_trace.py [--repeat 3] [--cold]
       python benchmarks/bench_trace.py --plan [--layers 2 4] [--only NAME] [--src DIR]
Warm times are the best of ``--repeat`` traces in one process after a warm-up trace (torch's first trace pays
for lazy imports and kernel registration); ``--cold`` also times ``commsched trace`` as a user sees it: a fresh
Python process that imports torch and traces once.

``--plan``: the traces ``commsched plan llama3-70b --gpus 512 --seq-len 8192`` makes of a layout it has not cached
(``experiments.predict.trace`` of the layout's StepConfig), each in a fresh process after a warm-up trace of
llama-tiny (a plan worker has paid for torch's imports and first trace): CPU seconds of the trace (robust to a
loaded machine), wall seconds, FX nodes made by make_fx and kept. ``--src``: the ``src`` folder to measure (e.g.
another worktree's, for a before / after).
"""

from __future__ import annotations

import argparse
import subprocess
import sys
import time
from pathlib import Path

CONFIGS = [
    ("llama3-8b", "fsdp", 8, 4),
    ("llama3-8b", "fsdp", 1024, 4),
    ("llama3-8b", "fsdp", 8, 32),
    ("llama3-8b", "fsdp", 1024, 32),
    ("mixtral-8x7b", "ep", 8, 4),
    ("mixtral-8x7b", "ep", 1024, 4),
    ("mixtral-8x7b", "ep", 8, 32),
    ("mixtral-8x7b", "ep", 1024, 32),
]


def warm(preset: str, parallel: str, world: int, layers: int, repeat: int) -> dict:
    from commsched.frontends.fake_pg import fake_process_group
    from commsched.frontends.fx import from_fx
    from commsched.workloads import build

    totals, imports = [], []
    with fake_process_group(world):  # kept open so that from_fx can resolve the subgroups again below
        for _ in range(repeat):
            t0 = time.perf_counter()
            w = build(preset, parallel=parallel, world_size=world, layers=layers)
            totals.append(time.perf_counter() - t0)
            t0 = time.perf_counter()
            from_fx(w.graph_module)
            imports.append(time.perf_counter() - t0)
    return {"total_s": min(totals), "from_fx_s": min(imports), "fx_nodes": len(w.graph_module.graph.nodes), "w": w}


def cold(preset: str, parallel: str, world: int, layers: int) -> float:
    src = Path(__file__).resolve().parents[1] / "src"
    code = (
        f"import sys; sys.path.insert(0, {str(src)!r}); from commsched.workloads import build; "
        f"build({preset!r}, parallel={parallel!r}, world_size={world}, layers={layers})"
    )
    t0 = time.perf_counter()
    subprocess.run([sys.executable, "-c", code], check=True, capture_output=True)
    return time.perf_counter() - t0


# plan's layouts of llama3-70b on 512 ranks (seq 8192) as StepConfig fields: FSDP only, FSDP + TP 8 + SP, and two of
# bench_plan.py's sample (its winner and its largest trace: ring attention over 128 CP ranks)
PLAN_LAYOUTS = {
    "dp_shard 512": {"parallel": "fsdp"},
    "dp_shard 64 x tp 8 (sp)": {"parallel": "fsdp+tp+sp", "tp_size": 8},
    "dp_replicate 8 x dp_shard 8 x cp 4 x tp 2 (sp) / ac full / float8 tensorwise": {
        "parallel": "fsdp+tp+sp", "tp_size": 2, "batch": 8, "ac": "full", "float8": "tensorwise",
        "float8_all_gather": True, "dp_replicate": 8, "extra": (("cp_rotate", "allgather"), ("cp_size", 4))},
    "dp_replicate 2 x cp 128 x tp 2 / ac full": {
        "parallel": "fsdp+tp", "tp_size": 2, "batch": 256, "ac": "full", "dp_replicate": 2,
        "extra": (("cp_rotate", "allgather"), ("cp_size", 128))},
}  # fmt: skip

PLAN_TRACE = """
import json, sys, time
import torch.fx
from commsched.experiments.predict import StepConfig, trace
trace(StepConfig(preset="llama-tiny", parallel="fsdp", world_size=8, layers=1))  # what a plan worker has paid
made = 0
create_node = torch.fx.Graph.create_node
def counted(self, *args, **kwargs):
    global made
    made += 1
    return create_node(self, *args, **kwargs)
torch.fx.Graph.create_node = counted
fields = json.loads(sys.argv[1])
fields["extra"] = tuple(tuple(x) for x in fields.get("extra", ()))
config = StepConfig(preset="llama3-70b", world_size=512, seq_len=8192, **fields)
cpu0, wall0 = time.process_time(), time.perf_counter()
w = trace(config)
print(json.dumps({"cpu_s": time.process_time() - cpu0, "wall_s": time.perf_counter() - wall0, "made": made,
                  "kept": len(w.graph_module.graph.nodes), "ir_nodes": len(w.graph)}))
"""


def plan_traces(layers: list[int], only: str | None, src: Path) -> None:
    """One row per layout and depth: a cold trace (nothing cached) in a fresh, warmed-up process."""
    import json

    print("| layout | layers | FX nodes made / kept | trace CPU | trace wall |")
    print("|---|---:|---:|---:|---:|")
    for name, fields in PLAN_LAYOUTS.items():
        if only is not None and only not in name:
            continue
        for depth in layers:
            arg = json.dumps({**fields, "layers": depth})
            env = {**__import__("os").environ, "PYTHONPATH": str(src)}
            out = subprocess.run([sys.executable, "-c", PLAN_TRACE, arg], check=True, capture_output=True, text=True,
                                 env=env).stdout  # fmt: skip
            r = json.loads(out.strip().splitlines()[-1])
            print(f"| {name} | {depth} | {r['made']:,} / {r['kept']:,} | {r['cpu_s']:.1f} s | {r['wall_s']:.1f} s |",
                  flush=True)  # fmt: skip


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--cold", action="store_true", help="also time a fresh process per configuration")
    ap.add_argument("--plan", action="store_true", help="plan's cold traces of llama3-70b layouts on 512 ranks")
    ap.add_argument("--layers", type=int, nargs="+", default=[2, 4])
    ap.add_argument("--only", default=None, help="--plan: the layouts whose name contains this")
    ap.add_argument("--src", type=Path, default=Path(__file__).resolve().parents[1] / "src")
    args = ap.parse_args()
    if args.plan:
        plan_traces(args.layers, args.only, args.src.resolve())
        return
    from commsched.workloads import build

    build("llama-tiny", parallel="fsdp", world_size=8, layers=1)  # warm-up
    print(
        "| workload | world | layers | IR nodes | collectives | trace (make_fx) | from_fx | total warm |"
        + (" cold process |" if args.cold else "")
    )
    print("|---|---|---|---|---|---|---|---|" + ("---|" if args.cold else ""))
    for preset, parallel, world, layers in CONFIGS:
        r = warm(preset, parallel, world, layers, args.repeat)
        g = r["w"].graph
        row = (
            f"| {preset} {parallel} | {world} | {layers} | {len(g):,} | {len(g.collectives):,} | "
            f"{r['total_s'] - r['from_fx_s']:.2f} s | {r['from_fx_s']:.2f} s | {r['total_s']:.2f} s |"
        )
        if args.cold:
            row += f" {cold(preset, parallel, world, layers):.2f} s |"
        print(row, flush=True)


if __name__ == "__main__":
    main()

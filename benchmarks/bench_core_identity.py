"""Before/after identity of every schedule on the zoo set: fingerprints of orders, streams, makespans and peaks.

A refactor of the core (issue 15) must not change a single schedule. This script traces a fixed set of zoo
workloads once (saved as graph JSON, so both code versions read the same graphs), runs every pass, preset and
comparison on them under a few cost settings, and writes one fingerprint per (case, scheduler): the sha256 of the
order (and streams), the simulated makespan in ns and the peak in bytes, plus the pass's wall time.

Usage:
  python benchmarks/bench_core_identity.py trace --graphs /tmp/zoo-graphs
  PYTHONPATH=<old>/src python benchmarks/bench_core_identity.py run --graphs /tmp/zoo-graphs --out old.json
  PYTHONPATH=src python benchmarks/bench_core_identity.py run --graphs /tmp/zoo-graphs --out new.json
  python benchmarks/bench_core_identity.py diff old.json new.json   # or old1.json,old2.json new1.json,new2.json

``run`` works against the code before and after the refactor (it adapts to where the API moved), so the two
fingerprint files compare schedules, not harness versions. ``diff`` prints every difference and the pass-time
ratio (new / old, per scheduler and in total); run old and new alternately on the same machine to compare times.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

# (name, preset, parallel, world, layers, seq_len or None): the bench_schedulers set plus the other parallelisms
WORKLOADS = [
    ("fsdp-w8-l8", "llama3-8b", "fsdp", 8, 8, None),
    ("fsdp+tp-w64-l8", "llama3-8b", "fsdp+tp", 64, 8, None),
    ("fsdp-w512-l8-s1024", "llama3-8b", "fsdp", 512, 8, 1024),
    ("fsdp-w256-l4", "llama3-8b", "fsdp", 256, 4, None),
    ("ddp-w16-l2", "llama3-8b", "ddp", 16, 2, 2048),
    ("tp+sp-w8-l2", "llama3-8b", "tp+sp", 8, 2, 2048),
    ("ep-w8-l2", "mixtral-8x7b", "ep", 8, 2, 1024),
    ("fsdp+tp+sp-w32-l2", "llama3-8b", "fsdp+tp+sp", 32, 2, 2048),
]
SMALL = {"ddp-w16-l2", "tp+sp-w8-l2"}  # small enough for CP-SAT and the multi-stream pass with every option

# (label, profile, extra CostEstimate fields): the plain model, and both interference factors (CPU-run shape)
COSTS = [
    ("h100", "h100-sxm", {}),
    ("mi300x-slow", "mi300x", {"compute_slowdown": 1.3, "comm_slowdown": 1.5, "stream_sync_s": 5e-6}),
]

# (label, passes, knobs in the old spelling, knobs in the new spelling)
SCHEDULERS = [
    ("default", "default", {}, None),
    ("torch", "torch", {}, None),
    ("classic", "classic", {}, None),
    ("sink_waits", ["sink_waits"], {}, None),
    ("raise_comms", ["raise_comms"], {}, None),
    ("reorder_compute_for_overlap", ["reorder_compute_for_overlap"], {}, None),
    ("reorder_iterative", ["reorder_communication_preserving_peak_memory"], {}, None),
    ("reorder_iterative-unsafe", ["reorder_communication_preserving_peak_memory"],
     {"unsafe_collectives_reorder": True, "group_with_collectives": True}, None),
    ("sink_waits_iterative", ["sink_waits_iterative"], {}, None),
    ("sink_waits_iterative-swap", ["sink_waits_iterative"], {"sink_swap_with_collectives": True}, None),
    ("global+overlap", ["decide_global_ordering_of_comms", "overlap"], {}, None),
    ("overlap-reorder", ["overlap"], {"reorder_collectives": True}, None),
    ("overlap-late", ["overlap"], {"waits": "late", "reorder_collectives": True}, None),
    ("overlap-tight", ["overlap"], {"memory_budget_ratio": 1.0}, {"memory_budget": 1.0}),
    ("multi_stream", ["multi_stream"], {}, None),
]  # fmt: skip


def _fingerprint(order, streams=None) -> str:
    h = hashlib.sha256(bytes(memoryview(__import__("numpy").asarray(order, "int64"))))
    if streams is not None:
        h.update(bytes(memoryview(__import__("numpy").asarray(streams, "int64"))))
    return h.hexdigest()[:16]


def trace(graphs: Path) -> None:
    from commsched import save_graph
    from commsched.workloads import build

    graphs.mkdir(parents=True, exist_ok=True)
    for name, preset, parallel, world, layers, seq in WORKLOADS:
        t0 = time.perf_counter()
        w = build(preset, parallel=parallel, world_size=world, layers=layers, seq_len=seq)
        save_graph(w.graph, graphs / f"{name}.json")
        print(f"{name}: {len(w.graph)} nodes ({time.perf_counter() - t0:.1f} s)", flush=True)


def _compare_fn():
    try:
        from commsched.experiments.compare import compare_schedulers
    except ImportError:
        from commsched.compare import compare_schedulers
    return compare_schedulers


def _schedule(g, costs, passes, knobs):
    import commsched

    if _SINK_KNOBS_UNPREFIXED:  # SinkWaitsConfig dropped its sink_ prefixes
        knobs = {k.removeprefix("sink_"): v for k, v in knobs.items()}
    return commsched.schedule(g, costs, passes, **knobs)


def run_case(g, costs, out: dict, case: str, small: bool) -> None:
    import numpy as np

    from commsched import simulate_costs

    base = simulate_costs(g, costs)
    ev = simulate_costs(g, costs, engine="events")
    out[f"{case}/input"] = {
        "makespan_ns": int(base.makespan_ns),
        "events_makespan_ns": int(ev.makespan_ns),
        "peak_bytes": int(base.peak_memory_bytes),
        "bound_ns": round(base.lower_bound_s * 1e9),
        "starts": _fingerprint(base.start_ns),
    }
    for label, passes, old_knobs, new_knobs in SCHEDULERS:
        if label == "multi_stream" and not small:
            continue
        knobs = old_knobs if new_knobs is None or not _NEW_API else new_knobs
        t0 = time.perf_counter()
        try:
            s = _schedule(g, costs, passes, knobs)
        except Exception as exc:  # a failure is a fingerprint too
            out[f"{case}/{label}"] = {"error": f"{type(exc).__name__}: {exc}"}
            continue
        wall = time.perf_counter() - t0
        res = simulate_costs(g, costs, s.order, s.streams)
        entry = {
            "order": _fingerprint(s.order, s.streams),
            "makespan_ns": int(res.makespan_ns),
            "peak_bytes": int(res.peak_memory_bytes),
            "starts": _fingerprint(res.start_ns),
            "wall_s": wall,
        }
        if s.streams is not None:
            evs = simulate_costs(g, costs, s.order, s.streams, engine="events")
            entry["events_makespan_ns"] = int(evs.makespan_ns)
        out[f"{case}/{label}"] = entry
    if small:
        t0 = time.perf_counter()
        res = _compare_fn()(g, costs, exact_max_nodes=400, exact_time_limit_s=5.0)
        for r in res.rows:
            if "CP-SAT" in r.scheduler:  # a time-limited solver: not reproducible run to run
                continue
            out[f"{case}/compare/{r.scheduler}"] = {"makespan_s": r.makespan_s, "peak_bytes": r.peak_memory_bytes}
        out[f"{case}/compare"] = {"wall_s": time.perf_counter() - t0, "bound_s": res.lower_bound_s}
        del np


def run(graphs: Path, out_path: Path, only: list[str] | None) -> None:
    from commsched import hardware, load_graph
    from commsched.cost import estimate_costs

    out: dict = {}
    for name, *_rest in WORKLOADS:
        if only and name not in only:
            continue
        g = load_graph(graphs / f"{name}.json")
        world = int(g.meta.get("world_size", 8)) if isinstance(g.meta, dict) else 8
        for label, profile, extra in COSTS:
            costs = estimate_costs(g, hardware.get(profile, num_nodes=max(1, world // 8)))
            if extra:
                costs = dataclasses.replace(costs, **extra)
            t0 = time.perf_counter()
            run_case(g, costs, out, f"{name}/{label}", name in SMALL)
            print(f"{name}/{label}: {len(g)} nodes, {time.perf_counter() - t0:.1f} s", flush=True)
    out_path.write_text(json.dumps(out, indent=1, sort_keys=True))


def _load_runs(paths: str) -> dict:
    """Fingerprints of one code version from one or more runs (comma-separated): the first run's fingerprints, and
    each entry's wall time as the minimum over the runs (the least disturbed measurement)."""
    runs = [json.loads(Path(p).read_text()) for p in paths.split(",")]
    out = runs[0]
    for key, entry in out.items():
        walls = [r[key]["wall_s"] for r in runs if "wall_s" in r.get(key, {})]
        if walls:
            entry["wall_s"] = min(walls)
    return out


def diff(old_paths: str, new_paths: str) -> int:
    """Every fingerprint that differs, then pass time new / old (sums of per-scheduler minimum wall times)."""
    old, new = _load_runs(old_paths), _load_runs(new_paths)
    bad = 0
    old_wall = new_wall = 0.0
    for key in sorted(set(old) | set(new)):
        a, b = old.get(key), new.get(key)
        if a is None or b is None:
            print(f"MISSING {key}: old={a is not None} new={b is not None}")
            bad += 1
            continue
        a_cmp = {k: v for k, v in a.items() if k != "wall_s"}
        b_cmp = {k: v for k, v in b.items() if k != "wall_s"}
        if a_cmp != b_cmp:
            print(f"DIFF {key}: {a_cmp} -> {b_cmp}")
            bad += 1
        if "wall_s" in a and "wall_s" in b and "/compare" not in key:
            old_wall += a["wall_s"]
            new_wall += b["wall_s"]
    print(f"{len(old)} fingerprints, {bad} differ; pass time new/old = {new_wall / max(old_wall, 1e-9):.3f} "
          f"({new_wall:.2f} s / {old_wall:.2f} s)")  # fmt: skip
    return 1 if bad else 0


try:
    from commsched.passes.baselines.sink_waits_iterative import SinkWaitsConfig

    _SINK_KNOBS_UNPREFIXED = "swap_with_collectives" in {f.name for f in dataclasses.fields(SinkWaitsConfig)}
except ImportError:
    _SINK_KNOBS_UNPREFIXED = False

try:  # the refactored API spells some knobs per pass; the old one is flat
    from commsched.passes.registry import KnobNamespace  # noqa: F401

    _NEW_API = True
except Exception:
    _NEW_API = False


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = ap.add_subparsers(dest="cmd", required=True)
    t = sub.add_parser("trace")
    t.add_argument("--graphs", type=Path, required=True)
    r = sub.add_parser("run")
    r.add_argument("--graphs", type=Path, required=True)
    r.add_argument("--out", type=Path, required=True)
    r.add_argument("--only", nargs="*")
    d = sub.add_parser("diff")
    d.add_argument("old", help="fingerprint file(s) of the old code, comma-separated")
    d.add_argument("new", help="fingerprint file(s) of the new code, comma-separated")
    args = ap.parse_args()
    if args.cmd == "trace":
        trace(args.graphs)
    elif args.cmd == "run":
        run(args.graphs, args.out, args.only)
    else:
        return diff(args.old, args.new)
    return 0


if __name__ == "__main__":
    sys.exit(main())

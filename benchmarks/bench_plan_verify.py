"""``plan``'s scaling checked at full depth (issue 40's acceptance: the winner re-simulated at the full layer count
is within 2 % of the scaled estimate).

Usage: python benchmarks/bench_plan_verify.py PRESET --gpus N --layout "dp_shard=32,tp=8,sp=true,ac=full"
       [--global-batch B] [--seq-len S] [-H HW] [--layers L] [--layers-scale K] [--scaled-only] [--cache-dir DIR]
       [--pin-cache] [--json FILE]

One layout is judged by plan's own task (:func:`commsched.plan.judge.judge_task`, optimised) twice in this process:
at K and 2K layers extrapolated to the model's depth (what ``plan`` ranks by), then at every layer (what ``plan
--verify`` runs). Each phase prints its wall and CPU seconds and this process's peak RSS; then, for the step (the
kept one, the framework's order and ``optimize``'s), the peak memory, the exposed communication and the recompute,
the value at each depth, scaled and full, and the error ``scaled / full - 1``. ``--pin-cache`` keys the trace cache
by a fixed source fingerprint (``"dev"``, as ``bench_plan.py``'s measurements did), so the hour-long full-depth trace
survives source edits; the numbers are then those of the code that traced it.
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import os
import platform
import resource
import sys
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

COMPARED = ("step_s", "framework_step_s", "optimized_step_s", "peak_memory_bytes", "exposed_comm_s", "recompute_s")
"""the row fields compared, scaled against full"""


def _cpu_s() -> float:
    own = resource.getrusage(resource.RUSAGE_SELF)
    return own.ru_utime + own.ru_stime


def _rss_gib() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / (1 << 20)  # ru_maxrss is in KiB on Linux


def judged(req, layout, hw, layers: list | None) -> tuple[dict, dict]:
    """(plan's row of ``layout`` at ``layers`` (None: the scaled depths plan takes), the phase's cost)."""
    from commsched.plan.judge import judge_task

    spec = {"request": dataclasses.asdict(req), "hardware": hw, "cache": True, "optimize": True,
            "layouts": [layout.to_dict()]}  # fmt: skip
    if layers is not None:
        spec["layers"] = layers
    cpu0, t0 = _cpu_s(), time.perf_counter()
    row = judge_task(spec)[0]
    if row.get("error"):
        raise SystemExit(f"{layout.label()}: {row['error']}")
    cost = {"wall_s": time.perf_counter() - t0, "cpu_s": _cpu_s() - cpu0, "max_rss_gib": _rss_gib()}
    return row, cost


def compare(scaled: dict, full: dict) -> dict[str, dict]:
    """Each of :data:`COMPARED`: its value at each depth judged, scaled, full, and ``scaled / full - 1`` (the step,
    peak and exposed communication at each depth are those of the order the scaled row keeps)."""
    which = "optimized" if scaled["step_s"] == scaled["optimized_step_s"] else "framework"
    at_depth = {"step_s": f"{which}_step_s", "peak_memory_bytes": f"{which}_peak_bytes",
                "exposed_comm_s": f"{which}_exposed_s"}  # fmt: skip
    out = {}
    for name in COMPARED:
        s, f = scaled.get(name), full.get(name)
        points = [p.get(at_depth.get(name, name)) for p in scaled["points"]]
        error = s / f - 1 if s is not None and f else None
        out[name] = {"points": points, "scaled": s, "full": f, "error": error}
    return out


def _fmt(name: str, value) -> str:
    if value is None:
        return "-"
    return f"{value / (1 << 30):.2f} GiB" if name.endswith("_bytes") else f"{value:.4f} s"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("preset")
    ap.add_argument("--gpus", type=int, required=True)
    ap.add_argument("--layout", required=True, help='plan --explain\'s form: "dp_shard=32,tp=8,sp=true,ac=full"')
    ap.add_argument("--global-batch", type=int, default=None)
    ap.add_argument("--seq-len", type=int, default=8192)
    ap.add_argument("-H", "--hardware", default="h100-sxm")
    ap.add_argument("--layers", type=int, default=None, help="the model's depth (default: the preset's)")
    ap.add_argument("--layers-scale", type=int, default=2)
    ap.add_argument("--scaled-only", action="store_true", help="skip the full-depth judge")
    ap.add_argument("--cache-dir", default=None)
    ap.add_argument("--pin-cache", action="store_true", help='trace cache keyed by the fingerprint "dev"')
    ap.add_argument("--json", default=None, help="write the comparison here")
    args = ap.parse_args()
    if args.cache_dir:
        os.environ["COMMSCHED_CACHE_DIR"] = args.cache_dir
    if args.pin_cache:
        from commsched.execute import base

        base.source_fingerprint = lambda: "dev"
    from commsched.plan import PlanRequest
    from commsched.plan.explain import parse_layout
    from commsched.plan.search import plan_hardware

    req = PlanRequest(preset=args.preset, gpus=args.gpus, hardware=args.hardware, seq_len=args.seq_len,
                      global_batch=args.global_batch, layers=args.layers, layers_scale=args.layers_scale)  # fmt: skip
    layout = parse_layout(args.layout)
    if layout.world_size != req.gpus:
        raise SystemExit(f"--layout: degrees multiply to {layout.world_size}, expected --gpus {req.gpus}")
    hw = plan_hardware(req)
    print(f"machine: {platform.machine()}, {os.cpu_count()} cores, python {platform.python_version()}, "
          f"load average {os.getloadavg()[0]:.2f}")  # fmt: skip
    print(f"request: {req}\nlayout: {layout.label()}")
    scaled, cost = judged(req, layout, hw, None)
    print(f"scaled ({scaled['how']}): wall {cost['wall_s']:.1f} s, CPU {cost['cpu_s']:.1f} s, "
          f"max RSS {cost['max_rss_gib']:.2f} GiB")  # fmt: skip
    out = {"request": dataclasses.asdict(req), "layout": layout.to_dict(), "label": layout.label(), "scaled": scaled,
           "scaled_cost": cost}  # fmt: skip
    if not args.scaled_only:
        full, cost = judged(req, layout, hw, [None])
        print(f"full ({req.model().n_layers} layers): wall {cost['wall_s']:.1f} s, CPU {cost['cpu_s']:.1f} s, "
              f"max RSS {cost['max_rss_gib']:.2f} GiB; load average {os.getloadavg()[0]:.2f}")  # fmt: skip
        out.update(full=full, full_cost=cost, compared=compare(scaled, full))
        print(f"kept: scaled {scaled['kept']!r}, full {full['kept']!r}")
        for name, c in out["compared"].items():
            error = "-" if c["error"] is None else f"{100 * c['error']:+.2f} %"
            points = ", ".join(_fmt(name, v) for v in c["points"])
            print(f"  {name:20s} at K, 2K: {points:24s} scaled {_fmt(name, c['scaled']):12s} "
                  f"full {_fmt(name, c['full']):12s} error {error}")  # fmt: skip
    else:
        peak = _fmt("peak_memory_bytes", scaled["peak_memory_bytes"])
        print(f"  step {scaled['step_s']:.4f} s ({scaled['kept']}), peak {peak}")
    if args.json:
        Path(args.json).write_text(json.dumps(out, indent=1, default=str))


if __name__ == "__main__":
    main()

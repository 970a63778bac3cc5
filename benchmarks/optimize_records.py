"""Every ``optimize`` record of ``bench_optimize.py``'s cases, to check that a refactor changes none of them.

Usage:
  python benchmarks/optimize_records.py --out FILE [--budgets FILE] [--case N ...] [--executor]
  python benchmarks/optimize_records.py --compare BEFORE.json AFTER.json
  python benchmarks/optimize_records.py --ab OLD_SRC [--rounds 2] [--case N ...]

A record is what the search decided: the kept label, step and peak (ns, bytes), the lower bound, the kept program's
node count and schedule (a digest of its node names in schedule order) and every variant's verdict with its figures.
Per case it holds ``optimize`` with and without transforms at the default budget and, where ``--budgets`` (written by
``--torch-budgets``: the peak of torch's best configuration, as ``bench_optimize.py`` measures it) gives one, at that
budget. ``--executor``: the bucket plans judged on a local pool of 2 workers (the same verdicts). ``--compare`` prints
every record that differs and the search's wall time after / before (run both in one session, on one machine).
``--ab OLD_SRC``: the search's wall time of this tree against the ``src`` folder ``OLD_SRC`` in one run, each case in
a fresh process per tree, the two trees alternating (which goes first alternates too), and the records compared.
"""

from __future__ import annotations

import argparse
import dataclasses
import hashlib
import json
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).parent))
from bench_optimize import CASES


def _record(o) -> dict:
    names = o.graph.names
    order = "\n".join(names[i] for i in o.schedule.order)
    return {"kept": o.label, "step_ns": int(o.after.makespan_ns), "peak_bytes": int(o.after.peak_memory_bytes),
            "bound_s": float(o.after.lower_bound_s), "nodes": len(o.graph),
            "schedule": hashlib.sha256(order.encode()).hexdigest()[:16],
            "tried": [dataclasses.asdict(t) for t in o.tried]}  # fmt: skip


def _build(case):
    from commsched.workloads import build

    preset, parallel, world, layers, seq_len, mode, *rest = case
    return build(preset, parallel=parallel, world_size=world, layers=layers, seq_len=seq_len, mode=mode,
                 batch=rest[0] if rest else None)  # fmt: skip


def case_records(index: int, budget: int | None, executor) -> tuple[dict, float]:
    """(records by name, search wall seconds) of case ``index``."""
    import commsched
    from commsched.hardware import for_graph
    from commsched.passes import MemoryBudget

    w = _build(CASES[index])
    hw = for_graph("h100-sxm", w.graph)
    sizes = w.graph.group_sizes()
    out, wall = {}, 0.0
    for transforms in (False, True):
        runs = [("default", 1.05)] + ([("torch peak", MemoryBudget(bytes=budget))] if budget else [])
        for name, mb in runs:
            o = commsched.optimize(w.graph_module, hw, group_sizes=sizes, transforms=transforms, memory_budget=mb,
                                   executor=executor)  # fmt: skip
            out[f"transforms={transforms}, budget {name}"] = _record(o)
            wall += o.wall_s
    return out, wall


def torch_budgets(indices: list[int]) -> dict[str, int]:
    """The peak of torch's fastest configuration per case (``bench_optimize.case_rows``'s rule)."""
    from bench_optimize import case_rows

    out = {}
    for i in indices:
        _, rows = case_rows(*CASES[i])
        torch_rows = [r for r in rows if r[0].startswith("torch") and r[2] is not None]
        out[str(i)] = int(min(torch_rows, key=lambda r: r[2].makespan_s)[2].peak_memory_bytes)
    return out


def compare(before: dict, after: dict) -> int:
    diffs = 0
    for case, recs in before["cases"].items():
        for name, rec in recs.items():
            other = after["cases"].get(case, {}).get(name)
            if other != rec:
                diffs += 1
                print(f"case {case} {name}: differs")
                for key in rec:
                    if other is None or rec[key] != (other or {}).get(key):
                        print(f"  {key}: {str(rec[key])[:300]}\n  -> {str((other or {}).get(key))[:300]}")
    wb, wa = sum(before["wall_s"].values()), sum(after["wall_s"].values())
    print(f"{sum(len(r) for r in before['cases'].values())} records, {diffs} differ; "
          f"search wall {wa:.1f} s after / {wb:.1f} s before = {wa / wb:.3f}")  # fmt: skip
    return 1 if diffs else 0


def ab(old_src: str, indices: list[int], rounds: int, budgets_path: str | None) -> None:
    """Wall time of this tree's search against ``old_src``'s, case by case, in alternating fresh processes."""
    import os
    import statistics
    import subprocess
    import tempfile

    new_src = str(Path(__file__).resolve().parents[1] / "src")
    ratios, diffs = [], 0
    for i in indices:
        walls: dict[str, list[float]] = {"old": [], "new": []}
        recs = {}
        for r in range(rounds):
            order = [("new", new_src), ("old", old_src)][:: 1 if (i + r) % 2 else -1]
            for name, src in order:
                with tempfile.NamedTemporaryFile(suffix=".json") as out:
                    cmd = [sys.executable, __file__, "--out", out.name, "--case", str(i)]
                    cmd += ["--budgets", budgets_path] if budgets_path else []
                    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, "PYTHONPATH": src})
                    got = json.loads(Path(out.name).read_text())
                walls[name].append(got["wall_s"][str(i)])
                recs[name] = got["cases"][str(i)]
        diffs += recs["old"] != recs["new"]
        ratio = statistics.median(walls["new"]) / statistics.median(walls["old"])
        ratios.append(ratio)
        print(f"case {i} {CASES[i]}: search {statistics.median(walls['new']):.2f} s after, "
              f"{statistics.median(walls['old']):.2f} s before ({ratio:.3f}); records "
              f"{'identical' if recs['old'] == recs['new'] else 'DIFFER'}", flush=True)  # fmt: skip
    geo = statistics.geometric_mean(ratios)
    print(f"geomean search wall after / before over {len(ratios)} cases: {geo:.3f}; {diffs} case(s) differ")


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--out")
    ap.add_argument("--budgets")
    ap.add_argument("--torch-budgets", help="write the torch-best peaks of the cases to this file and stop")
    ap.add_argument("--case", action="append", type=int)
    ap.add_argument("--executor", action="store_true")
    ap.add_argument("--compare", nargs=2)
    ap.add_argument("--ab", metavar="OLD_SRC")
    ap.add_argument("--rounds", type=int, default=2)
    args = ap.parse_args()
    if args.compare:
        a, b = (json.loads(Path(p).read_text()) for p in args.compare)
        raise SystemExit(compare(a, b))
    indices = args.case or list(range(len(CASES)))
    if args.ab:
        return ab(args.ab, indices, args.rounds, args.budgets)
    if args.torch_budgets:
        Path(args.torch_budgets).write_text(json.dumps(torch_budgets(indices), indent=1))
        return
    budgets = json.loads(Path(args.budgets).read_text()) if args.budgets else {}
    executor = None
    if args.executor:
        from commsched.execute import make_executor

        executor = make_executor(jobs=2)
    result = {"cases": {}, "wall_s": {}}
    for i in indices:
        t0 = time.perf_counter()
        result["cases"][str(i)], result["wall_s"][str(i)] = case_records(i, budgets.get(str(i)), executor)
        print(f"case {i} {CASES[i]}: {time.perf_counter() - t0:.1f} s", flush=True)
    Path(args.out).write_text(json.dumps(result, indent=1))


if __name__ == "__main__":
    main()

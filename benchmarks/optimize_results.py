"""Every ``optimize`` result of ``bench_optimize.py``, for checking that a speed change changes no answer.

Usage: python benchmarks/optimize_results.py dump OUT.json [--case N ...]   (all CASES by default, about 2-4 min)
       python benchmarks/optimize_results.py compare A.json B.json
``dump`` runs ``bench_optimize``'s cases (torch's configurations included: they set the second budget) and records
each ``optimize`` call's ``Optimized.to_dict()`` without its wall time (kept variant, step, peak, bound, budget,
collective counts, every variant's label, step, peak, probe and verdict), the kept schedule's order and the kept
graph's node names (as hashes). ``compare`` prints every difference and exits 1 if a result other than the node
names differs (a rewrite that renames its new nodes changes only the names).
"""

from __future__ import annotations

import argparse
import hashlib
import json
import sys
from pathlib import Path


def dump(out: str, cases: list[int] | None) -> None:
    sys.path.insert(0, str(Path(__file__).parent))
    import bench_optimize

    import commsched

    records: list[dict] = []
    optimize = commsched.optimize

    def recorded(*args, **kwargs):
        o = optimize(*args, **kwargs)
        d = o.to_dict()
        d.pop("wall_s")
        d["schedule_sha"] = hashlib.sha1(o.schedule.order.tobytes()).hexdigest()
        d["names_sha"] = hashlib.sha1("\n".join(o.graph.names).encode()).hexdigest()
        d["call"] = {"budget": str(kwargs.get("memory_budget")), "transforms": kwargs.get("transforms")}
        records.append(d)
        return o

    commsched.optimize = recorded
    rows = []
    for i in cases if cases else range(len(bench_optimize.CASES)):
        records.clear()
        title, _ = bench_optimize.case_rows(*bench_optimize.CASES[i])
        rows.append({"case": i, "title": title, "optimize": list(records)})
        print(i, title, flush=True)
    commsched.optimize = optimize
    from commsched.io import atomic_write_text

    atomic_write_text(Path(out), json.dumps(rows, indent=1, sort_keys=True))


def compare(a_path: str, b_path: str) -> int:
    a, b = (json.loads(Path(p).read_text()) for p in (a_path, b_path))
    calls = diffs = 0
    renamed = set()
    for ca, cb in zip(a, b, strict=True):
        for oa, ob in zip(ca["optimize"], cb["optimize"], strict=True):
            calls += 1
            for key in sorted(set(oa) | set(ob)):
                if oa.get(key) == ob.get(key):
                    continue
                if key == "names_sha":
                    renamed.add(ca["case"])
                    continue
                diffs += 1
                print(f"case {ca['case']} {key}: {str(oa.get(key))[:100]} | {str(ob.get(key))[:100]}")
    print(f"{len(a)} cases, {calls} optimize calls: {diffs} differences; kept graph's node names differ in cases "
          f"{sorted(renamed)}")  # fmt: skip
    return 1 if diffs else 0


def main() -> None:
    ap = argparse.ArgumentParser()
    sub = ap.add_subparsers(dest="cmd", required=True)
    d = sub.add_parser("dump")
    d.add_argument("out")
    d.add_argument("--case", action="append", type=int)
    c = sub.add_parser("compare")
    c.add_argument("a")
    c.add_argument("b")
    args = ap.parse_args()
    if args.cmd == "dump":
        dump(args.out, args.case)
    else:
        sys.exit(compare(args.a, args.b))


if __name__ == "__main__":
    main()

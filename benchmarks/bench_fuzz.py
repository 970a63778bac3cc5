"""The hostile-input fuzzer of issue 20, run long: mutated graph files, cost tables, hardware profiles and Chrome
traces (``tests/fuzz_inputs.py``), plus random DAGs with synchronous collectives and control dependencies simulated
and scheduled with extreme but possible costs. Prints cases tried by kind and outcome; any crash, hang or wrong
number is listed with how to reproduce it (kind, seed) and makes the script exit 1.

Usage: python benchmarks/bench_fuzz.py [--cases 2000] [--dags 400] [--seed 0]
(``tests/fuzz/test_fuzz_inputs.py`` is the bounded version that ``make test`` runs.)
"""

from __future__ import annotations

import argparse
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))


def fuzz_files(cases: int, seed: int, folder: Path) -> tuple[dict, list[str]]:
    """``cases`` mutated files per kind: counts[(kind, outcome)] and the failures."""
    from fuzz_inputs import KINDS, OUTCOMES, mutated_case, run_case

    counts = {(k, o): 0 for k in KINDS for o in OUTCOMES}
    failures: list[str] = []
    for kind in KINDS:
        for case in range(cases):
            case_seed = seed * 1_000_003 + case
            data, how = mutated_case(random.Random(case_seed), kind)
            outcome, detail = run_case(kind, data, folder)
            counts[(kind, outcome)] += 1
            if outcome not in ("ok", "error"):
                failures.append(f"{kind} seed {case_seed} ({how}): {outcome}: {detail}")
    return counts, failures


def fuzz_dags(cases: int, seed: int) -> tuple[dict, list[str]]:
    """``cases`` random DAGs (the tests' ``graphs`` strategy, synchronous collectives and control dependencies) with
    extreme but possible costs, simulated and scheduled under hypothesis (``seed`` fixes its examples)."""
    import numpy as np
    from hypothesis import given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    from commsched.cost import CostEstimate
    from commsched.passes import check_schedule, schedule
    from fuzz_inputs import Hang, check_simulation, time_limit
    from strategies import graphs

    counts = {("dag", o): 0 for o in ("ok", "error", "crash", "hang", "wrong")}
    failures: list[str] = []

    @hypothesis_seed(seed)
    @settings(max_examples=cases, deadline=None, database=None)
    @given(g=graphs(max_nodes=60, p_sync=0.4), data=st.data())
    def one(g, data) -> None:
        n = len(g)
        scale = data.draw(st.sampled_from([1e-9, 1e-6, 1e-3, 1.0, 1e3]))
        node_s = np.asarray(data.draw(st.lists(st.floats(0, 1), min_size=n, max_size=n)), np.float64) * scale
        is_coll = g.coll_type >= 0
        costs = CostEstimate(
            node_s=node_s,
            coll_latency_s=np.where(is_coll, node_s * data.draw(st.floats(0, 1)), 0.0),
            coll_link=np.where(is_coll, data.draw(st.integers(0, 1)), -1).astype(np.int8),
            compute_slowdown=data.draw(st.sampled_from([1.0, 1.3, 4.0])),
            comm_slowdown=data.draw(st.sampled_from([1.0, 2.0])),
            stream_sync_s=data.draw(st.sampled_from([0.0, 1e-6, 1e-3])),
        )
        try:
            with time_limit(30.0):
                wrong = check_simulation(g, costs)
                check_schedule(g, schedule(g, costs).order)
            outcome = "wrong" if wrong else "ok"
        except Hang:
            outcome, wrong = "hang", "over 30 s"
        except Exception as exc:
            outcome, wrong = "crash", f"{type(exc).__name__}: {exc}"
        counts[("dag", outcome)] += 1
        if outcome != "ok":
            failures.append(f"dag ({n} nodes, hypothesis seed {seed}): {outcome}: {wrong}")

    one()
    return counts, failures


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000, help="mutated files per kind")
    parser.add_argument("--dags", type=int, default=400, help="random DAGs simulated and scheduled")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        counts, failures = fuzz_files(args.cases, args.seed, Path(tmp))
    t_files = time.perf_counter() - t0
    dag_counts, dag_failures = fuzz_dags(args.dags, args.seed)
    counts.update(dag_counts)
    failures += dag_failures
    kinds = sorted({k for k, _ in counts}, key=["graph", "table", "profile", "trace", "dag"].index)
    outcomes = ("ok", "error", "crash", "hang", "wrong")
    print("| kind | cases | " + " | ".join(outcomes) + " |")
    print("|---|---|" + "---|" * len(outcomes))
    for kind in kinds:
        row = [counts[(kind, o)] for o in outcomes]
        print(f"| {kind} | {sum(row):,} | " + " | ".join(f"{v:,}" for v in row) + " |")
    total = sum(counts.values())
    print(f"\n{total:,} cases; files {t_files:.0f} s, all {time.perf_counter() - t0:.0f} s")
    for line in failures[:50]:
        print("FAIL", line)
    return 1 if failures else 0


if __name__ == "__main__":
    sys.exit(main())

"""The hostile-input fuzzer of issue 20, run long: mutated graph files, cost tables, hardware profiles and Chrome
traces (``tests/fuzz_inputs.py``), plus random DAGs with synchronous collectives and control dependencies simulated
and scheduled with extreme but possible costs. Prints cases tried by kind and outcome; any crash, hang or wrong
number is listed with how to reproduce it (kind, seed) and makes the script exit 1.

Usage: python benchmarks/bench_fuzz.py [--cases 2000] [--dags 400] [--seed 0]
(``tests/fuzz/test_fuzz_inputs.py`` is the bounded version that ``make test`` runs.)

Two of the suite's property tests run long here, on examples Hypothesis draws from ``--seed`` (the suite runs a
fixed few of each; a failure prints its shrunk falsifying example):

- ``--bucket-graph N``: N random programs bucketed on the IR and as FX (``bucket_graph`` equals ``from_fx`` of
  ``apply_bucket_plan``, node for node: ``tests/rewrites/test_bucket_graph.py``);
- ``--framework N``: N random graphs with FSDP and DDP roles scheduled by the ``framework`` reference
  (``tests/passes/test_framework.py``).

For example, these two alone (about 10 and 7 minutes on 2 cores):
``python benchmarks/bench_fuzz.py --cases 0 --dags 0 --bucket-graph 3000 --framework 3000 --seed 1``
"""

from __future__ import annotations

import argparse
import functools
import random
import sys
import tempfile
import time
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT / "tests"))
sys.path.insert(0, str(ROOT / "tests" / "rewrites"))  # the property tests run here, and their helpers
sys.path.insert(0, str(ROOT / "tests" / "passes"))


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


def fuzz_property(kind: str, cases: int, seed: int) -> tuple[dict, list[str]]:
    """``cases`` examples of a suite property test (``kind``: "bucket-graph" or "framework"), drawn by hypothesis
    from ``seed``; a failure is reported with hypothesis's shrunk falsifying example."""
    from hypothesis import HealthCheck, given, settings
    from hypothesis import seed as hypothesis_seed
    from hypothesis import strategies as st

    if kind == "bucket-graph":
        from test_bucket_graph import RANDOM_PROGRAM_ARGS as args
        from test_bucket_graph import check_random_program as check
    else:
        from test_framework import ROLES_ARGS as args
        from test_framework import check_fsdp_and_ddp_roles as check
    counts = {(kind, o): 0 for o in ("ok", "error", "crash", "hang", "wrong")}

    @hypothesis_seed(seed)
    @settings(max_examples=cases, deadline=None, database=None, suppress_health_check=list(HealthCheck))
    @given(st.tuples(*args))
    def one(drawn) -> None:
        check(*drawn)
        counts[(kind, "ok")] += 1

    try:
        one()
    except Exception as exc:  # the shrunk example fails again: one wrong case, its example in the notes
        counts[(kind, "wrong")] += 1
        notes = " ".join(getattr(exc, "__notes__", []))
        return counts, [f"{kind} (hypothesis seed {seed}): {type(exc).__name__}: {exc} {notes}"]
    return counts, []


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--cases", type=int, default=2000, help="mutated files per kind")
    parser.add_argument("--dags", type=int, default=400, help="random DAGs simulated and scheduled (0: none)")
    parser.add_argument("--bucket-graph", type=int, default=0, help="random programs bucketed both ways")
    parser.add_argument("--framework", type=int, default=0, help="random graphs with FSDP and DDP roles")
    parser.add_argument("--seed", type=int, default=0)
    args = parser.parse_args()
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        counts, failures = fuzz_files(args.cases, args.seed, Path(tmp))
    t_files = time.perf_counter() - t0
    runs = [(args.dags, fuzz_dags), (args.bucket_graph, functools.partial(fuzz_property, "bucket-graph")),
            (args.framework, functools.partial(fuzz_property, "framework"))]  # fmt: skip
    for n, run in runs:
        if n:  # 0: skipped
            more, more_failures = run(n, args.seed)
            counts.update(more)
            failures += more_failures
    order = ["graph", "table", "profile", "trace", "dag", "bucket-graph", "framework"]
    kinds = sorted({k for (k, _), v in counts.items() if v}, key=order.index)  # those run
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

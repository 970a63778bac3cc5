"""The H100 flash attention measurements (benchmarks/data/gpu_attention_h100.csv) against the cost model: the table
in benchmarks/RESULTS.md is what the stored run and today's model give, row for row."""

from __future__ import annotations

import importlib.util
from pathlib import Path

ROOT = Path(__file__).resolve().parents[2]


def _bench():
    spec = importlib.util.spec_from_file_location("bench_gpu", ROOT / "benchmarks" / "bench_gpu.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_results_attention_table_is_the_stored_run_against_the_model():
    table = _bench().attention_table(str(ROOT / "benchmarks" / "data" / "gpu_attention_h100.csv"), "h100-sxm")
    results = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    rows = [line for line in table.splitlines() if line.startswith("| 1 x") or line.startswith("| 2 x")]
    assert len(rows) == 10
    for row in rows:
        assert row in results, row


def test_causal_block_schedule_follows_the_measured_ratios():
    bench = _bench()
    rows = bench.read_measured(ROOT / "benchmarks" / "data" / "gpu_attention_h100.csv")
    time = {(r["batch"], r["heads"], r["seq"], r["pass"], r["causal"]): float(r["median_us"]) for r in rows}
    for (b, h, s, p, causal), full in time.items():
        if causal == "False":
            measured = time[(b, h, s, p, "True")] / full
            assert abs(bench.causal_fraction(int(b) * int(h), int(s) // 128, bench.SLOTS[p]) - measured) < 0.07

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
    for r in rows:
        if r["causal"] == "False":
            key = (r["batch"], r["heads"], r["seq"], r["pass"])
            measured = time[(*key, "True")] / time[(*key, "False")]
            assert abs(bench.causal_block_fraction(r) - measured) < 0.07, key


def test_the_model_is_within_0_7_to_1_2_of_every_measured_pass():
    bench = _bench()
    for r in bench.read_measured(ROOT / "benchmarks" / "data" / "gpu_attention_h100.csv"):
        ratio = bench.attention_model_us(r, "h100-sxm") / float(r["median_us"])
        assert 0.7 <= ratio <= 1.2, (r["batch"], r["heads"], r["seq"], r["pass"], r["causal"], ratio)

"""The H100 measurements of decomposed TP collectives (benchmarks/data/gpu_decompose_h100.csv, issue 18): the stored
run checks out, the programs the simulator judges are the ones the GPU script ran, and RESULTS' figures hold."""

from __future__ import annotations

import re
from pathlib import Path

import numpy as np
import pytest

from benchmark_modules import benchmark

ROOT = Path(__file__).resolve().parents[2]
DATA = ROOT / "benchmarks" / "data"


@pytest.fixture(scope="module")
def bench():
    return benchmark("bench_gpu")


@pytest.fixture(scope="module")
def cases(bench):
    from commsched.io import read_input_json

    return read_input_json(DATA / "gpu_decompose_cases.json", "cases")


def test_stored_cases_are_the_traced_zoo_sites(bench, cases):
    assert bench.site_cases() == cases  # the zoo still traces these shapes


def test_stored_run_is_an_h100_whose_split_programs_computed_the_unsplit_result(bench, cases):
    rows = bench.read_measured(DATA / "gpu_decompose_h100.csv")
    assert {r["gpu"] for r in rows} == {"NVIDIA H100 80GB HBM3"}
    programs = [r for r in rows if r["op"] == "program"]
    assert len(programs) == len(cases) * len(bench.CHUNKS) * 5  # 1 stream, 2 streams x 2 priorities, 16 / 32 CTAs
    assert max(float(r["check"]) for r in programs) < 5e-3  # bf16 GEMMs blocked by rows round differently


@pytest.mark.parametrize("chunks", [1, 2, 8])
def test_judged_programs_hold_the_kernels_the_gpu_ran(bench, cases, chunks):
    """Per chunk count: k collectives, k matmuls per weight and one interleave per weight (ag_mm) or one cat
    (mm_rs): no more (a reassembly of the gathered tensor for no reader was one)."""
    for case in cases:
        g = bench.site_program(case, chunks)
        targets = [t.split(".")[1] for t in map(str, g.targets) if t.startswith("aten.")]
        assert sum(g.coll_type >= 0) == chunks
        assert targets.count("mm") == chunks * len(case["weights"])
        joins = targets.count("stack") if case["pattern"] == "ag_mm" else targets.count("cat")
        assert joins == (0 if chunks == 1 else len(case["weights"]) if case["pattern"] == "ag_mm" else 1)


def test_results_quote_this_run(bench, cases):
    """The simulator's error on the measured kernels, as benchmarks/RESULTS.md quotes it."""
    rows = bench.compare_rows(bench.read_measured(DATA / "gpu_decompose_h100.csv"), cases, "h100-sxm")
    text = (ROOT / "benchmarks" / "RESULTS.md").read_text()
    for copy, measure in bench.COPIES.items():
        err = np.abs([r["predicted"][copy] / r["measured"][measure] - 1 for r in rows])
        quoted = re.search(rf"`{copy}`: \|error\| median (\d+) %, worst (\d+) %", text)
        assert quoted is not None, copy
        assert (round(100 * np.median(err)), round(100 * err.max())) == tuple(map(int, quoted.groups()))

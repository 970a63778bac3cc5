"""Issue 36: ``commsched optimize`` lists each variant once, and its summary and rows read in human units."""

from __future__ import annotations

import re

import pytest

import commsched
from commsched.workloads import build


@pytest.fixture(scope="module")
def optimized():
    # the configuration, two layers: the gathers kept for the backward are then also bucketed
    w = build("llama3-8b", parallel="fsdp", world_size=64, layers=2)
    return commsched.optimize(w.graph_module, "h100-sxm", group_sizes=w.graph.group_sizes())


def test_no_variant_is_listed_twice(optimized):
    """Before: the candidate bucketed like the best bucketed variant was judged again by the re-bucketing of the
    kept-gathers program: the same plan (the same probe) listed as "kept" and as "pruned: probe 0.5% slower"."""
    labels = [t.label.split(", collectives reordered")[0] for t in optimized.tried]
    assert len(labels) == len(set(labels)), sorted(lab for lab in labels if labels.count(lab) > 1)
    assert any(" + gathers kept for the backward" in lab and lab.startswith("bucketed (") for lab in labels)
    for t in optimized.tried:  # a same-plan verdict names a row of the table
        if t.verdict.startswith("the same plan as: "):
            assert t.verdict.removeprefix("the same plan as: ") in labels, t.verdict


def test_summary_and_rows_in_human_units(optimized):
    """Before: ``peak 17912315904 B (budget ...)``, and an unbuilt variant printed as ``collectives=None``."""
    line = optimized.summary()
    assert re.fullmatch(r"kept .+: [0-9.]+ m?s vs traced [0-9.]+ m?s \([0-9.]+x\), peak [0-9.]+ GiB "
                        r"\(budget [0-9.]+ GiB\), \d+ variant\(s\) in [0-9.]+ s", line), line  # fmt: skip
    rows = [str(t) for t in optimized.tried]
    assert not any("None" in r or re.search(r"\d{6,}", r) for r in rows), rows
    same = next(t for t in optimized.tried if t.collectives is None)
    assert str(same) == f"{same.label}: {same.verdict}"
    kept = next(r for r in rows if ": kept (" in r)
    assert re.search(r"\(\d+ collectives, probe .+, step [0-9.]+ ms, peak [0-9.]+ GiB\)$", kept), kept

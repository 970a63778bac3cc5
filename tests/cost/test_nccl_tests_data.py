"""The public nccl-tests / rccl-tests logs shipped in ``commsched/cost/data/nccl_tests`` (issue 17's data): every log
the index lists parses, says what the index says, and every number in it is consistent (busbw = algbw x the bus
factor of the index's rank count), so a transcription error or a wrong rank count in the index fails here."""

from __future__ import annotations

import itertools
from pathlib import Path

import pytest
import tomllib

import commsched
from commsched.cost.collectives import bus_factor
from commsched.cost.nccl_tests import read_nccl_tests

DATA = Path(commsched.__file__).parent / "cost" / "data" / "nccl_tests"
INDEX = tomllib.loads((DATA / "sources.toml").read_text())["log"]
LOGS = [e for e in INDEX if e["kind"] == "log"]


def test_the_index_lists_every_file_with_a_url():
    files = {p.name for p in DATA.glob("*.txt")}
    assert files == {e["file"] for e in INDEX}
    assert all(e["url"].startswith("https://") for e in INDEX)
    assert len(LOGS) >= 40


@pytest.mark.parametrize("entry", LOGS, ids=[e["file"] for e in LOGS])
def test_every_log_parses_and_agrees_with_its_index_entry(entry):
    (log,) = read_nccl_tests(DATA / entry["file"], collective=entry["collective"])
    assert log.collective == entry["collective"].replace("alltoall", "all_to_all")
    assert len(log.rows) >= 3
    nranks = entry["nranks"]
    if log.collective in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all") and isinstance(nranks, int):
        factor = bus_factor(log.collective, nranks)
        for row in log.rows:
            if row.size_bytes >= 1 << 20:  # two printed decimals: small rows are rounding noise
                algbw = row.size_bytes / (row.oop_time_us * 1e-6) / 1e9
                assert row.oop_busbw_GBps == pytest.approx(algbw * factor, rel=0.02, abs=0.02), row.line


@pytest.mark.parametrize(
    ("file", "n_rows", "last"),
    [
        ("dstack_nebius_h100_2node_ib_ar.txt", 31, (8589934592, 34448.4, 467.54, 34381.0)),
        ("dstack_lambda_b200_2node_ib_ar.txt", 29, (2147483648, 5784.75, 696.06, 5728.40)),
        ("dstack_crusoe_a100_2node_ib_ar.txt", 29, (2147483648, 20749.1, 194.06, 20745.7)),
        ("dstack_gcp_a4_b200_2node_roce_ar.txt", 11, (8589934592, 23563.0, 683.52, 23702.0)),
        ("aws_do_eks_p5_2node_efa_ar.txt", 32, (2147483648, 9062.5, 444.31, 9060.4)),
    ],
)  # fmt: skip
def test_tables_pasted_into_docs_read_with_their_printed_numbers(file, n_rows, last):
    """Example outputs pasted into docs (dstack, aws-do-eks): rows indented by the page, headers with or without '#',
    launcher tags, no rank lines (the index gives 2 nodes of 8); every row is read, the last one as printed."""
    (log,) = read_nccl_tests(DATA / file, collective="all_reduce")
    r = log.rows[-1]
    assert len(log.rows) == n_rows and (r.size_bytes, r.oop_time_us, r.oop_busbw_GBps, r.ip_time_us) == last


def test_the_index_flags_doubtful_exactly_the_logs_whose_time_falls_as_the_size_doubles():
    """At 16 MB and above a collective's time grows with its size (a latency and a bandwidth part); a time that falls
    as the size doubles there is noise in the measurement. The index's ``doubtful`` field (a reason) marks exactly
    those logs, so a new log that shows it must say so (benchmarks/RESULTS.md, issue 17)."""
    falls = set()
    for entry in LOGS:
        (log,) = read_nccl_tests(DATA / entry["file"], collective=entry["collective"])
        rows = [r for r in log.rows if r.size_bytes >= 16 << 20]
        if any(b.time_s < a.time_s for a, b in itertools.pairwise(rows)):
            falls.add(entry["file"])
    flagged = {e["file"] for e in INDEX if "doubtful" in e}
    assert falls == flagged
    assert falls >= {
        "xxrjun_cluster01_h100_10node_g8_all_gather.txt",
        "xxrjun_cluster01_h100_10node_g8_reduce_scatter.txt",
    }
    assert all(
        isinstance(e["doubtful"], str) and e["doubtful"].startswith("16-256 MB: ")
        for e in INDEX
        if e["file"] in flagged
    )

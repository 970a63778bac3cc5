"""The typed report of a real run: JSON round trip with the keys tools read, strict loading that names the bad
field, and its terminal rendering."""

from __future__ import annotations

import io
import json
import re

import pytest
from rich.console import Console

from commsched.report.rewrite_report import RewriteReport, StepChange
from commsched.report.run_report import RunReport
from commsched.report.terminal_run import print_run_report
from run_reports import small_run_report


def test_round_trip_keeps_the_keys(tmp_path):
    report = small_run_report()
    data = report.to_dict()
    assert list(data)[:3] == ["format", "version", "workload"]
    assert "teardown_error" not in data  # only when a rank failed while tearing down
    assert data["link"]["collectives"] == [["all_gather", 2, 1024, 0.001]]  # kind, group size, bytes, seconds
    assert set(data["variants"]["original"]) >= {"measured", "predicted", "bit_identical", "speedup_measured"}
    assert data["timings_s"] == {"trace": 1.0, "calibrate": 2.0, "plan": 0.5}
    assert RunReport.from_dict(json.loads(json.dumps(data))) == report
    assert RunReport.load(report.save(tmp_path / "report.json")) == report


def test_load_names_the_bad_field(tmp_path):
    data = small_run_report().to_dict()
    for broken, message in (
        ({k: v for k, v in data.items() if k != "link"}, "run report: link: missing"),
        ({**data, "iters": "ten"}, "run report: iters: expected an integer, got 'ten'"),
        ({**data, "variants": {"original": {**data["variants"]["original"], "measured": {}}}},
         "run report: variants.original.measured.median_s: missing"),
        ({**data, "variants": {"original": {**data["variants"]["original"], "bit_identical": 1}}},
         "run report: variants.original.bit_identical: expected bool, got 1"),
        ({**data, "link": {**data["link"], "collectives": [["all_gather", 2]]}},
         "run report: link.collectives[0]: expected 4 items (kind, group_size, bytes, seconds), got 2"),
        ({**data, "version": 2}, "version=2: expected 'commsched.run-report' version 1"),
        ({k: v for k, v in data.items() if k != "format"}, "run report: format: missing"),
        ({**data, "surprise": 1}, "unknown field(s) ['surprise']"),
    ):  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(message)):
            RunReport.from_dict(broken)
    (tmp_path / "bad.json").write_text(json.dumps({**data, "iters": "ten"}))
    with pytest.raises(ValueError, match=r"bad\.json: run report: iters"):
        RunReport.load(tmp_path / "bad.json")


def test_terminal_rendering():
    console = Console(file=io.StringIO(), width=140)
    report = small_run_report(skipped={"torch": "not valid"}, teardown_error="a rank failed", network="loopback")
    print_run_report(report, console)
    text = console.file.getvalue()
    assert "2 ranks on gloo, 1 thread(s) each; loopback" in text
    assert "costs (measured): compute 4.000 ms, collectives 8.000 ms over 34 collectives, 373 nodes" in text
    assert re.search(r"overlap\s+│\s+10\.0 │\s+9\.0-11\.0 │\s+11\.0 │\s+\+10\.0% │\s+1\.25x/1\.00x │\s+NO", text)
    assert "simulated peak memory: original 1.00 MiB, overlap 1.00 MiB" in text
    assert "skipped torch: not valid" in text
    assert "warning: a rank failed (the results above are complete)" in text
    assert "unsharded model" not in text  # not checked: no line


def test_rewrite_report_leaves_out_what_did_not_run():
    report = RewriteReport(workload="w", hardware="h100-sxm", step_s=StepChange(before=2.0, after=1.0))
    assert report.to_dict() == {"workload": "w", "hardware": "h100-sxm", "step_s": {"before": 2.0, "after": 1.0}}
    assert RewriteReport.from_dict(report.to_dict()) == report

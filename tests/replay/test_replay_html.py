"""One replay, rendered the same everywhere: the terminal's tables, the JSON and the HTML report of
``commsched replay`` give the same step, exposed communication, overlap, collectives and stream times (issue 36.3:
the HTML once simulated the replay's graph afresh and showed another step, no collectives, no exposed
communication, "peak memory 0 B" and every kernel as "other")."""

from __future__ import annotations

import html
import json
import re

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from replay_helpers import NCCL_TRACE
from typer.testing import CliRunner

from commsched.cli import app
from commsched.replay.run import exposed_per_item_ns
from commsched.replay.work import COMM, COMPUTE, MEMORY
from commsched.sim.result import comm_overlap_ns

runner = CliRunner()
UNIT_S = {"s": 1.0, "ms": 1e-3, "us": 1e-6, "ns": 1e-9}
ROWS = ("step (first work start to last work end)", "exposed communication", "overlap ratio (HTA)")


def _invoke(args: list[str]) -> str:
    res = runner.invoke(app, ["replay", *args])
    assert res.exit_code == 0, (res.output, res.exception)
    return res.output


def _number(text: str) -> float:
    """``660.551 ms`` -> 0.660551, ``15.6 %`` -> 0.156, ``0`` -> 0.0."""
    text = text.strip()
    if text.endswith("%"):
        return float(text[:-1]) / 100
    value, _, unit = text.partition(" ")
    return float(value) * UNIT_S[unit] if unit else float(value)


def _terminal_cells(out: str, label: str) -> list[str]:
    line = next(x for x in out.splitlines() if x.strip().startswith(label))
    return [c.strip() for c in line.split("│")[1:4]]


def _html_cells(page: str, label: str) -> list[str]:
    for row in re.findall(r"<tr>(.*?)</tr>", page):
        cells = [html.unescape(c) for c in re.findall(r"<td[^>]*>(.*?)</td>", row)]
        if cells and cells[0] == label:
            return cells[1:4]
    raise AssertionError(f"no row {label!r} in the HTML")


def _visible(page: str) -> str:
    text = re.sub(r"<(script|style)\b.*?</\1>", " ", page, flags=re.S)
    return " ".join(html.unescape(re.sub(r"<[^>]+>", " ", text)).split())


@pytest.mark.parametrize("what_if", [[], ["--scale", "comm=2"]], ids=["as measured", "comm=2"])
def test_terminal_json_and_html_show_one_result(tmp_path, what_if):
    args = [str(NCCL_TRACE), *what_if]
    d = json.loads(_invoke([*args, "--json"]))["ranks"][0]
    terminal = _invoke(args)
    _invoke([*args, "--html", str(tmp_path / "r.html")])
    page = (tmp_path / "r.html").read_text()
    want = {
        ROWS[0]: (d["measured_step_s"], d["replayed_step_s"]),
        ROWS[1]: (d["measured_exposed_comm_s"], d["exposed_comm_s"]),
        ROWS[2]: (d["measured_overlap_ratio"], d["overlap_ratio"]),
    }
    for label, (measured, replayed) in want.items():
        shown = _terminal_cells(terminal, label)
        assert _html_cells(page, label) == shown, label  # the same text, cell by cell
        assert _number(shown[0]) == pytest.approx(measured, rel=1e-3, abs=1e-3), label
        assert _number(shown[1]) == pytest.approx(replayed, rel=1e-3, abs=1e-3), label
    assert d["exposed_comm_s"] > 0.03 and d["collectives"] == d["communication_items"] == 21
    # the counts: the terminal's title, the HTML's header and title
    assert "21 collectives, 21 communication items" in terminal
    visible = _visible(page)
    assert "collectives: 21 · communication items: 21" in visible and "21 collectives, 21 communication" in visible
    for stream, busy in d["stream_busy_s"].items():
        row = _html_cells(page, stream)
        assert row == _terminal_cells(terminal, stream)
        assert _number(row[1]) == pytest.approx(busy, rel=1e-3)
    # no memory data in a profiler trace: said so, never "0 B"; communication is not all hidden
    assert "memory: not in the trace" in visible and "peak memory" not in visible and "0 B" not in visible
    assert "all communication is hidden" not in visible and "Most exposed communication" in visible


def test_the_html_timeline_classes_work_as_the_replay_did(tmp_path):
    _invoke([str(NCCL_TRACE), "--html", str(tmp_path / "r.html")])
    page = (tmp_path / "r.html").read_text()
    data = json.loads(re.search(r'id="timeline-data">(.*?)</script>', page, re.S).group(1))
    assert [o["label"].split()[0] for o in data["orders"]] == ["measured", "replayed"]
    for o in data["orders"]:
        classes = [b[3] for b in o["bars"]]
        # compute kernels, the 1074 memcpys / memsets, the 21 NCCL kernels: none drawn as "other kernel"
        assert (classes.count(0), classes.count(1), classes.count(3)) == (2679, 1074, 21)
        assert o["peak_bytes"] is None and o["memory"] == []
        assert o["makespan_ns"] == 660_551_005 and o["exposed_ns"] == 39_559_468
        assert sum(b[5] for b in o["bars"]) == 39_559_468  # NCCL kernels here never overlap each other
    assert data["kinds"][3] == "communication" and data["kinds"][1] == "memory copy / set"
    work = dict(re.findall(r"<tr><td[^>]*>(compute|comm|memory)</td><td[^>]*>(\d+)</td>", page))
    assert work == {"compute": "2679", "comm": "21", "memory": "1074"}


class _Roles:
    """What :func:`exposed_per_item_ns` reads of a trace: its items' roles."""

    def __init__(self, role: list[int]) -> None:
        self.role = np.asarray(role, np.int8)

    def __len__(self) -> int:
        return len(self.role)


@settings(max_examples=60, deadline=None)
@given(st.lists(st.tuples(st.sampled_from((COMPUTE, COMM, MEMORY)), st.integers(0, 100), st.integers(0, 40)),
                max_size=30))  # fmt: skip
def test_each_items_exposed_time_is_hta_s_rule_on_that_item_alone(items):
    role = [r for r, _, _ in items]
    start = np.array([s for _, s, _ in items], np.int64)
    end = start + np.array([d for _, _, d in items], np.int64)
    got = exposed_per_item_ns(_Roles(role), start, end)
    comp = np.array(role, np.int8) == COMPUTE
    for i, r in enumerate(role):
        if r != COMM:
            assert got[i] == 0
            continue
        both, alone = comm_overlap_ns(start[comp], end[comp], start[i : i + 1], end[i : i + 1])
        assert got[i] == alone - both

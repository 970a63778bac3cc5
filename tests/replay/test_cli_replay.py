"""``commsched replay``: the CLI's tables and JSON, its output files, and hostile traces (one line naming the file)."""

from __future__ import annotations

import gzip
import json
import random

import pytest
from replay_helpers import DATA, NCCL_TRACE
from typer.testing import CliRunner

from commsched.cli import app
from commsched.replay.kineto import read_trace
from fuzz_inputs import Hang, mutate_bytes, mutate_tree, time_limit
from hostile import assert_user_error

runner = CliRunner()
SMALL = DATA / "hta_multi_stream.json.gz"
RANKS = [str(DATA / "run_llama_tiny_fsdp_rank0.json.gz"), str(DATA / "run_llama_tiny_fsdp_rank1.json.gz")]


def _invoke(args):
    res = runner.invoke(app, ["replay", *args])
    assert res.exit_code == 0, (res.output, res.exception)
    return res.output


def test_tables_show_measured_and_replayed_side_by_side():
    out = _invoke([str(SMALL), "--scale", "stream:20=2", "--scale", "compute=0.5"])
    for text in ("step (first work start to last work end)", "exposed communication", "overlap ratio (HTA)",
                 "naive estimates of the measured step: sum of all work", "busiest stream", "stream 20",
                 "stream 24", "stream 28", "what-if: stream:20=2, compute=0.5"):  # fmt: skip
        assert text in out, text


def test_json_has_the_promised_fields_for_every_rank(tmp_path):
    out = _invoke([*RANKS, "--json", "--scale", "compute=1.5", "--trace", str(tmp_path / "t.json"),
                   "--html", str(tmp_path / "r.html")])  # fmt: skip
    d = json.loads(out)
    assert (d["format"], d["version"]) == ("commsched.replay", 1)
    for key in ("measured_step_s", "replayed_step_s", "exposed_comm_s", "overlap_ratio", "stream_busy_s"):
        assert key in d and all(key in r for r in d["ranks"]), key
    assert d["slowest_rank"] in (0, 1) and d["aligned_collectives"] == 34
    assert all(r["replayed_step_s"] > r["measured_step_s"] for r in d["ranks"])  # compute 1.5 x longer
    trace = json.loads((tmp_path / "t.json").read_text())
    assert len([e for e in trace["traceEvents"] if e.get("ph") == "X"]) > 700
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")
    assert sorted(d["files"]) == sorted([str(tmp_path / "t.json"), str(tmp_path / "r.html")])


def test_hardware_recosts_nccl_collectives_from_the_cli():
    d = json.loads(_invoke([str(NCCL_TRACE), "--hardware", "h100-sxm", "--json"]))
    assert d["ranks"][0]["recosted_collectives"] == 21 and d["ranks"][0]["hardware"] == "h100-sxm"


@pytest.mark.parametrize(
    ("scale", "fragment"),
    [
        ("stream:20", "expected stream:N=F"),
        ("stream:20=-1", "not a finite number >= 0"),
        ("stream:20=nan", "not a finite number >= 0"),
        ("bogus=2", "unknown selector 'bogus'"),
        ("kernel:(=2", "bad regular expression"),
        ("stream:99=2", "no such stream; expected one of"),
    ],
)
def test_bad_scales_are_one_line_errors(scale, fragment):
    assert_user_error(["replay", str(SMALL), "--scale", scale], fragment)


def test_hostile_traces_are_one_line_errors_naming_the_file(tmp_path):
    good = json.loads(gzip.decompress(SMALL.read_bytes()))
    cases = {
        "truncated.json.gz": SMALL.read_bytes()[:500],
        "not-json.json": b"{\"traceEvents\": [",
        "no-events.json": json.dumps({"foo": 1}).encode(),
        "empty.json": json.dumps({"traceEvents": []}).encode(),
        "cpu-nothing.json": json.dumps({"traceEvents": [{"ph": "X", "cat": "python_function", "name": "x",
                                                         "pid": 1, "tid": 1, "ts": 0, "dur": 1}]}).encode(),
    }  # fmt: skip
    bad_ts = json.loads(json.dumps(good))
    kernel = next(e for e in bad_ts["traceEvents"] if e.get("cat") == "kernel")
    kernel["ts"] = "soon"
    cases["bad-ts.json"] = json.dumps(bad_ts).encode()
    bad_args = json.loads(json.dumps(good))
    next(e for e in bad_args["traceEvents"] if e.get("cat") == "kernel")["args"] = [1]
    cases["bad-args.json"] = json.dumps(bad_args).encode()
    for name, data in cases.items():
        path = tmp_path / name
        path.write_bytes(data)
        assert_user_error(["replay", str(path)], name)
    assert_user_error(["replay", str(tmp_path / "missing.json")], "missing.json", "does not exist")
    empty = tmp_path / "empty-folder"
    empty.mkdir()
    assert_user_error(["replay", str(empty)], "empty-folder", "no *.json or *.json.gz files")


def test_a_folder_is_its_traces(tmp_path):
    for r in (0, 1):
        (tmp_path / f"rank{r}.json.gz").write_bytes((DATA / f"run_llama_tiny_fsdp_rank{r}.json.gz").read_bytes())
    d = json.loads(_invoke([str(tmp_path), "--json"]))
    assert [r["rank"] for r in d["ranks"]] == [0, 1] and d["aligned_collectives"] == 34


def test_unknown_categories_and_missing_args_are_read_around(tmp_path):
    data = json.loads(gzip.decompress(SMALL.read_bytes()))
    data["traceEvents"] += [{"ph": "X", "cat": "mystery", "name": "m", "pid": 0, "tid": 20, "ts": 1, "dur": 2},
                            {"ph": "Q"}, 7, None]  # fmt: skip
    for e in data["traceEvents"]:
        if isinstance(e, dict) and e.get("cat") == "cuda_sync":
            e.pop("args")  # a sync event without its args: the cross-stream link is lost, nothing breaks
    path = tmp_path / "odd.json"
    path.write_text(json.dumps(data))
    d = json.loads(_invoke([str(path), "--json"]))
    assert abs(d["error"]) < 0.05


def test_mutated_traces_never_crash_or_hang(tmp_path):
    """300 random edits of a real GPU trace (values, keys, bytes, gzip): each reads and replays, or fails with a
    ValueError naming the file; never another exception, never over 10 s."""
    rng = random.Random(22)
    seed = json.loads(gzip.decompress(SMALL.read_bytes()))
    outcomes = {"ok": 0, "error": 0}
    for k in range(300):
        tree = mutate_tree(rng, seed, rng.choice([1, 2, 3]))
        data = json.dumps(tree, allow_nan=True).encode("utf-8", "surrogatepass")
        if rng.random() < 0.25:
            data = mutate_bytes(rng, data)
        path = tmp_path / f"case{k}.json"
        path.write_bytes(data)
        try:
            with time_limit(10):
                from commsched.replay.run import replay

                replay(read_trace(path))
            outcomes["ok"] += 1
        except ValueError as exc:
            assert str(path) in str(exc) and "\n" not in str(exc), str(exc)
            outcomes["error"] += 1
        except Hang:
            pytest.fail(f"case {k} hangs")
    assert outcomes["ok"] > 50 and outcomes["error"] > 20, outcomes

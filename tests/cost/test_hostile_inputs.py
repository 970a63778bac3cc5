"""Issue 20 items 6 and 7: mutated profiler traces, cost tables and hardware profiles end in a ValueError naming the
file, the event / row / key and what was expected (exit 2 on the CLI), and a gzip file reads like a plain one."""

from __future__ import annotations

import gzip
import json
import math

import pytest

from commsched.cost import MeasuredTable, load_measured
from commsched.cost.trace_import import table_from_chrome_trace, trace_collectives
from commsched.frontends.json_io import save_graph
from commsched.hardware import load_profile
from fuzz_inputs import seed_table, seed_trace
from hostile import assert_user_error, profile_dict, small_graph, write_profile


def _json(tmp_path, name: str, data) -> str:
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


# ---------------------------------------------------------------- item 6: Chrome traces
def _trace_with(event: int, field: str, value) -> dict:
    data = seed_trace()
    data["traceEvents"][event][field] = value
    return data


@pytest.mark.parametrize(
    ("event", "field", "value", "message"),
    [
        (0, "args", [], "traceEvents[0] field 'args': expected an object, got []"),
        (5, "args", "x", "traceEvents[5] field 'args': expected an object, got 'x'"),
        (1, "dur", "abc", "traceEvents[1] field 'dur': expected microseconds in [0, 1e12], got 'abc'"),
        (4, "dur", -3, "traceEvents[4] field 'dur': expected microseconds"),
        (5, "dur", None, "traceEvents[5] field 'dur'"),
    ],
)
def test_odd_trace_events_are_named(tmp_path, event, field, value, message):
    path = _json(tmp_path, "trace.json", _trace_with(event, field, value))
    with pytest.raises(ValueError) as info:
        table_from_chrome_trace(path)
    assert str(info.value).startswith(path) and message in str(info.value)


@pytest.mark.parametrize(
    ("key", "value", "message"),
    [
        ("Group size", "two", "args.Group size': expected an integer in [1, 2147483647], got 'two'"),
        ("In msg nelems", 2**70, "args.In msg nelems': expected an integer in [0, 9007199254740992]"),
        ("In msg nelems", [], "args.In msg nelems'"),
    ],
)
def test_odd_collective_args_are_named(tmp_path, key, value, message):
    data = seed_trace()
    data["traceEvents"][5]["args"][key] = value
    path = _json(tmp_path, "trace.json", data)
    for read in (table_from_chrome_trace, trace_collectives):
        with pytest.raises(ValueError) as info:
            read(path)
        assert "traceEvents[5] field" in str(info.value) and message in str(info.value)


def test_events_that_are_not_objects_or_unknown_are_skipped(tmp_path):
    data = seed_trace()
    data["traceEvents"] += [3, None, "x", {"ph": "X", "cat": "cpu_op", "name": ["odd"], "args": {}}]
    table = table_from_chrome_trace(_json(tmp_path, "trace.json", data))
    assert len(table.ops) == 2 and len(table.collectives) == 2


def test_truncated_gzip_trace_is_named(tmp_path):
    packed = gzip.compress(json.dumps(seed_trace()).encode())
    path = tmp_path / "trace.json.gz"
    path.write_bytes(packed[: len(packed) // 2])
    with pytest.raises(ValueError, match=r"trace\.json\.gz: a broken gzip file"):
        load_measured(path)
    g = tmp_path / "g.json"
    save_graph(small_graph(), g)
    assert_user_error(["estimate", str(g), "--table", str(path)], "trace.json.gz", "broken gzip")


@pytest.mark.parametrize("name", ["t.json.gz", "t.csv.gz", "trace.json.gz", "t.gz"])
def test_gzip_tables_and_traces_load_like_plain_ones(tmp_path, name):
    if "trace" in name:
        plain = table_from_chrome_trace(_json(tmp_path, "plain.json", seed_trace()))
    else:
        plain = MeasuredTable.from_dict(seed_table())
    tmp = tmp_path / ("x.csv" if ".csv" in name else "x.json")
    plain.save(tmp)
    (tmp_path / name).write_bytes(gzip.compress(tmp.read_bytes()))
    assert load_measured(tmp_path / name).to_dict() == plain.to_dict()
    g = tmp_path / "g.json"
    save_graph(small_graph(), g)
    from commsched.cli import app
    from hostile import runner

    res = runner.invoke(app, ["estimate", str(g), "--table", str(tmp_path / name), "--json"])
    assert res.exit_code == 0, res.output


# ---------------------------------------------------------------- item 7: cost tables
def _table_with(section: str, field: str, value) -> dict:
    data = seed_table()
    data[section][0][field] = value
    return data


@pytest.mark.parametrize(
    ("section", "field", "value", "message"),
    [
        ("ops", "time_s", math.inf, None),
        ("ops", "time_s", 1e300, "time_s 1e+300: expected seconds in [0, 1e+06]"),
        ("ops", "count", "x", "count 'x': expected an integer in [1,"),
        ("ops", "shapes", [[2**70]], "shapes 1180591620717411303424: expected an integer in [0, 9007199254740992]"),
        ("ops", "shapes", 3, "shapes: expected a list of shapes"),
        ("ops", "target", {}, "target {}: expected a string"),
        ("collectives", "group_size", 2**70, "group_size 1180591620717411303424: expected an integer in [1,"),
        ("collectives", "nbytes", -1, "nbytes -1: expected an integer in [0,"),
        ("collectives", "type", "gossip", "unknown collective kind 'gossip'"),
        ("collectives", "type", [], "type []: expected a string"),
        ("collectives", "extra", 1, "unknown field 'extra'"),
    ],
)
def test_bad_table_rows_are_named(tmp_path, section, field, value, message):
    data = _table_with(section, field, value)
    path = tmp_path / "t.json"
    path.write_text(json.dumps(data))  # inf is written as Infinity: not JSON
    with pytest.raises(ValueError) as info:
        load_measured(path)
    text = str(info.value)
    assert text.startswith(str(path))
    assert (message or "Infinity is not a JSON number") in text
    if message:
        assert f"{section}[0]" in text


@pytest.mark.parametrize("rows", [3, [3], ["x"], [{}]])
def test_table_rows_must_be_objects_with_their_fields(tmp_path, rows):
    data = seed_table()
    data["collectives"] = rows
    with pytest.raises(ValueError, match=r"t\.json: (field 'collectives'|collectives\[0\]): "):
        load_measured(_json(tmp_path, "t.json", data))


@pytest.mark.parametrize(
    "csv_text",
    [
        "kind,target,shapes,dtype,group_size,nbytes,time_s\nall_reduce,,,,8,99999999999999999999999,1e-3\n",
        "kind,target,shapes,dtype,group_size,nbytes,time_s\nop,aten.mm,1x2x,float32,,,1e-3\n",
        "kind,target,shapes,dtype,group_size,nbytes,time_s\nall_reduce,,,,8\n",
        "kind,target,shapes,dtype,group_size,nbytes,time_s\nall_reduce,,,,8,1024,1e-3,extra\n",
        "kind,target,shapes,dtype,group_size,nbytes,time_s\nall_reduce,,,,x,1024,1e-3\n",
    ],
)
def test_bad_csv_rows_are_named(tmp_path, csv_text):
    path = tmp_path / "t.csv"
    path.write_text(csv_text)
    with pytest.raises(ValueError, match=r"t\.csv:2: "):
        load_measured(path)


# ---------------------------------------------------------------- item 7: hardware profiles
@pytest.mark.parametrize(
    ("section", "key", "value", "message"),
    [
        ("compute", "matmul_tiles", [[math.inf, 128, 1.0]], "matmul_tiles entry [inf, 128, 1.0]: expected"),
        ("compute", "matmul_tiles", [[128, 128, 0.0]], "matmul_tiles entry [128, 128, 0.0]"),
        ("compute", "hbm_tb_per_s", math.inf, "hbm_tb_per_s = inf: expected a value in [0, 1e+12]"),
        ("compute", "hbm_tb_per_s", 5e-324, "hbm_tb_per_s = 5e-324: expected a positive number >= 1e-12"),
        ("compute", "launch_overhead_us", 1e300, "launch_overhead_us = 1e+300: expected a value in [0, 1e+12]"),
        ("compute", "num_units", 2**40, "num_units = 1099511627776: expected an integer in [1, 1048576]"),
        ("intra_node", "link_gb_per_s", -1.0, "link_gb_per_s = -1.0: expected a value in [0, 1e+12]"),
        ("inter_node", "nic_gbit_per_s", "fast", "nic_gbit_per_s = 'fast': expected a number"),
    ],
)
def test_extreme_profile_values_are_named(tmp_path, section, key, value, message):
    data = profile_dict()
    data[section][key] = value
    path = write_profile(tmp_path / "p.toml", data)
    with pytest.raises(ValueError) as info:
        load_profile(path)
    assert str(info.value).startswith(f"{path} [{section}]") and message in str(info.value)
    g = tmp_path / "g.json"
    save_graph(small_graph(), g)
    assert_user_error(["simulate", str(g), "--hardware", str(path)], "p.toml", key)


def test_a_directory_or_a_deep_toml_is_not_a_profile(tmp_path):
    folder = tmp_path / "dir.toml"
    folder.mkdir()
    with pytest.raises(ValueError, match=r"dir\.toml: is a directory; expected a hardware profile file"):
        load_profile(folder)
    deep = tmp_path / "deep.toml"
    deep.write_text("x = " + "[" * 100_000)
    with pytest.raises(ValueError, match=r"deep\.toml: (TOML nested too deeply|not valid TOML)"):
        load_profile(deep)

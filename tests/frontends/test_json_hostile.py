"""Issue 20 items 2, 3 and 5: hostile graph files end in a GraphError naming the file, the node or field and what
was expected (exit 2 on the CLI, no traceback), never a RecursionError, TypeError, OverflowError or a wrong number."""

from __future__ import annotations

import json
import os

import pytest

import commsched.io
from commsched.frontends.json_io import graph_from_dict, load_graph
from commsched.ir import GraphBuilder, GraphError, OpKind
from commsched.ir.graph import MAX_BYTES
from commsched.passes import check_schedule, schedule
from hostile import assert_user_error, small_graph_dict


def _write(tmp_path, data) -> str:
    path = tmp_path / "g.json"
    path.write_text(json.dumps(data))
    return str(path)


def _input_with_a_predecessor() -> dict:
    """A late graph input that reads the matmul (ids shifted to keep the file topologically ordered)."""
    d = small_graph_dict()
    shift = {i: i + 1 if i >= 3 else i for i in range(len(d["nodes"]))}
    for node in d["nodes"]:
        node["inputs"] = [shift[i] for i in node["inputs"]]
        if "wait_of" in node:
            node["wait_of"] = shift[node["wait_of"]]
    for st in d["storages"]:
        st["owner"] = shift[st["owner"]]
    d["nodes"].insert(3, {"name": "late_in", "target": "placeholder", "kind": "input", "inputs": [2], "outputs": []})
    return d


# ---------------------------------------------------------------- item 2: an input with inputs of its own
def test_input_with_inputs_is_rejected_at_load(tmp_path):
    with pytest.raises(GraphError, match=r"node 3 'late_in' .*kind input has inputs or deps; expected none"):
        load_graph(_write(tmp_path, _input_with_a_predecessor()))
    assert_user_error(["info", _write(tmp_path, _input_with_a_predecessor())], "'late_in'", "expected none")


def test_input_with_deps_is_rejected_by_the_builder():
    b = GraphBuilder()
    x = b.add_node("x", "placeholder", OpKind.INPUT, buffers=[((4,), "float32", 16, None)])
    b.add_node("y", "placeholder", OpKind.INPUT, deps=[x], buffers=[((4,), "float32", 16, None)])
    with pytest.raises(GraphError, match=r"'y' .*expected none"):
        b.build()


def test_schedule_of_a_valid_graph_is_topological():
    g = graph_from_dict(small_graph_dict())
    check_schedule(g, schedule(g, "h100-sxm").order)


# ---------------------------------------------------------------- item 3: extreme numbers, each named
EXTREMES = [
    (("nodes", 2, "flops"), 1e300, "field 'flops': expected a number in [0, 1e+30]"),
    (("nodes", 2, "flops"), -0.5, "field 'flops'"),
    (("nodes", 2, "outputs", 0, "nbytes"), 2**63, "nbytes: expected an integer in [0, 2**63 - 1]"),
    (("nodes", 2, "outputs", 0, "nbytes"), 2**62, "buffer nbytes 4611686018427387904 is out of range"),
    (("storages", 2, "nbytes"), 2**70, "storages[2].nbytes: expected an integer"),
    (("storages", 2, "nbytes"), MAX_BYTES + 1, "storage nbytes 9007199254740993 is out of range"),
    (("nodes", 3, "collective", "in_bytes"), 2**63, "in_bytes: expected an integer"),
    (("nodes", 3, "collective", "out_bytes"), 2**62, "collective out_bytes 4611686018427387904 is out of range"),
    (("nodes", 2, "outputs", 0, "shape"), [2**70, 2], "shape: expected an integer"),
    (("nodes", 2, "outputs", 0, "shape"), [2**60, 2], "dimension 1152921504606846976 is out of range"),
    (("groups", 0, "size"), 2**40, "process group 'dp': size 1099511627776"),
    (("groups", 0, "stride"), 2**70, "groups[0].stride: expected an integer"),
    (("meta", "world_size"), -3, "meta.world_size': expected an integer in [1, 2**31 - 1], got -3"),
    (("meta", "world_size"), "8", "meta.world_size'"),
    (("nodes", 3, "inputs"), [2**53 + 1], "field 'inputs': node id 9007199254740993 does not exist (expected 0..6)"),
    (("storages", 0, "owner"), 2**40, "storages[0].owner: node id 1099511627776 does not exist"),
]


def _mutated(path: tuple, value) -> dict:
    d = small_graph_dict()
    obj = d
    for key in path[:-1]:
        obj = obj[key]
    obj[path[-1]] = value
    return d


@pytest.mark.parametrize(("path", "value", "message"), EXTREMES, ids=[f"{p[-1]}={v}" for p, v, _ in EXTREMES])
def test_extreme_numbers_are_named(tmp_path, path, value, message):
    file = _write(tmp_path, _mutated(path, value))
    with pytest.raises(GraphError) as info:
        load_graph(file)
    assert message in str(info.value) and str(info.value).startswith(file)


def test_many_large_storages_cannot_overflow_a_sum():
    b = GraphBuilder()
    for k in range(600):
        b.add_node(f"x{k}", "placeholder", OpKind.INPUT, buffers=[((1,), "float32", MAX_BYTES, None)])
    with pytest.raises(GraphError, match=r"nbytes add up to 5.4e\+18; expected a total <= 2\*\*62"):
        b.build()


def test_extreme_flops_fail_on_the_cli(tmp_path):
    file = _write(tmp_path, _mutated(("nodes", 2, "flops"), 1e300))
    assert_user_error(["simulate", file], "node 2 'mm' field 'flops'", "1e+300")
    # in range for the file, beyond the simulator's horizon on this hardware: named, never a wrapped makespan
    file = _write(tmp_path, _mutated(("nodes", 2, "flops"), 1e25))
    assert_user_error(["simulate", file], "node 'mm' takes", "expected a step under")


# ---------------------------------------------------------------- item 5: loaders
def test_deeply_nested_json(tmp_path):
    path = tmp_path / "deep.json"
    path.write_text("[" * 200_000 + "]" * 200_000)
    with pytest.raises(GraphError, match=r"deep.json: JSON nested too deeply"):
        load_graph(path)
    assert_user_error(["info", str(path)], "deep.json", "nested too deeply")


def test_invalid_utf8_names_the_file(tmp_path):
    path = tmp_path / "latin1.json"
    path.write_bytes(b'{"format": "commsched.graph", "meta": {"who": "\xe9"}}')
    with pytest.raises(GraphError, match=r"latin1.json: byte 47 is not UTF-8"):
        load_graph(path)
    assert_user_error(["info", str(path)], "latin1.json", "not UTF-8")


@pytest.mark.parametrize("value", [{}, [], None, 3, True])
@pytest.mark.parametrize("field", ["kind", "target", "name"])
def test_wrong_json_types_in_required_fields(tmp_path, field, value):
    d = small_graph_dict()
    d["nodes"][2][field] = value
    with pytest.raises(GraphError, match=rf"(field '{field}'|nodes\[2\]\.{field}): expected"):
        load_graph(_write(tmp_path, d))


@pytest.mark.parametrize("value", [{}, [], None, 7])
def test_wrong_json_types_in_collective_and_buffers(tmp_path, value):
    for path in (("nodes", 3, "collective", "type"), ("nodes", 2, "outputs", 0, "dtype")):
        with pytest.raises(GraphError, match="expected"):
            load_graph(_write(tmp_path, _mutated(path, value)))


def test_a_directory_is_not_a_graph(tmp_path):
    with pytest.raises(GraphError, match=r"is a directory; expected a commsched\.graph JSON file"):
        load_graph(tmp_path)
    assert_user_error(["info", str(tmp_path)], "is a directory")


def test_an_endless_device_stops_at_the_size_cap(monkeypatch):
    if not os.path.exists("/dev/zero"):
        pytest.skip("no /dev/zero")
    monkeypatch.setattr(commsched.io, "MAX_INPUT_BYTES", 1 << 20)
    with pytest.raises(GraphError, match=r"/dev/zero: larger than 1048576 bytes"):
        load_graph("/dev/zero")
    assert_user_error(["info", "/dev/zero"], "/dev/zero", "larger than")


def test_an_oversized_regular_file_is_refused_before_reading(tmp_path, monkeypatch):
    monkeypatch.setattr(commsched.io, "MAX_INPUT_BYTES", 100)
    file = _write(tmp_path, small_graph_dict())
    with pytest.raises(GraphError, match=r"g.json: \d+ bytes; expected a commsched.graph JSON file of at most 100"):
        load_graph(file)


@pytest.mark.parametrize("version", [True, 1.0, "1", [1]])
def test_version_must_be_the_integer(tmp_path, version):
    d = small_graph_dict()
    d["version"] = version
    with pytest.raises(GraphError, match="field 'version': unknown schema version"):
        load_graph(_write(tmp_path, d))


@pytest.mark.parametrize("dtype", ["notadtype", "Float32", "torch.float32", ""])
def test_dtype_must_be_a_torch_dtype_name(tmp_path, dtype):
    with pytest.raises(GraphError, match=r"outputs\[0\]\.dtype: expected a torch dtype name"):
        load_graph(_write(tmp_path, _mutated(("nodes", 2, "outputs", 0, "dtype"), dtype)))


def test_nan_and_infinity_literals_are_not_json(tmp_path):
    path = tmp_path / "nan.json"
    path.write_text(json.dumps(small_graph_dict()).replace('"flops": 2000000000.0', '"flops": NaN'))
    with pytest.raises(GraphError, match=r"nan\.json: not valid JSON: NaN is not a JSON number"):
        load_graph(path)

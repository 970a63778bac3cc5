"""The JSON graph format: exact round trips and clear errors on bad input."""

from __future__ import annotations

import json

import numpy as np
import pytest
from hypothesis import given

from commsched.frontends.json_io import graph_from_dict, graph_to_dict, load_graph, save_graph
from commsched.ir import GraphError
from programs import trace_program
from strategies import graphs


def _assert_same(a, b):
    assert graph_to_dict(a) == graph_to_dict(b)
    for field in (
        "kinds",
        "in_ptr",
        "in_idx",
        "dep_ptr",
        "dep_idx",
        "flops",
        "buf_ptr",
        "buf_nbytes",
        "buf_storage",
        "storage_nbytes",
        "storage_owner",
        "side_effect",
        "coll_type",
        "coll_group",
        "coll_in_bytes",
        "coll_out_bytes",
        "coll_sync",
        "wait_of",
    ):
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and np.array_equal(x, y), field
    assert a.names == b.names and a.targets == b.targets and a.groups == b.groups
    assert a.buf_shape == b.buf_shape and a.buf_dtype == b.buf_dtype and a.coll_reduce_op == b.coll_reduce_op


@given(graphs(max_nodes=60))
def test_round_trip_random_graphs(g):
    _assert_same(g, graph_from_dict(json.loads(json.dumps(graph_to_dict(g)))))


@pytest.mark.parametrize("program", ["every_collective", "inplace", "fsdp_mlp"])
def test_round_trip_traced_graphs(tmp_path, program):
    _, g = trace_program(program, 8)
    path = tmp_path / "g.json"
    save_graph(g, path)
    _assert_same(g, load_graph(path))


@pytest.fixture(scope="module")
def traced_dict():
    _, g = trace_program("every_collective", 8)
    return graph_to_dict(g)


def _load(d, tmp_path):
    p = tmp_path / "bad.json"
    p.write_text(json.dumps(d))
    return load_graph(p)


def test_unknown_version(traced_dict, tmp_path):
    d = json.loads(json.dumps(traced_dict))
    d["version"] = 99
    with pytest.raises(GraphError, match=r"bad.json: field 'version': unknown schema version 99"):
        _load(d, tmp_path)


def test_wrong_types_name_node_and_field(traced_dict, tmp_path):
    d = json.loads(json.dumps(traced_dict))
    d["nodes"][5]["inputs"] = ["x"]
    name = d["nodes"][5]["name"]
    with pytest.raises(GraphError, match=rf"node 5 '{name}' field 'inputs': expected an integer, got 'x'"):
        _load(d, tmp_path)
    d = json.loads(json.dumps(traced_dict))
    d["nodes"][3]["kind"] = "banana"
    with pytest.raises(GraphError, match=r"field 'kind': expected one of .* got 'banana'"):
        _load(d, tmp_path)
    d = json.loads(json.dumps(traced_dict))
    d["nodes"][2]["flops"] = -1
    with pytest.raises(GraphError, match=r"field 'flops': expected a number in \[0, 1e\+30\], got -1"):
        _load(d, tmp_path)
    d = json.loads(json.dumps(traced_dict))
    d["nodes"][2]["colour"] = "red"
    with pytest.raises(GraphError, match=r"unknown field\(s\) \['colour'\]"):
        _load(d, tmp_path)


def test_out_of_order_and_cyclic(traced_dict, tmp_path):
    d = json.loads(json.dumps(traced_dict))
    mm = next(i for i, n in enumerate(d["nodes"]) if n["name"] == "mm")
    bcast = next(i for i, n in enumerate(d["nodes"]) if n["name"] == "broadcast")
    d["nodes"][mm]["inputs"].append(bcast)  # later, but does not depend on mm
    with pytest.raises(GraphError, match=r"'mm'.*comes after it; expected nodes in topological order"):
        _load(d, tmp_path)
    # close the loop: a later node that mm now reads, reading mm back
    d = json.loads(json.dumps(traced_dict))
    later = next(i for i, n in enumerate(d["nodes"]) if mm in n["inputs"])
    d["nodes"][mm]["inputs"].append(later)
    with pytest.raises(GraphError, match="cycle"):
        _load(d, tmp_path)


def test_wait_without_collective(traced_dict, tmp_path):
    d = json.loads(json.dumps(traced_dict))
    w = next(i for i, n in enumerate(d["nodes"]) if n["kind"] == "wait")
    del d["nodes"][w]["wait_of"]
    with pytest.raises(GraphError, match=rf"'{d['nodes'][w]['name']}'.*does not belong to a collective"):
        _load(d, tmp_path)


def test_not_json_and_missing_file(tmp_path):
    p = tmp_path / "x.json"
    p.write_text("{not json")
    with pytest.raises(GraphError, match=r"x.json: not valid JSON"):
        load_graph(p)
    with pytest.raises(GraphError, match="no such file"):
        load_graph(tmp_path / "missing.json")


def test_save_is_atomic(tmp_path):
    _, g = trace_program("fsdp_mlp", 8, layers=1, dim=64)
    path = tmp_path / "g.json"
    save_graph(g, path)
    before = path.read_text()
    g.meta["bad"] = object()  # not serialisable: the save fails and the old file stays whole
    with pytest.raises(GraphError, match="not JSON-serialisable"):
        save_graph(g, path)
    assert path.read_text() == before
    assert [p.name for p in tmp_path.iterdir()] == ["g.json"]

"""The trace cache's binary graph format: exact round trips (dtypes included) and a clear error on a foreign file."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings

from commsched.execute.graph_npz import ARRAYS, FORMAT, graph_to_npz_bytes, load_graph_npz, save_graph_npz
from commsched.frontends.json_io import graph_to_dict
from commsched.ir import GraphError
from programs import trace_program
from strategies import graphs


def _assert_same(a, b):
    assert graph_to_dict(a) == graph_to_dict(b)  # names, targets, shapes, groups, reduce ops, meta (as JSON has it)
    for field in ARRAYS:
        x, y = getattr(a, field), getattr(b, field)
        assert x.dtype == y.dtype and np.array_equal(x, y), field
    assert a.buf_shape == b.buf_shape and a.coll_reduce_op == b.coll_reduce_op and a.groups == b.groups
    b.validate()


@settings(max_examples=40, deadline=None)
@given(graphs(max_nodes=60))
def test_round_trip_random_graphs(tmp_path_factory, g):
    path = tmp_path_factory.mktemp("npz") / "g.npz"
    save_graph_npz(g, path)
    _assert_same(g, load_graph_npz(path))


@pytest.mark.parametrize("program", ["every_collective", "inplace", "fsdp_mlp"])
def test_round_trip_traced_graphs(tmp_path, program):
    _, g = trace_program(program, 8)
    g.meta["note"] = {"tuple": [1, 2], "text": "é"}
    save_graph_npz(g, tmp_path / "g.npz")
    _assert_same(g, load_graph_npz(tmp_path / "g.npz"))


def test_a_foreign_or_torn_file_is_a_graph_error_naming_it(tmp_path):
    _, g = trace_program("every_collective", 8)
    data = graph_to_npz_bytes(g)
    torn = tmp_path / "torn.npz"
    torn.write_bytes(data[: len(data) // 2])
    foreign = tmp_path / "foreign.npz"
    np.savez(foreign, rest=np.array('{"format": "other"}'))
    for path in (torn, foreign):
        with pytest.raises(GraphError, match=str(path.name)):
            load_graph_npz(path)
    assert FORMAT.startswith("commsched.graph-npz")

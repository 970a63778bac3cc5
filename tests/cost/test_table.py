"""Measured tables (JSON / CSV, interpolation), profiler trace import, and their use by estimate_costs."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
from torch.fx.experimental.proxy_tensor import make_fx

from commsched import hardware
from commsched.cost import MeasuredTable, estimate_costs, table_from_chrome_trace
from commsched.frontends.fx import from_fx
from programs import trace_program


def _table() -> MeasuredTable:
    t = MeasuredTable()
    t.add_op("aten.mm.default", [(128, 64), (64, 256)], "float32", 1.5e-5, count=3)
    for nbytes, secs in ((1 << 10, 20e-6), (1 << 20, 40e-6), (1 << 30, 2.5e-3)):
        t.add_collective("all_reduce", 8, nbytes, secs)
    return t


@pytest.mark.parametrize("suffix", [".json", ".csv"])
def test_round_trip(tmp_path, suffix):
    t = _table()
    back = MeasuredTable.load(t.save(tmp_path / f"t{suffix}"))
    assert back.ops == t.ops and back.collectives == t.collectives


def test_log_log_interpolation():
    t = _table()
    assert t.collective_time("all_reduce", 8, 1 << 20) == pytest.approx(40e-6)
    mid = t.collective_time("all_reduce", 8, 1 << 15)  # halfway between 2^10 and 2^20 in log space
    assert mid == pytest.approx(math.sqrt(20e-6 * 40e-6), rel=1e-9)
    assert t.collective_time("all_reduce", 8, 16) == pytest.approx(20e-6)  # latency-bound below
    assert t.collective_time("all_reduce", 8, 1 << 31) == pytest.approx(5e-3)  # bandwidth-bound above
    sizes = np.logspace(8, 32, 50, base=2).astype(int)
    times = [t.collective_time("allreduce", 8, int(s)) for s in sizes]
    assert times == sorted(times)
    assert t.collective_time("all_reduce", 16, 1 << 20) is None  # never measured at 16 ranks


def test_bad_tables_are_named(tmp_path):
    p = tmp_path / "t.json"
    p.write_text(json.dumps({"format": "commsched.cost-table", "version": 9}))
    with pytest.raises(ValueError, match=r"unknown commsched\.cost-table version 9"):
        MeasuredTable.load(p)
    p.write_text(json.dumps({"format": "commsched.cost-table", "version": 1, "ops": [{"target": "aten.mm"}]}))
    with pytest.raises(ValueError, match=r"ops\[0\]: missing field 'shapes'; expected target, shapes, dtype, time_s"):
        MeasuredTable.load(p)
    c = tmp_path / "t.csv"
    c.write_text("kind,target,shapes,dtype,group_size,nbytes,time_s\nall_reduce,,,,8,1024,-1\n")
    with pytest.raises(ValueError, match=r"t.csv:2: time_s '-1': expected seconds in \[0, 1e\+06\]"):
        MeasuredTable.load(c)
    with pytest.raises(FileNotFoundError, match="does not exist"):
        MeasuredTable.load(tmp_path / "missing.json")


def test_table_overrides_model_in_estimate():
    _, g = trace_program("every_collective", 8)
    hw = hardware.get("h100-sxm")
    model = estimate_costs(g, hw)
    t = MeasuredTable()
    ar = next(i for i in g.collectives.tolist() if g.targets[i].startswith("_c10d_functional.all_reduce."))
    t.add_collective("all_reduce", 8, int(g.comm_bytes[ar]), 1.0)
    mm = next(i for i in range(len(g)) if g.targets[i] == "aten.mm.default")
    key = MeasuredTable.node_key(g, mm)
    t.add_op(key[0], key[1], key[2], 2.0)
    est = estimate_costs(g, hw, table=t)
    assert est.node_s[ar] == 1.0 and est.node_s[mm] == 2.0
    assert est.meta["collective_algorithms"][ar] == "measured"
    assert est.coll_latency_s[ar] <= 1.0
    # every all_reduce on 8 ranks now comes from the table (one point: scaled by bytes); the rest is the model
    all_reduces = [i for i in g.collectives.tolist() if est.meta["collective_algorithms"][i] == "measured"]
    for i in all_reduces:
        assert est.node_s[i] == pytest.approx(max(1.0, g.comm_bytes[i] / g.comm_bytes[ar]))
    others = np.setdiff1d(np.arange(len(g)), [mm, *all_reduces])
    np.testing.assert_allclose(est.node_s[others], model.node_s[others])


def test_profiler_trace_import_matches_traced_graph(tmp_path):
    """Profile a real CPU run, import the trace, and find the graph's ops in it by (target, shapes, dtype)."""

    def f(x, w):
        return torch.relu(x @ w).sum(dim=0)

    x, w = torch.randn(64, 32), torch.randn(32, 48)
    with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True) as prof:
        for _ in range(3):
            f(x, w)
    path = tmp_path / "trace.json"
    prof.export_chrome_trace(str(path))
    table = table_from_chrome_trace(path)
    g = from_fx(make_fx(f, tracing_mode="fake")(x, w))
    mm = next(i for i in range(len(g)) if g.targets[i] == "aten.mm.default")
    relu = next(i for i in range(len(g)) if g.targets[i] == "aten.relu.default")
    assert table.op_time(g, mm) is not None and table.op_time(g, mm) > 0
    assert table.op_time(g, relu) is not None
    key = MeasuredTable.node_key(g, mm)
    assert key == ("aten.mm", ((64, 32), (32, 48)), "float32") and table.op_counts[key] == 3
    # and estimate_costs takes the measured times
    est = estimate_costs(g, hardware.get("cpu-local"), table=table, fusion=False)
    assert est.node_s[mm] == pytest.approx(table.op_time(g, mm))


def test_bad_trace_is_named(tmp_path):
    p = tmp_path / "trace.json"
    p.write_text("{not json")
    with pytest.raises(ValueError, match=r"trace\.json: not valid JSON"):
        table_from_chrome_trace(p)
    p.write_text(json.dumps({"foo": 1}))
    with pytest.raises(ValueError, match="no 'traceEvents' list"):
        table_from_chrome_trace(p)

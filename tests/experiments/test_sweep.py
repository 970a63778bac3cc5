"""What-if sweeps: rows equal the pipeline run by hand, failures become rows, the plot and the CLI work."""

from __future__ import annotations

import json
import math
import os

import numpy as np
import pytest
from typer.testing import CliRunner

from commsched import hardware
from commsched.cli import app
from commsched.cost import estimate_costs
from commsched.experiments.sweep import RUN_FIELDS, SweepRow, build_options, run_sweep, sweep_to_dict
from commsched.passes import schedule
from commsched.report.sweep_plot import sweep_png, write_sweep_plot
from commsched.sim import simulate_costs
from commsched.workloads import build

PROFILES = ["h100-sxm", "b200"]
slow = pytest.mark.slow  # the shared `rows` fixture spawns two worker processes (~7 s once per module)
runner = CliRunner()


@pytest.fixture(autouse=True)
def _own_cache(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMSCHED_CACHE_DIR", str(tmp_path / "cache"))


@pytest.fixture(scope="module")
def rows() -> list[SweepRow]:
    # two spawned workers do every trace; tp at world 64 has more TP ranks than llama-tiny's 16 heads: it must fail
    return run_sweep(
        "llama-tiny",
        parallel=["fsdp", "tp"],
        world_sizes=[8, 64],
        hardware=PROFILES,
        layers=1,
        processes=2,
        in_process=False,
        cache=False,
        resume=False,
    )


@slow
def test_rows_in_argument_order(rows):
    keys = [(r.parallel, r.world_size, r.hardware) for r in rows]
    assert keys == [(p, w, h) for p in ("fsdp", "tp") for w in (8, 64) for h in PROFILES]
    # one trace per (parallel, world), shared by its hardware rows
    ok = [r for r in rows if r.ok]
    assert len(ok) == 6
    for a, b in zip(ok[::2], ok[1::2], strict=True):
        assert (a.parallel, a.world_size) == (b.parallel, b.world_size)
        assert a.trace_wall_s == b.trace_wall_s and a.num_graph_nodes == b.num_graph_nodes
    assert {r.num_nodes for r in ok if r.world_size == 64} == {8}  # 8 GPUs per node on both profiles
    assert all(r.pid > 0 and r.pid != os.getpid() for r in ok)  # traced in the workers
    assert all(r.commsched_version.startswith("0.") and r.torch_version and r.numpy_version for r in ok)


@slow
def test_row_equals_direct_pipeline(rows):
    row = next(r for r in rows if (r.parallel, r.world_size, r.hardware) == ("fsdp", 64, "b200"))
    w = build("llama-tiny", parallel="fsdp", world_size=64, layers=1)
    costs = estimate_costs(w.graph, hardware.get("b200", num_nodes=8))
    s = schedule(w.graph, costs, "default")
    before = simulate_costs(w.graph, costs)
    after = simulate_costs(w.graph, costs, s.order, s.streams)
    assert row.num_graph_nodes == len(w.graph)
    assert row.step_time_input_s == before.makespan_s
    assert row.step_time_s == after.makespan_s
    assert row.exposed_comm_input_s == before.exposed_comm_s
    assert row.exposed_comm_s == after.exposed_comm_s
    assert row.overlap_ratio_input == before.overlap_ratio
    assert row.overlap_ratio == after.overlap_ratio
    assert row.peak_memory_input_bytes == before.peak_memory_bytes
    assert row.peak_memory_bytes == after.peak_memory_bytes
    assert row.lower_bound_s == after.lower_bound_s
    assert row.tokens_per_step == w.meta["tokens_per_step"]


@slow
def test_rows_are_sane(rows):
    for r in rows:
        if not r.ok:
            continue
        assert r.lower_bound_s <= r.step_time_s * (1 + 1e-9)
        assert 0 <= r.exposed_comm_s <= r.step_time_s
        assert 0 < r.compute_bound_s <= r.step_time_s
        assert 0 <= r.overlap_ratio <= 1 and r.peak_memory_bytes > 0
        assert min(r.trace_wall_s, r.estimate_wall_s, r.schedule_wall_s, r.simulate_wall_s) >= 0
    # b200 has more FLOP/s and bandwidth than h100: the same step is not slower on it
    by_key = {(r.parallel, r.world_size, r.hardware): r for r in rows if r.ok}
    for p, w, _ in by_key:
        assert by_key[p, w, "b200"].step_time_input_s <= by_key[p, w, "h100-sxm"].step_time_input_s


@slow
def test_bad_configuration_is_an_error_row(rows):
    bad = [r for r in rows if not r.ok]
    assert [(r.parallel, r.world_size, r.hardware) for r in bad] == [("tp", 64, h) for h in PROFILES]
    for r in bad:
        assert r.error.startswith("trace: ValueError") and "heads" in r.error
        assert math.isnan(r.step_time_s) and r.peak_memory_bytes == -1 and math.isnan(r.speedup)


@slow
def test_this_process_and_a_worker_share_the_traces(rows):
    # one worker plus this process; which of them traces what depends on timing, the numbers must not
    both = run_sweep("llama-tiny", parallel=["fsdp", "tp"], world_sizes=[8], hardware=PROFILES, layers=1, processes=2)
    expect = [r for r in rows if r.world_size == 8]
    assert [r.result_dict() for r in both] == [r.result_dict() for r in expect]


@slow
def test_in_process_run_matches_workers(rows):
    local = run_sweep("llama-tiny", parallel="fsdp", world_sizes=[8], hardware=PROFILES, layers=1, processes=1)
    pooled = [r for r in rows if (r.parallel, r.world_size) == ("fsdp", 8)]
    strip = [r.result_dict() for r in local + pooled]
    assert strip[:2] == strip[2:]
    assert set(RUN_FIELDS) <= set(local[0].to_dict()) and not set(RUN_FIELDS) & set(strip[0])


def test_no_schedule_reports_the_traced_order():
    (r,) = run_sweep("llama-tiny", parallel="tp", world_sizes=8, hardware="h100-sxm", layers=1, schedule=None)
    assert r.ok and r.schedule is None
    assert r.step_time_s == r.step_time_input_s and r.peak_memory_bytes == r.peak_memory_input_bytes
    assert r.speedup == 1.0


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        ({"preset": "llama-nope"}, "unknown preset 'llama-nope'"),
        ({"parallel": "zero3"}, "parallel 'zero3'"),
        ({"hardware": ["h100-sxm", "tpu-v9"]}, "unknown hardware profile 'tpu-v9'"),
        ({"schedule": "overlap,nope"}, "unknown pass 'nope'"),
        ({"world_sizes": [8, 0]}, "not a positive integer"),
        ({"world_sizes": [8, 8]}, "duplicate"),
        ({"processes": 0}, "processes=0"),
    ],
)
def test_names_wrong_everywhere_raise(kw, message):
    args = {"preset": "llama-tiny", "parallel": "fsdp", "world_sizes": [8], "hardware": "h100-sxm", **kw}
    with pytest.raises(ValueError, match=message):
        run_sweep(args.pop("preset"), **args)


@slow
def test_json_round_trip(rows):
    text = json.dumps(sweep_to_dict(rows, wall_s=1.0), allow_nan=False)
    data = json.loads(text)
    assert data["format"] == "commsched.sweep" and data["version"] == 3 and data["wall_s"] == 1.0
    back = [SweepRow.from_dict(d) for d in data["rows"]]
    assert [b.to_dict() for b in back] == [r.to_dict() for r in rows]
    with pytest.raises(ValueError, match=r"unknown field\(s\) \['step_time'\]"):
        SweepRow.from_dict({**data["rows"][0], "step_time": 1.0})


@slow
def test_plot_is_written(rows, tmp_path):
    import matplotlib.image

    path = write_sweep_plot(rows, tmp_path / "out" / "sweep.png")
    assert path.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    img = matplotlib.image.imread(path)
    assert img.shape[0] > 400 and img.shape[1] > 600
    colours = np.unique((img[..., :3] * 255).astype(np.uint8).reshape(-1, 3), axis=0)
    assert len(colours) > 20  # bars, hatching, text: not a blank canvas
    assert not list(tmp_path.glob("out/.*.tmp"))  # the temporary file was renamed away
    with pytest.raises(ValueError, match="nothing to plot"):
        sweep_png([r for r in rows if not r.ok])


@slow
def test_cli_table_png_json(tmp_path, rows):
    png, js = tmp_path / "s.png", tmp_path / "rows.json"
    args = ["sweep", "llama-tiny", "-p", "fsdp", "-w", "8", "-H", "h100-sxm,b200", "-l", "1", "-j", "1"]
    res = runner.invoke(app, [*args, "--out", str(png), "--json", str(js)])
    assert res.exit_code == 0, res.output
    assert "h100-sxm" in res.output and "b200" in res.output and "2/2 configurations" in res.output
    assert png.stat().st_size > 10_000
    data = json.loads(js.read_text())
    expect = {r.hardware: r for r in rows if (r.parallel, r.world_size) == ("fsdp", 8)}
    for d in data["rows"]:
        assert d["step_time_s"] == expect[d["hardware"]].step_time_s
        assert d["peak_memory_bytes"] == expect[d["hardware"]].peak_memory_bytes


def test_cli_errors():
    res = runner.invoke(app, ["sweep", "llama-tiny", "-p", "tp", "-w", "64", "-H", "h100-sxm", "-l", "1", "-j", "1"])
    assert res.exit_code == 2
    assert "error" in res.output and "heads" in res.output and "no configuration succeeded" in res.output
    res = runner.invoke(app, ["sweep", "llama-tiny", "-w", "8,x"])
    assert res.exit_code == 2 and "'x' is not an integer" in res.output


def test_degree_options_go_only_where_the_dimension_exists():
    kw = {"tp_size": 8, "ep_size": 4, "seq_len": 128}
    assert build_options("fsdp", kw) == {"seq_len": 128}
    assert build_options("fsdp+tp", kw) == {"tp_size": 8, "seq_len": 128}
    assert build_options("tp+sp", kw) == {"tp_size": 8, "seq_len": 128}
    assert build_options("ep", kw) == {"ep_size": 4, "seq_len": 128}


def test_cli_help_has_an_example():
    res = runner.invoke(app, ["sweep", "--help"])
    assert res.exit_code == 0 and "Example: commsched sweep llama3-8b" in res.output


@slow
def test_fsdp_bucket_and_optimize_dimensions(tmp_path):
    js = tmp_path / "rows.json"
    args = ["sweep", "llama-tiny", "-p", "fsdp", "-w", "8", "-H", "h100-sxm", "-l", "1", "-j", "1"]
    res = runner.invoke(app, [*args, "--fsdp-bucket", "param,block", "--optimize", "off,on", "--json", str(js)])
    assert res.exit_code == 0, res.output
    data = json.loads(js.read_text())
    rows = [SweepRow.from_dict(d) for d in data["rows"]]
    assert [(r.fsdp_bucket, r.optimize) for r in rows] == [(b, o) for b in ("param", "block") for o in (False, True)]
    assert all(r.ok for r in rows) and "(opt.)" in res.output and "fsdp/block" in res.output
    for plain, opt in zip(rows[::2], rows[1::2]):
        assert opt.optimize_kept and opt.step_time_s <= plain.step_time_input_s  # never worse than the traced order
        assert plain.num_graph_nodes == opt.num_graph_nodes  # one trace, both settings
    assert rows[0].num_graph_nodes != rows[2].num_graph_nodes  # block buckets: another program
    # every stage's wall time travels in the JSON rows
    for d in data["rows"]:
        assert d["trace_wall_s"] >= 0 and d["schedule_wall_s"] > 0
        assert (d["estimate_wall_s"] is None) == d["optimize"] and (d["simulate_wall_s"] is None) == d["optimize"]
    bad = runner.invoke(app, [*args, "--optimize", "maybe"])
    assert bad.exit_code == 2 and "'maybe' is not off or on" in bad.output

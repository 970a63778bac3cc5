"""Reports: the Chrome/Kineto trace (loaded by Holistic Trace Analysis), the HTML report (rendered in headless
Chromium), the Gantt PNG, the terminal summary and the ``simulate`` CLI."""

from __future__ import annotations

import json

import numpy as np
import pytest
from rich.console import Console
from typer.testing import CliRunner

from commsched.cost import LinkClass
from commsched.report.browser import find_chromium, screenshot
from commsched.report.gantt import gantt_png
from commsched.report.html import render_html, write_html
from commsched.report.terminal import print_summary
from commsched.report.trace import to_chrome_trace, write_chrome_trace
from commsched.sim import simulate_costs
from orders import sink_waits_order
from programs import trace_program
from sim_helpers import layer_costs, simple_costs, trace_two_group_layer

# HTA's own pandas calls are deprecated in pandas 3; not ours to fix
pytestmark = pytest.mark.filterwarnings("ignore::DeprecationWarning", "ignore:The inplace keyword:Warning")


@pytest.fixture(scope="module")
def results():
    layer = trace_two_group_layer()
    _, fsdp = trace_program("fsdp_mlp", 8, layers=4, dim=256)
    _, every = trace_program("every_collective", 8)
    return {
        "layer": simulate_costs(layer, layer_costs(layer, LinkClass.INTER_NODE, LinkClass.INTRA_NODE, slowdown=1.5)),
        "fsdp sunk waits": simulate_costs(fsdp, simple_costs(fsdp, 1.2, 1e-6), sink_waits_order(fsdp)),
        "every collective": simulate_costs(every, simple_costs(every, 1.1), sink_waits_order(every)),
    }


# ---------------------------------------------------------------- trace
def test_trace_is_valid_kineto_shaped_chrome_json(results):
    res = results["fsdp sunk waits"]
    trace = json.loads(json.dumps(to_chrome_trace(res)))  # JSON round trip
    assert trace["schemaVersion"] == 1 and trace["distributedInfo"]["rank"] == 0
    events = trace["traceEvents"]
    for e in events:
        assert e["ph"] in {"X", "M", "C", "s", "f"}
        assert isinstance(e["pid"], int) and isinstance(e.get("tid", 0), int)
        if e["ph"] == "X":
            assert e["ts"] >= 0 and e["dur"] >= 0 and e["name"]
    kernels = [e for e in events if e.get("cat") == "kernel"]
    g = res.graph
    timed = np.isin(g.kinds, (1, 5)) & (res.end_ns > res.start_ns)
    assert len(kernels) == int(timed.sum()) + len(g.collectives)
    for k in kernels:
        assert {"stream", "correlation", "External id", "device"} <= set(k["args"])
    nccl = [k for k in kernels if k["name"].startswith("nccl")]
    assert len(nccl) == len(g.collectives)
    # a track per stream, named
    names = {
        e["tid"]: e["args"]["name"] for e in events if e["ph"] == "M" and e["name"] == "thread_name" and e["pid"] == 0
    }
    assert sorted(n.split(" ", 2)[2] for n in names.values()) == sorted(res.stream_names)
    # one flow per wait, start and finish paired by id, start on a comm stream
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    finishes = {e["id"]: e for e in events if e["ph"] == "f"}
    assert set(starts) == set(finishes) == set(np.flatnonzero(g.wait_of >= 0).tolist())
    comm_tids = {k["tid"] for k in nccl}
    assert {e["tid"] for e in starts.values()} <= comm_tids
    # issue 19.4: each arrow runs forward, from inside the collective's slice to inside its wait's slice
    slices = {(e["tid"], e["args"]["node"]): e for e in events if e["ph"] == "X" and "node" in e.get("args", {})}
    waits = [e for e in events if e.get("cat") == "gpu_user_annotation"]
    backwards = 0
    for i, s in starts.items():
        f = finishes[i]
        backwards += f["ts"] < s["ts"]
        coll = slices[(s["tid"], g.names[int(g.wait_of[i])])]
        assert coll["ts"] <= s["ts"] <= coll["ts"] + coll["dur"]
        wait = slices[(f["tid"], g.names[i])]
        assert wait["cat"] == "gpu_user_annotation" and wait["ts"] <= f["ts"] <= wait["ts"] + wait["dur"]
    assert backwards == 0 and any(e["dur"] > 0 for e in waits)  # some waits blocked
    # the memory counter reaches exactly the simulated peak
    counter = [e["args"]["allocated_bytes"] for e in events if e["ph"] == "C"]
    assert max(counter) == res.peak_memory_bytes


@pytest.mark.parametrize("case", ["layer", "fsdp sunk waits", "every collective"])
def test_holistic_trace_analysis_overlap_equals_ours(results, case, tmp_path, monkeypatch):
    # HTA rounds ns-resolution timestamps to whole microseconds unless told not to
    monkeypatch.setenv("HTA_DISABLE_NS_ROUNDING", "1")
    from hta.trace_analysis import TraceAnalysis

    res = results[case]
    write_chrome_trace(res, tmp_path / "rank-0.json")
    analysis = TraceAnalysis(trace_dir=str(tmp_path))
    df = analysis.get_comm_comp_overlap(visualize=False)
    assert res.overlap_ratio > 0  # a schedule that overlaps, so the comparison means something
    # HTA reports a percentage rounded to 2 decimals
    assert float(df["comp_comm_overlap_pctg"].iloc[0]) == pytest.approx(100 * res.overlap_ratio, abs=0.006)
    kernels = analysis.t.get_trace(0)
    assert len(kernels) > len(res.graph.collectives)


# ---------------------------------------------------------------- pictures and HTML
def test_gantt_png_is_a_picture(results):
    png = gantt_png(results["fsdp sunk waits"])
    assert png[:8] == b"\x89PNG\r\n\x1a\n" and len(png) > 10_000


def test_html_is_self_contained(results):
    text = render_html(results["every collective"], context={"hardware": "test-gpu"})
    assert text.startswith("<!DOCTYPE html>") and text.rstrip().endswith("</html>")
    for section in ("summary", "timeline", "exposed", "streams", "bounds"):
        assert f'id="{section}"' in text
    assert "test-gpu" in text and '<script type="application/json" id="timeline-data">' in text
    assert "src=" not in text and "http://" not in text.replace("http://www.w3.org/2000/svg", "")  # nothing to fetch


def test_html_renders_in_headless_chromium(results, tmp_path):
    if find_chromium() is None:
        pytest.fail("Chromium is not installed: `make test` installs it (Debian: apt-get install -y chromium)")
    import matplotlib.image as mpimg

    html = write_html(results["fsdp sunk waits"], tmp_path / "report.html")
    png = screenshot(html, tmp_path / "shot.png", width=1000, height=1400)
    img = mpimg.imread(png)[..., :3]
    assert img.shape[:2] == (1400, 1000)
    # the embedded Gantt chart is drawn: its blocked-wait red and comm orange are on screen
    red = (np.abs(img - np.array([0xD6, 0x27, 0x28]) / 255).max(axis=2) < 0.02).sum()
    orange = (np.abs(img - np.array([0xEF, 0x86, 0x36]) / 255).max(axis=2) < 0.02).sum()
    assert red > 100 and orange > 100


def test_terminal_summary_mentions_the_numbers(results):
    console = Console(record=True, width=140)
    res = results["layer"]
    print_summary(res, console)
    text = console.export_text()
    assert "14.0 us" in text and "2.5 us" in text  # the hand-derived makespan and exposure of the layer case
    assert "all_gather_into_tensor" in text and "comm:1" in text


# ---------------------------------------------------------------- CLI
def test_simulate_cli_writes_every_report(tmp_path, monkeypatch):
    from commsched import cost
    from commsched.cli import app
    from commsched.frontends.json_io import save_graph

    _, g = trace_program("fsdp_mlp", 8)
    path = tmp_path / "graph.json"
    save_graph(g, path)
    if not hasattr(cost, "estimate_costs"):  # until the cost model lands: the simple test formula
        import commsched.cli.simulate as sim_cli

        monkeypatch.setattr(sim_cli, "estimate_on", lambda g, *a: simple_costs(g, 1.1))
    out = {k: tmp_path / f"out.{k}" for k in ("json", "html", "png")}
    order_path = tmp_path / "order.json"
    order_path.write_text(json.dumps([g.names[i] for i in sink_waits_order(g)]))
    result = CliRunner().invoke(
        app,
        ["simulate", str(path), "--hardware", "h100-sxm", "--num-nodes", "2", "--trace", str(out["json"]),
         "--html", str(out["html"]), "--gantt", str(out["png"]), "--order", str(order_path), "--json"],
    )  # fmt: skip
    assert result.exit_code == 0, result.output
    summary = json.loads(result.output[result.output.index("{") :])
    assert summary["makespan_s"] > 0 and summary["peak_memory_bytes"] > 0
    assert summary["overlap_ratio"] > 0  # the sunk-waits order was used (graph order overlaps nothing)
    assert all(p.exists() and p.stat().st_size > 0 for p in out.values())
    assert json.loads(out["json"].read_text())["traceEvents"]


def test_simulate_cli_errors_are_one_line(tmp_path):
    from commsched.cli import app

    result = CliRunner().invoke(app, ["simulate", str(tmp_path / "missing.json")])
    assert result.exit_code == 2
    assert "error" in result.output.lower() and "missing.json" in result.output.replace("\n", "")
    assert "Traceback" not in result.output


def test_gantt_legends_sit_above_their_plots_not_over_the_bars(results):
    """Issue 19.11: the legend was drawn in the upper right corner, over the bars."""
    import matplotlib.pyplot as plt

    from commsched.report.gantt import gantt_figure

    res = results["fsdp sunk waits"]
    fig = gantt_figure(res, capacity_bytes=res.peak_memory_bytes * 1.1)
    fig.canvas.draw()
    renderer = fig.canvas.get_renderer()
    try:
        for ax in fig.axes:
            legend, box = ax.get_legend(), ax.get_window_extent(renderer)
            assert legend is not None
            assert legend.get_window_extent(renderer).y0 >= box.y1 - 1  # above the plot area
    finally:
        plt.close(fig)

"""Issue 19.2: a step that does not fit the device's HBM, or whose FSDP shards are mostly padding, is said so by
every command that knows the hardware (stderr warnings, ``warnings`` in --json, a line on the report's memory plot)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from commsched import hardware
from commsched.cli import app
from commsched.frontends.json_io import save_graph
from commsched.report.capacity import capacity_warning, padding_warning
from commsched.report.gantt import gantt_png
from commsched.report.html import render_html
from commsched.sim import simulate
from commsched.workloads import build

runner = CliRunner()


@pytest.fixture(scope="module")
def step(tmp_path_factory) -> tuple[Path, Path]:
    """llama-tiny FSDP at world 8, and a profile like h100-sxm but with 1 MB of HBM (the step does not fit)."""
    folder = tmp_path_factory.mktemp("capacity")
    w = build("llama-tiny", parallel="fsdp", world_size=8, layers=1)
    save_graph(w.graph, folder / "g.json")
    text = hardware.shipped_profile("h100-sxm").read_text()
    small = folder / "tiny-hbm.toml"
    small.write_text(text.replace("hbm_capacity_gb = 80", "hbm_capacity_gb = 0.001"))
    return folder / "g.json", small


def test_capacity_warning_names_peak_capacity_and_profile():
    hw = hardware.get("h100-sxm")
    assert capacity_warning(70 * 2**30, hw) is None  # fits in 80 GB
    line = capacity_warning(745 * 2**30, hw)
    assert line is not None and "745.00 GiB per rank exceeds the 80 GB" in line and "h100-sxm" in line
    assert "10.00x" in line


def test_simulate_schedule_estimate_warn_when_the_step_does_not_fit(step):
    graph, small = step
    for cmd in ("simulate", "estimate"):
        res = runner.invoke(app, [cmd, str(graph), "-H", str(small), "--json"])
        assert res.exit_code == 0, res.output
        data = json.loads(res.stdout)  # the warning goes to stderr; stdout stays JSON
        assert len(data["warnings"]) == 1 and "exceeds the 0.001 GB" in data["warnings"][0], cmd
        assert "warning: peak memory" in res.stderr
    for cmd in ("schedule", "compare"):
        res = runner.invoke(app, [cmd, str(graph), "-H", str(small)])
        assert res.exit_code == 0 and "warning: peak memory" in res.stderr, cmd
    res = runner.invoke(app, ["simulate", str(graph), "-H", "h100-sxm", "--json"])  # fits: no warning
    assert res.exit_code == 0 and json.loads(res.stdout)["warnings"] == [] and "warning" not in res.stderr


def test_report_draws_the_capacity_on_the_memory_plot_and_heads_with_the_warning(step):
    graph, _ = step
    from commsched.frontends.json_io import load_graph

    g = load_graph(graph)
    res = simulate(g, "h100-sxm")
    peak = res.peak_memory_bytes
    assert gantt_png(res, capacity_bytes=peak * 0.9) != gantt_png(res)  # the line is drawn
    assert gantt_png(res, capacity_bytes=peak * 100) == gantt_png(res)  # far above the curve: not drawn
    page = render_html(res, capacity_bytes=peak * 0.9, warnings=["peak memory exceeds <HBM>"])
    assert '<section id="warnings"><p class="warn">warning: peak memory exceeds &lt;HBM&gt;</p>' in page


def test_fsdp_padding_warns_and_names_the_worst_parameter():
    w = build("mixtral-tiny", parallel="fsdp", world_size=64, layers=1)
    line = padding_warning(w.meta)
    assert line is not None and "router.gate.weight (8 rows padded to 64, 8x)" in line and "64 FSDP ranks" in line
    assert padding_warning(build("mixtral-tiny", parallel="fsdp", world_size=8, layers=1).meta) is None
    res = runner.invoke(app, ["trace", "mixtral-tiny", "-p", "fsdp", "-w", "64", "-l", "1"])
    assert res.exit_code == 0 and "warning: FSDP padding" in res.stderr

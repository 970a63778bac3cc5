"""Calibration on this machine: measure, fit, write a profile that get() then finds; fits recover known models."""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest

from commsched import hardware
from commsched.cli.calibrate import run_calibration
from commsched.cost.calibrate import Measurements, fit_profile
from commsched.cost.collectives import bus_factor
from commsched.cost.compute import memory_time


@pytest.fixture(autouse=True)
def _isolated_profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMSCHED_PROFILE_DIR", str(tmp_path / "profiles"))


def test_fit_recovers_a_known_machine():
    """Synthetic measurements made by a known profile: the fit finds its bandwidths, peak and latencies back."""
    truth = hardware.get("cpu-local")
    c = truth.compute
    m = Measurements(device="cpu", units=c.num_units, launch_s=c.launch_overhead_s)
    for b in np.logspace(12, 27, 16, base=2):
        m.elementwise.append((int(b), c.launch_overhead_s + float(memory_time(np.array([b]), 1.0, truth)[0])))
        m.reduction.append((int(b), c.launch_overhead_s + float(memory_time(np.array([b]), 0.5, truth)[0])))
    peak = c.peak_flops_for("float32")
    for n in (256, 512, 1024, 2048):
        m.matmul.append((n, n, n, "float32", c.launch_overhead_s + 2 * n**3 / peak))
    simple = truth.protocols[0]
    bus = truth.intra_node.link_bandwidth_bytes_per_s
    coll = Measurements(device="gloo x2")
    for kind in ("all_reduce", "all_gather", "broadcast"):
        for b in (1 << 12, 1 << 16, 1 << 20, 1 << 24):
            steps = 2 if kind == "all_reduce" else 1
            lat = simple.base_latency_s + steps * simple.intra_hop_latency_s
            coll.collectives.append((kind, 2, b, lat + bus_factor(kind, 2) * b / bus))
    fitted = fit_profile(truth, m, coll)
    fc = fitted.compute
    assert fc.hbm_bandwidth_bytes_per_s == pytest.approx(c.hbm_bandwidth_bytes_per_s, rel=0.05)
    assert fc.cache_bandwidth_bytes_per_s == pytest.approx(c.cache_bandwidth_bytes_per_s, rel=0.05)
    assert fc.efficiency.reduction == pytest.approx(0.5, rel=0.05)
    assert fc.peak_flops_for("float32") == pytest.approx(peak, rel=0.05)
    assert fitted.intra_node.link_bandwidth_bytes_per_s == pytest.approx(bus, rel=0.05)
    assert fitted.protocols[0].base_latency_s + fitted.protocols[0].intra_hop_latency_s == pytest.approx(
        simple.base_latency_s + simple.intra_hop_latency_s, rel=0.3
    )


@pytest.mark.slow
def test_quick_calibration_writes_a_profile_found_by_name(tmp_path):
    path, hw = run_calibration("cpu", None, world=2, quick=True)
    assert path == hardware.user_profile_dir() / "cpu-local.toml" and path.is_file()
    assert (path.parent / "cpu-local.table.json").is_file()
    found = hardware.get("cpu-local")
    assert found.source == str(path) and found.table_path == str(path.parent / "cpu-local.table.json")
    assert dataclasses.asdict(found) == dataclasses.asdict(hw)
    c = found.compute
    assert 0 < c.launch_overhead_s < 1e-3
    assert 1e8 < c.peak_flops_for("float32") < 1e13
    assert 1e8 < c.hbm_bandwidth_bytes_per_s < 1e12
    assert 1e6 < found.intra_node.link_bandwidth_bytes_per_s < 1e12
    # the measured collectives are used directly
    from commsched.cost import MeasuredTable

    table = MeasuredTable.load(found.table_path)
    assert {k for k, *_ in table.collectives} >= {"all_reduce", "all_gather", "broadcast"}
    assert "Written by `commsched calibrate --device cpu`" in path.read_text()


@pytest.mark.slow
def test_calibrated_estimates_track_a_real_run(tmp_path):
    """After a quick calibration, eager estimates of a real MLP step's ops stay within a factor of 2 at the median
    (benchmarks/bench_cost_cpu.py measures the full calibration: ~10-25 % on this shared 2-core machine)."""
    import statistics

    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from commsched.cost import estimate_costs
    from commsched.cost.measure_graph import time_fx_nodes
    from commsched.frontends.fx import from_fx
    from commsched.ir import OpKind

    _, hw = run_calibration("cpu", tmp_path / "cpu-local.toml", world=2, quick=True, collectives=False)
    torch.manual_seed(0)
    w1, w2 = torch.randn(256, 512, requires_grad=True), torch.randn(512, 256, requires_grad=True)

    def step(x, w1, w2):
        loss = torch.relu(x @ w1).matmul(w2).pow(2).mean()
        return [loss, *torch.autograd.grad(loss, [w1, w2])]

    x = torch.randn(256, 256)
    gm = make_fx(step, tracing_mode="fake")(x, w1, w2)
    g = from_fx(gm)
    torch.set_num_threads(1)
    measured = time_fx_nodes(gm, x, w1, w2, reps=5)
    est = estimate_costs(g, hw, fusion=False)
    ops = [i for i in range(len(g)) if g.kinds[i] in (OpKind.COMPUTE, OpKind.OTHER) and g.names[i] in measured]
    assert len(ops) >= 8
    errors = [abs(est.node_s[i] / measured[g.names[i]] - 1) for i in ops]
    assert statistics.median(errors) < 1.0, f"median error {statistics.median(errors):.0%}"


def _memory_bound_bf16() -> tuple[hardware.Hardware, Measurements]:
    """A machine whose bf16 matmuls only move memory (2 bytes per element): they bound no bf16 peak."""
    truth = hardware.load_profile(hardware.shipped_profile("cpu-local"))
    c = truth.compute
    m = Measurements(device="cpu", units=c.num_units, launch_s=c.launch_overhead_s)
    for b in np.logspace(12, 27, 16, base=2):
        m.elementwise.append((int(b), c.launch_overhead_s + float(memory_time(np.array([b]), 1.0, truth)[0])))
        m.reduction.append((int(b), c.launch_overhead_s + float(memory_time(np.array([b]), 0.5, truth)[0])))
    for n in (256, 512, 1024, 2048):
        m.matmul.append((n, n, n, "float32", c.launch_overhead_s + 2 * n**3 / c.peak_flops_for("float32")))
    for n in (64, 128, 256):
        t_mem = float(memory_time(np.array([2.0 * 3 * n * n]), 1.0, truth)[0])
        m.matmul.append((n, n, n, "bfloat16", c.launch_overhead_s + t_mem))
    return truth, m


def test_a_peak_the_matmuls_do_not_constrain_is_an_error_not_the_search_bound():
    """Issue 19.1: a bf16 peak of ~10,000 TFLOP/s was the search's upper bound; now the fit names the field."""
    truth, m = _memory_bound_bf16()
    with pytest.raises(ValueError, match=r"compute\.peak_flops\[bfloat16\] = .* is the fit's bound"):
        fit_profile(truth, m)
    m.matmul = [r for r in m.matmul if r[3] != "bfloat16"]
    assert fit_profile(truth, m).compute.peak_flops_for("float32") < 1e13  # the rest still fits


def test_calibrate_never_writes_into_the_shipped_profiles_nor_over_a_file(tmp_path):
    """Issue 19.1: checked before any measurement (these would take seconds), one line, exit 2 from the CLI."""
    from typer.testing import CliRunner

    from commsched.cli import app

    shipped = hardware.shipped_profile("cpu-local")
    before = shipped.read_bytes()
    res = CliRunner().invoke(app, ["calibrate", "--device", "cpu", "--quick", "-o", str(shipped)])
    assert res.exit_code == 2 and "refusing to write into the shipped profiles" in res.output
    assert shipped.read_bytes() == before
    existing = tmp_path / "mine.toml"
    existing.write_text("# mine\n")
    res = CliRunner().invoke(app, ["calibrate", "--device", "cpu", "--quick", "-o", str(existing)])
    assert res.exit_code == 2 and "exists: pass --force" in res.output and existing.read_text() == "# mine\n"
    default = hardware.user_profile_dir() / "cpu-local.toml"  # the default: a new file in the user folder
    default.parent.mkdir(parents=True)
    default.write_text("# an earlier calibration\n")
    with pytest.raises(ValueError, match=r"cpu-local\.toml exists: pass --force"):
        run_calibration("cpu", None, quick=True)

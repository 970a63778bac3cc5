"""Issue 38, hardware as deployed: the GPU variants users run (H100 96 GB HBM2e, H100 NVL, H800, GB300 NVL72,
MI325X) carry their cited headline numbers, order as their datasheets say, and ``commsched hardware`` lists them."""

from __future__ import annotations

import json
import re

import pytest
from typer.testing import CliRunner

from commsched import hardware
from commsched.cli import app
from commsched.hardware import load_profile, shipped_profile

runner = CliRunner()


@pytest.fixture(autouse=True)
def _isolated_profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMSCHED_PROFILE_DIR", str(tmp_path / "user-profiles"))


# The headline numbers, per GPU, in the units the sources print (dense TFLOP/s, TB/s, GB, GB/s per direction of
# NVLink / xGMI, GPUs per node): a typo in a profile file fails here. The profile files cite each one in full.
HEADLINES = {
    # derived (h100-sxm-96g.toml): torchtitan's "between SXM and NVL" midpoint; 6 HBM2e stacks x 400 GB/s; its "94GB"
    "h100-sxm-96g": {"bf16": 912, "fp8": 1824, "hbm_tb": 2.4, "hbm_gb": 94, "link": 450, "gpn": 8},
    # NVIDIA H100 datasheet, NVL column (sparse 1,671 / 3,341 halved; 94 GB at 3.9 TB/s; NVLink bridge 600 GB/s)
    "h100-nvl": {"bf16": 835, "fp8": 1670, "hbm_tb": 3.9, "hbm_gb": 94, "link": 300, "gpn": 2},
    # DeepSeek, arXiv 2505.09343 Sec. 2: the H100 but for FP64 and NVLink, "reduced from 900 GB/s to 400 GB/s"
    "h800": {"bf16": 989, "fp8": 1979, "hbm_tb": 3.35, "hbm_gb": 80, "link": 200, "gpn": 8},
    # NVIDIA GB300 NVL72 per GPU (ml-engineering's dense table; verda's per-GPU table: 279 GB, 8 TB/s, NVLink 5)
    "gb300-nvl72": {"bf16": 2500, "fp8": 5000, "hbm_tb": 8.0, "hbm_gb": 279, "link": 900, "gpn": 72},
    # AMD Instinct MI325X data sheet (MI300X compute: 1307.4 / 2614.9; 256 GB HBM3E at 6 TB/s; 7 x 64 GB/s xGMI)
    "mi325x": {"bf16": 1307.4, "fp8": 2614.9, "hbm_tb": 6.0, "hbm_gb": 256, "link": 448, "gpn": 8},
    # the FP8 peaks of the profiles shipped before (datasheets: B200 4.5, GB200 5, H200 1.979, MI300X 2.6149 PFLOP/s)
    "b200": {"fp8": 4500},
    "gb200-nvl72": {"fp8": 5000},
    "h200-sxm": {"fp8": 1979},
    "mi300x": {"fp8": 2614.9},
}


def _headline(hw: hardware.Hardware) -> dict[str, float]:
    peak = dict(hw.compute.peak_flops)
    return {
        "bf16": peak["bfloat16"] / 1e12,
        "fp8": peak.get("float8_e4m3fn", 0.0) / 1e12,
        "hbm_tb": hw.compute.hbm_bandwidth_bytes_per_s / 1e12,
        "hbm_gb": hw.compute.hbm_capacity_bytes / 1e9,
        "link": hw.intra_node.link_bandwidth_bytes_per_s / 1e9,
        "gpn": hw.gpus_per_node,
    }


@pytest.mark.parametrize("name", list(HEADLINES))
def test_headline_numbers_are_the_cited_ones(name):
    got = _headline(hardware.get(name))
    for key, value in HEADLINES[name].items():
        assert got[key] == pytest.approx(value, rel=1e-9), (name, key)


def test_every_accelerator_with_fp8_tensor_cores_has_a_dense_fp8_peak_twice_its_bf16():
    """Hopper, Blackwell and CDNA 3 run FP8 at twice BF16 (dense); the A100 has no FP8 tensor cores (falls back)."""
    for name in hardware.list_profiles():
        if name in ("a100-sxm-80g", "cpu-local"):
            continue
        h = _headline(hardware.get(name))
        assert h["fp8"] == pytest.approx(2 * h["bf16"], rel=2e-3), name
        other = "float8_e4m3fnuz" if name.startswith("mi") else "float8_e5m2"  # CDNA 3's FP8 / NVIDIA's other one
        assert dict(hardware.get(name).compute.peak_flops)[other] / 1e12 == pytest.approx(h["fp8"]), name


def test_the_h100_variants_order_as_their_datasheets_say():
    sxm, hbm2e, nvl, h800 = (hardware.get(n) for n in ("h100-sxm", "h100-sxm-96g", "h100-nvl", "h800"))
    bf16 = {hw.name: dict(hw.compute.peak_flops)["bfloat16"] for hw in (sxm, hbm2e, nvl, h800)}
    # the HBM2e part: slower memory, a matmul peak between NVL and SXM (torchtitan: "between SXM and NVL"), more memory
    assert hbm2e.compute.hbm_bandwidth_bytes_per_s < sxm.compute.hbm_bandwidth_bytes_per_s
    assert bf16["h100-nvl"] < bf16["h100-sxm-96g"] < bf16["h100-sxm"]
    assert hbm2e.compute.hbm_capacity_bytes > sxm.compute.hbm_capacity_bytes
    # H800: the H100 SXM's compute and memory, NVLink cut (900 -> 400 GB/s bidirectional), the same 8 x 400G network
    assert h800.compute == sxm.compute
    assert h800.intra_node.link_bandwidth_bytes_per_s < sxm.intra_node.link_bandwidth_bytes_per_s
    assert h800.inter_node == sxm.inter_node and h800.inter_node.fitted  # both on the fitted ib-ndr-8x400
    # NVL: all 132 SMs of the die at a TDP-limited tensor clock (dense FLOP/s per SM per cycle: 4096 on Hopper)
    assert nvl.compute.num_units == sxm.compute.num_units == hbm2e.compute.num_units == 132
    clock_ghz = {name: peak / (132 * 4096) / 1e9 for name, peak in bf16.items()}
    assert clock_ghz["h100-sxm"] == pytest.approx(1.83, abs=0.01)  # Hopper's tensor clock (glennklockwood.com)
    assert clock_ghz["h100-nvl"] == pytest.approx(1.54, abs=0.01)
    assert clock_ghz["h100-nvl"] < clock_ghz["h100-sxm-96g"] < clock_ghz["h100-sxm"]
    assert nvl.compute.hbm_bandwidth_bytes_per_s > sxm.compute.hbm_bandwidth_bytes_per_s  # 3.9 vs 3.35 TB/s
    assert not nvl.intra_node.nvls and nvl.gpus_per_node == 2  # a bridged pair, no NVSwitch


def test_the_hbm2e_part_s_derived_numbers_are_their_derivations():
    """h100-sxm-96g's unpublished numbers, from the cited ones: the midpoint of the NVL and SXM peaks (torchtitan:
    "between SXM and NVL") and 6 HBM2e stacks at the H100 PCIe's 2,000 GB/s / 5 stacks; each line says "derived"."""
    sxm, nvl, hbm2e = (dict(hardware.get(n).compute.peak_flops) for n in ("h100-sxm", "h100-nvl", "h100-sxm-96g"))
    for dtype in ("bfloat16", "float8_e4m3fn", "float32"):
        assert hbm2e[dtype] == pytest.approx((sxm[dtype] + nvl[dtype]) / 2, rel=1e-3), dtype
    assert hardware.get("h100-sxm-96g").compute.hbm_bandwidth_bytes_per_s == pytest.approx(6 * 2000e9 / 5)
    text = shipped_profile("h100-sxm-96g").read_text()
    for key in ("hbm_tb_per_s", "bfloat16", "float16", "float8_e4m3fn", "float8_e5m2", "float32", "tfloat32"):
        line = next(ln for ln in text.splitlines() if re.match(rf"{key}\s*=", ln))
        assert "# derived:" in line, line


def test_gb300_is_the_gb200_rack_with_blackwell_ultra_gpus():
    gb200, gb300 = hardware.get("gb200-nvl72"), hardware.get("gb300-nvl72")
    assert gb300.intra_node == gb200.intra_node and gb300.gpus_per_node == gb200.gpus_per_node == 72
    assert gb300.compute.hbm_capacity_bytes > gb200.compute.hbm_capacity_bytes
    assert gb300.inter_node.nics_per_node == 72 and gb300.inter_node.nic_bandwidth_bytes_per_s == 100e9  # 800 Gb/s
    mi300x, mi325x = hardware.get("mi300x"), hardware.get("mi325x")
    assert mi325x.compute.peak_flops == mi300x.compute.peak_flops  # "the same compute as MI300X"
    assert mi325x.compute.efficiency.matmul > mi300x.compute.efficiency.matmul  # measured: 784.9 vs 668.4 TFLOP/s


def test_efficiency_constants_name_where_they_come_from():
    """Every efficiency of the new profiles is measured ([mamf]) or inherited from a named profile ("as ...")."""
    for name in ("h100-sxm-96g", "h100-nvl", "h800", "gb300-nvl72", "mi325x"):
        raw = load_profile(shipped_profile(name))
        assert raw.name == name
        text = shipped_profile(name).read_text()
        section = text.split("[compute.efficiency]")[1].split("\n[")[0]
        for line in filter(None, section.strip().splitlines()):
            assert "[mamf]" in line or re.search(r"# as [a-z0-9-]+", line), (name, line)


def test_the_hardware_command_lists_every_profile_with_its_numbers():
    res = runner.invoke(app, ["hardware", "--json", "-"])
    assert res.exit_code == 0, res.output
    listed = json.loads(res.output)
    rows = {p["name"]: p for p in listed["profiles"]}
    assert set(rows) == set(hardware.list_profiles())
    assert {"h100-sxm-96g", "h100-nvl", "h800", "gb300-nvl72", "mi325x"} <= set(rows)
    for name, numbers in HEADLINES.items():
        assert rows[name]["float8_e4m3fn_tflops"] == pytest.approx(numbers["fp8"]), name
        if "bf16" in numbers:
            assert rows[name]["bfloat16_tflops"] == pytest.approx(numbers["bf16"]), name
            assert rows[name]["hbm_tb_per_s"] == pytest.approx(numbers["hbm_tb"]), name
            assert rows[name]["link_gb_per_s"] == pytest.approx(numbers["link"]), name
    assert rows["h800"]["default_network"] == "ib-ndr-8x400" and rows["h100-sxm-96g"]["default_network"] is None
    assert rows["a100-sxm-80g"]["float8_e4m3fn_tflops"] is None
    assert {n["name"] for n in listed["networks"]} == set(hardware.list_networks())
    table = runner.invoke(app, ["hardware"], env={"COLUMNS": "200"})
    assert table.exit_code == 0, table.output
    for name in rows:
        assert name in table.output
    assert "1824" in table.output and "ib-ndr-8x400" in table.output

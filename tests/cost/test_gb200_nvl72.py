"""The gb200-nvl72 profile (issue 17): a GB200 NVL72 rack is one node of 72 GPUs (its NVLink domain), racks talk over
InfiniBand. It loads by name, keeps a 72-rank group on NVLink and sends a 144-rank one over the NICs, places groups of
any size on 72-GPU nodes, and reproduces the public logs it was fitted on (CoreWeave, one rack) and the ones held out
(OCI 2 trays x 4, Azure 4 GPUs) within what was measured when it was fitted (the profile's header gives the numbers).
"""

from __future__ import annotations

import dataclasses
import re
import statistics
from pathlib import Path

import pytest

import commsched
from commsched import hardware
from commsched.cost.collectives import bus_factor, plan_collective
from commsched.cost.model import LinkClass
from commsched.cost.nccl_fit import fit_profile
from commsched.cost.nccl_tests import NcclTestsLog, compare_with_model, read_nccl_tests

DATA = Path(commsched.__file__).parent / "cost" / "data" / "nccl_tests"
GIB = 1 << 30
MIB = 1 << 20
# log -> (ranks, racks, ranks per rack). The CoreWeave headers keep one '# Rank' line (sources.toml), so the rank
# count is the README's; the 2-rack run is 128 ranks, 64 per rack. OCI runs 8 ranks on 2 trays of ONE rack: one node
# of 8 in this model (NVLink between the trays, NCCL_IB_DISABLE=1).
CW1, CW2, CW20 = (f"coreweave_gb200_nvl72_{n}rack_ar.txt" for n in (1, 2, 20))
OCI = "oci_oke_gb200_nvl72_2x4_mnnvl_ar.txt"
AZURE = "azure_nd_gb200_v6_1vm_4gpu_ring_ar_summary.txt"
PLACEMENT = {CW1: (72, 1, 72), CW2: (128, 2, 64), CW20: (1440, 20, 72), OCI: (8, 1, 8)}


@pytest.fixture(autouse=True)
def _isolated_profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMSCHED_PROFILE_DIR", str(tmp_path / "user-profiles"))


def gb200_log(file: str) -> NcclTestsLog:
    (log,) = read_nccl_tests(DATA / file, collective="all_reduce")
    ranks, racks, per_rack = PLACEMENT[file]
    return dataclasses.replace(log, nranks=ranks, nodes=racks, ranks_per_host=(per_rack,) * racks)


def errors(file: str) -> tuple[float, float]:
    """(median, worst) |busbw error| of the shipped profile over the log's sizes >= 1 MiB."""
    cmp = compare_with_model(gb200_log(file), "gb200-nvl72")
    assert cmp.median_abs_err is not None and cmp.worst_abs_err is not None
    return cmp.median_abs_err, cmp.worst_abs_err


def test_loads_by_name_with_the_cited_numbers():
    hw = hardware.get("gb200-nvl72")
    assert hw.name == "gb200-nvl72" and hw.gpus_per_node == 72 and hw.num_nodes == 1
    assert "gb200-nvl72" in hardware.list_profiles()
    assert hw.compute.peak_flops_for("bfloat16") == pytest.approx(2500e12)  # 5 PFLOPS sparse, dense half
    assert hw.compute.peak_flops_for("float8_e4m3fn") == pytest.approx(5000e12)
    assert hw.compute.hbm_capacity_bytes == pytest.approx(186e9)
    assert hw.compute.hbm_bandwidth_bytes_per_s == pytest.approx(8e12)
    assert hw.intra_node.link_bandwidth_bytes_per_s == pytest.approx(900e9) and hw.intra_node.nvls
    assert hw.inter_node.nics_per_node == 72  # one 400G ConnectX-7 per GPU
    assert hw.inter_node.nic_bandwidth_bytes_per_s == pytest.approx(50e9)


def test_a_rack_all_reduce_stays_on_nvlink_and_two_racks_use_the_nics():
    hw = hardware.get("gb200-nvl72", num_nodes=2)
    rack = plan_collective("all_reduce", GIB, 72, hw)
    assert (rack.nodes, rack.ranks_per_node, rack.link) == (1, 72, LinkClass.INTRA_NODE)
    assert rack.algorithm in ("nvls", "ring", "tree")  # the one-node algorithms: no NIC
    two = plan_collective("all_reduce", GIB, 144, hw)
    assert (two.nodes, two.ranks_per_node, two.link) == (2, 72, LinkClass.INTER_NODE)
    assert two.time_s > rack.time_s


@pytest.mark.parametrize(
    ("size", "stride", "expected"),
    [
        (4, 1, (4, 1)),  # TP inside a tray
        (8, 1, (8, 1)),  # TP of 8: nine groups per rack
        (72, 1, (72, 1)),  # the whole rack
        (9, 8, (9, 1)),  # DP over TP=8 inside one rack: ranks 0, 8, ..., 64
        (18, 8, (9, 2)),  # the same over 2 racks
        (16, 72, (1, 16)),  # one rank per rack
        (144, 1, (72, 2)),
        (1024, 1, (72, 15)),  # FSDP over 14 full racks and 16 GPUs of a 15th
    ],
)
def test_placement_on_72_gpu_nodes(size, stride, expected):
    assert hardware.get("gb200-nvl72", num_nodes=16).placement(size, stride) == expected


def test_an_fsdp_group_of_1024_needs_15_racks():
    assert plan_collective("all_gather", GIB, 1024, hardware.get("gb200-nvl72", num_nodes=15)).nodes == 15
    with pytest.raises(ValueError, match="spans 15 nodes of 72 GPUs"):
        plan_collective("all_gather", GIB, 1024, hardware.get("gb200-nvl72", num_nodes=14))


def test_fitted_on_the_coreweave_rack():
    """Measured at the fit: 1.1 % median, 2.3 % worst over 512 MiB - 8 GiB."""
    median, worst = errors(CW1)
    assert median <= 0.02 and worst <= 0.035


def test_the_profile_holds_the_fit():
    """Fitting again from the shipped values moves nothing that matters: the TOML holds what fit_profile finds."""
    hw = hardware.get("gb200-nvl72")
    (_, racks, per_rack) = PLACEMENT[CW1]
    fit = fit_profile([gb200_log(CW1)], hw, num_nodes=racks, gpus_per_node=per_rack)
    assert fit.summary()[0] <= 0.02
    fitted = {p.key: p.value for p in fit.parameters}
    assert fitted["intra_node.nvls_efficiency"] == pytest.approx(hw.intra_node.nvls_efficiency, abs=0.01)
    assert fitted["intra_node.nvls_latency_us"] == pytest.approx(hw.intra_node.nvls_latency_s * 1e6, rel=0.05)


def test_held_out_oci_two_trays():
    """Measured at the fit: 9.7 % median, 24.9 % worst (ring LL128 at 64 MiB) over 1 MiB - 32 GiB."""
    median, worst = errors(OCI)
    assert median <= 0.12 and worst <= 0.28


def test_held_out_azure_four_gpus_ring():
    """The Azure table is (size, in-place busbw) with NCCL_ALGO=Ring, sizes 1 KiB x 2^row: modelled without NVLS.
    Measured at the fit: 11.7 % median, 29.8 % worst over the sizes >= 1 MiB."""
    busbw = [float(m) for m in re.findall(r"^\|\s*\d+[KMG]\s*\|\s*([\d.]+)\s*\|", (DATA / AZURE).read_text(), re.M)]
    assert len(busbw) == 24  # 1 KiB .. 8 GiB
    hw = hardware.get("gb200-nvl72")
    ring_only = dataclasses.replace(hw, intra_node=dataclasses.replace(hw.intra_node, nvls=False))
    errs = []
    for row, gbps in enumerate(busbw):
        size = 1024 << row
        if size >= MIB:
            measured_s = bus_factor("all_reduce", 4) * size / (gbps * 1e9)
            errs.append(abs(measured_s / plan_collective("all_reduce", size, 4, ring_only).time_s - 1))
    assert statistics.median(errs) <= 0.14 and max(errs) <= 0.33


def test_across_racks_the_model_is_too_fast_as_the_header_says():
    """The network is not fitted (a fit gives a 0.12 NIC efficiency): across racks the model runs too fast, by
    6-18 % on 2 racks and 116-268 % on 20 at the fit. If the model learns how many NICs NCCL's NVLS-tree uses, this
    fails: then fit the network and rewrite the profile's header."""
    for file, (lo, hi) in ((CW2, (0.05, 0.20)), (CW20, (1.0, 2.8))):
        cmp = compare_with_model(gb200_log(file), "gb200-nvl72")
        errs = [s.rel_err for s in cmp.sizes if s.size_bytes >= MIB and s.rel_err is not None]
        assert all(lo <= e <= hi for e in errs), (file, errs)

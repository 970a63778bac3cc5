"""The shipped network profiles (issue 17): each is fitted to a cited public nccl-tests log, reproduces that fit as
shipped (rounded), is far closer than the InfiniBand defaults on its fabric, and where the data hold a second
source, holds on it."""

from __future__ import annotations

import dataclasses
import itertools
import statistics
from pathlib import Path

import pytest
import tomllib

import commsched
from commsched import hardware
from commsched.cost.nccl_tests import NcclTestsLog, compare_with_model, read_nccl_tests

DATA = Path(commsched.__file__).parent / "cost" / "data" / "nccl_tests"
INDEX = {e["file"]: e for e in tomllib.loads((DATA / "sources.toml").read_text())["log"]}
CLASSES = ((1 << 20, 16 << 20), (16 << 20, 256 << 20), (256 << 20, 8 << 30))  # 1-16 MB, 16-256 MB, 256 MB-8 GB
# network: (GPU it was fitted under, the fitted log, median |busbw error| >= 1 MiB after the fit; held-out logs)
FITS = {
    "efa-p5": ("h100-sxm", "aws_ads_p5_2node_efa_ar.txt", 0.03, ("aws_do_eks_p5_2node_efa_ar.txt",)),
    "roce-8x400": ("h200-sxm", "skypilot_gcp_a3ultra_h200_2node_rdma_all_gather.txt", 0.03,
                   ("skypilot_gcp_a3ultra_h200_2node_rdma_all_gather_gcppods.txt",)),
    "tcpxo-8x200": ("h100-sxm", "gcp_a3mega_h100_2node_tcpxo_ar.txt", 0.03, ()),
}  # fmt: skip


def indexed(file: str) -> NcclTestsLog:
    entry = INDEX[file]
    (log,) = read_nccl_tests(DATA / file, collective=entry["collective"])
    per_node = entry["nranks"] // entry["nodes"]
    return dataclasses.replace(log, nranks=entry["nranks"], nodes=entry["nodes"],
                               ranks_per_host=(per_node,) * entry["nodes"])  # fmt: skip


def test_every_shipped_network_is_checked_here():
    assert set(hardware.list_networks()) == {"ib-ndr-8x400", *FITS}


@pytest.mark.parametrize("network", sorted(FITS))
def test_a_network_profile_reproduces_its_fit_and_is_closer_than_the_defaults(network):
    gpu, file, median_after, held_out = FITS[network]
    text = (Path(hardware.list_networks()[network])).read_text()
    assert file in text and "[fit]" in text  # the file cites the log it was fitted to
    log = indexed(file)
    shipped = compare_with_model(log, f"{gpu}@{network}")
    default = compare_with_model(log, f"{gpu}@nccl-defaults")  # the GPU profile's own network: NCCL's constants
    assert shipped.median_abs_err < median_after, shipped.median_abs_err
    assert default.median_abs_err > 2 * shipped.median_abs_err, (default.median_abs_err, shipped.median_abs_err)
    for other in held_out:  # a second source the fit never saw
        held = compare_with_model(indexed(other), f"{gpu}@{network}")
        assert held.median_abs_err < 0.05 and held.worst_abs_err < 0.10, (held.median_abs_err, held.worst_abs_err)


def test_a_network_profile_changes_only_the_network():
    h100, efa = hardware.get("h100-sxm", num_nodes=2), hardware.get("h100-sxm@efa-p5", num_nodes=2)
    # of the NVLink fields only NVLS-tree's pace across nodes, which the network sets
    paced = dataclasses.replace(h100.intra_node, nvls_tree_efficiency=0.92)
    assert efa.compute == h100.compute and efa.intra_node == paced
    assert [p.base_latency_s for p in efa.protocols] == [p.base_latency_s for p in h100.protocols]
    assert efa.inter_node.nics_per_node == 32 and efa.inter_node.nic_bandwidth_bytes_per_s == 100e9 / 8
    # same aggregate line rate as 8 x 400G, but EFA's slower steps make a 4 MiB all_reduce across nodes dearer
    from commsched.cost.collectives import collective_time_s

    assert collective_time_s("all_reduce", 4 << 20, 16, efa) > 1.2 * collective_time_s("all_reduce", 4 << 20, 16, h100)


def test_a_network_fitted_on_three_ib_clusters_holds_on_a_fourth_it_never_saw():
    """benchmarks/RESULTS.md, "One H100 InfiniBand cluster left out": fitted at once on qoofyk's (nccl-tests#309), a
    10-node cluster's and the dstack docs' Nebius logs (from the shipped network's structure), the network predicts
    gj-aion's 2/4/8-node all_reduce within issue 17's bar (median <= 10 % per size class, 5 / 7 / 3 %), where NCCL's
    constants are 15-77 % off."""
    from commsched.cost.nccl_fit import fit_profile

    qoofyk = ["nccl_tests_issue309_h100_2node_ib_ar_qoofyk.txt", "nccl_tests_issue309_h100_4node_ib_vm_ar_qoofyk.txt"]
    ten_nodes = [f"xxrjun_cluster01_h100_10node_g8_{c}.txt" for c in ("all_reduce", "all_gather", "reduce_scatter")]
    fit_files = [*qoofyk, *ten_nodes, "dstack_nebius_h100_2node_ib_ar.txt"]
    fit = fit_profile([indexed(f) for f in fit_files], "h100-sxm@ib-ndr-8x400", allow_bounds=True, network_only=True)
    held = fit.evaluate([indexed(f"nccl_tests_issue309_h100_{n}node_ib_ar_gjaion.txt") for n in (2, 4, 8)])
    for lo, hi in ((1 << 20, 16 << 20), (16 << 20, 256 << 20), (256 << 20, 8 << 30)):
        inside = [s for s in held if lo <= s.size_bytes <= hi]
        after = statistics.median(abs(s.after_err) for s in inside)
        nccl = statistics.median(abs(compare(s, "h100-sxm@nccl-defaults")) for s in inside)  # the GPU's own network
        assert after <= 0.10 < nccl, (lo, after, nccl)


def compare(size, hw: str) -> float:
    """Model busbw / measured busbw - 1 of one fitted or held-out size under the profile ``hw``."""
    from commsched.cost.collectives import plan_collective

    placed = hardware.get(hw).with_nodes(size.num_nodes, size.nranks // size.num_nodes)
    return size.measured_time_s / plan_collective(size.collective, size.size_bytes, size.nranks, placed).time_s - 1


def _class_medians(comparison) -> list[float]:
    return [
        statistics.median(abs(s.rel_err) for s in comparison.sizes if lo <= s.size_bytes <= hi) for lo, hi in CLASSES
    ]


def test_the_shipped_ib_network_on_clusters_it_was_not_fitted_to():
    """benchmarks/RESULTS.md (held-out, shipped profiles): on the dstack docs' Nebius H100 2-node log the fitted
    InfiniBand network meets issue 17's bar in every size class (3 % / 5 % / 3 %; NCCL's constants: 53 % at 1-16 MB);
    fitted under H100, it meets it under B200 too (b200's default network since issue 36) on Lambda's B200 2-node log
    (8 % / 3 % / 10 %; NCCL's constants 65 % / 34 % / 4 %)."""
    h100 = _class_medians(compare_with_model(indexed("dstack_nebius_h100_2node_ib_ar.txt"), "h100-sxm@ib-ndr-8x400"))
    assert max(h100) <= 0.10, h100
    b200_log = indexed("dstack_lambda_b200_2node_ib_ar.txt")
    fitted, nccl = (_class_medians(compare_with_model(b200_log, hw)) for hw in ("b200", "b200@nccl-defaults"))
    assert max(fitted) <= 0.10 and fitted[0] < nccl[0] / 3 and fitted[1] < nccl[1] / 2, (fitted, nccl)


# issue 17's bar per network family (benchmarks/RESULTS.md, "Per network family", from
# `python benchmarks/bench_collective_accuracy.py --families`): held-out logs, whole sources no network was fitted to
FAMILIES = {
    "IB": [(f, "h100-sxm@ib-ndr-8x400") for f in (
        "nccl_tests_issue309_h100_2node_ib_ar_qoofyk.txt", "nccl_tests_issue309_h100_4node_ib_vm_ar_qoofyk.txt",
        "dstack_nebius_h100_2node_ib_ar.txt", "skypilot_together_h100_2node_ib_ar.txt",
        *(f"xxrjun_cluster01_h100_10node_g8_{c}.txt" for c in ("all_reduce", "all_gather", "reduce_scatter")))]
          + [("dstack_lambda_b200_2node_ib_ar.txt", "b200@ib-ndr-8x400")],
    "RoCE": [("skypilot_gcp_a3ultra_h200_2node_rdma_all_gather_gcppods.txt", "h200-sxm@roce-8x400"),
             ("dstack_gcp_a4_b200_2node_roce_ar.txt", "b200@roce-8x400"),
             ("oci_hpc_h100_2node_roce_ar.txt", "h100-sxm@roce-8x400")],
    "EFA": [("aws_do_eks_p5_2node_efa_ar.txt", "h100-sxm@efa-p5")],
}  # fmt: skip
# family: per size class (1-16 MB, 16-256 MB, 256 MB-8 GB), (median over the held-out sizes, worst log's median)
FAMILY_TABLE = {
    "IB": ((0.09, 0.12), (0.09, 0.38), (0.03, 0.14)),
    "RoCE": ((0.04, 0.21), (0.05, 0.20), (0.04, 0.10)),
    "EFA": ((0.02, 0.02), (0.03, 0.03), (0.03, 0.03)),
}


def _family_per_log(family: str) -> list[dict[str, list[float]]]:
    """Per size class: held-out log -> its |busbw error| at each size there, under the family's network."""
    per_class: list[dict[str, list[float]]] = [{} for _ in CLASSES]
    for file, hw in FAMILIES[family]:
        for s in compare_with_model(indexed(file), hw).sizes:
            for k, (lo, hi) in enumerate(CLASSES):
                if lo <= s.size_bytes <= hi and s.rel_err is not None:
                    per_class[k].setdefault(file, []).append(abs(s.rel_err))
    return per_class


@pytest.mark.parametrize("family", sorted(FAMILY_TABLE))
def test_the_per_family_held_out_table_in_results(family):
    per_class = _family_per_log(family)
    for k, (median, worst_log) in enumerate(FAMILY_TABLE[family]):
        errs = [e for v in per_class[k].values() for e in v]
        got = (statistics.median(errs), max(statistics.median(v) for v in per_class[k].values()))
        assert got == pytest.approx((median, worst_log), abs=0.005), (family, k, got)
    # issue 17's bar (median <= 10 %, worst log <= 25 %) holds on the median in every class, and on the worst log in
    # every class but InfiniBand's 16-256 MB (38 %: a 10-node cluster's all_gather, which the data index flags as
    # doubtful; benchmarks/RESULTS.md, "Why InfiniBand's 16-256 MB worst log misses")
    assert all(m <= 0.10 for m, _ in FAMILY_TABLE[family])
    assert all(w <= 0.25 for k, (_, w) in enumerate(FAMILY_TABLE[family]) if (family, k) != ("IB", 1))


def _self_consistency(file: str, lo: int, hi: int) -> tuple[float, int]:
    """(median |in-place time / out-of-place time - 1|, times the measured time falls as the size doubles)."""
    rows = [r for r in indexed(file).rows if lo <= r.size_bytes <= hi]
    gaps = [abs(r.ip_time_us / r.oop_time_us - 1) for r in rows if r.ip_time_us]
    return statistics.median(gaps), sum(b.time_s < a.time_s for a, b in itertools.pairwise(rows))


def test_the_ib_cell_over_the_bar_is_a_log_that_disagrees_with_itself():
    """benchmarks/RESULTS.md, "Why InfiniBand's 16-256 MB worst log misses": the two held-out logs over 25 % at
    16-256 MB are the 10-node cluster's all_gather (38 %) and reduce_scatter (36 %). Both are flagged doubtful in the
    data index, are the only held-out IB logs whose time falls as the size doubles there, and their in-place and
    out-of-place times differ 8 % / 12 % (median), more than 3 x any other source's IB log; without the flagged logs
    the class's worst log is at 15 % (not the bar, which counts every log)."""
    lo, hi = CLASSES[1]
    per_log = {f: statistics.median(v) for f, v in _family_per_log("IB")[1].items()}
    over = {f for f, e in per_log.items() if e > 0.25}
    ten_node = {f"xxrjun_cluster01_h100_10node_g8_{c}.txt" for c in ("all_gather", "reduce_scatter")}
    assert over == ten_node and max(per_log.values()) == pytest.approx(0.38, abs=0.005), per_log
    assert all("doubtful" in INDEX[f] for f in over)
    consistency = {f: _self_consistency(f, lo, hi) for f in per_log}
    assert {f for f, (_, falls) in consistency.items() if falls} == ten_node, consistency
    other_sources = [gap for f, (gap, _) in consistency.items() if not f.startswith("xxrjun")]
    assert min(consistency[f][0] for f in ten_node) > 3 * max(other_sources), consistency
    kept = [statistics.median(v) for f, v in _family_per_log("IB")[1].items() if "doubtful" not in INDEX[f]]
    assert max(kept) == pytest.approx(0.15, abs=0.005), kept


# ------------------------------------------------------------------------ issue 36: the default network of a GPU
# the fitted network of each shipped GPU profile's usual fabric, or None where no fitted one is shipped: A100's HDR
# (one recent 2-node log, whose network fit ends on a bound: benchmarks/RESULTS.md), GB200 NVL72's scale-out network
# (a network fit to the CoreWeave racks is not physical: gb200-nvl72.toml), MI300X (no network fit), cpu-local;
# issue 38: H800 nodes carry 8 x 400G InfiniBand (DeepSeek, h800.toml); the H100 96 GB's fabric is not stated
# (RoCE or InfiniBand), the H100 NVL's is whatever its server holds, GB300 NVL72's is 800G (no shipped network)
DEFAULT_NETWORKS = {"h100-sxm": "ib-ndr-8x400", "h200-sxm": "ib-ndr-8x400", "b200": "ib-ndr-8x400",
                    "h800": "ib-ndr-8x400", "h100-sxm-96g": None, "h100-nvl": None, "gb300-nvl72": None,
                    "mi325x": None, "a100-sxm-80g": None, "gb200-nvl72": None, "mi300x": None,
                    "cpu-local": None}  # fmt: skip


def _network_fields(hw: hardware.Hardware) -> tuple:
    return hw.inter_node, hw.intra_node, tuple(p.inter_hop_latency_s for p in hw.protocols)


def test_each_gpu_profile_s_default_network_is_the_fitted_one_of_its_fabric(monkeypatch, tmp_path):
    monkeypatch.setenv("COMMSCHED_PROFILE_DIR", str(tmp_path))  # the shipped profiles, not a calibrated cpu-local
    assert set(DEFAULT_NETWORKS) == set(hardware.list_profiles())
    for gpu, network in DEFAULT_NETWORKS.items():
        default, own = hardware.get(gpu, num_nodes=4), hardware.get(f"{gpu}@nccl-defaults", num_nodes=4)
        assert default.name == gpu and own.name == f"{gpu}@nccl-defaults" and not own.inter_node.fitted
        assert (default.compute, default.gpus_per_node) == (own.compute, own.gpus_per_node)
        if network is None:  # no fitted network of its fabric: its own fields, and the warning across nodes
            assert _network_fields(default) == _network_fields(own), gpu
            assert hardware.network_warning(default) is not None, gpu
            continue
        fitted = hardware.get(f"{gpu}@{network}", num_nodes=4)
        assert default == dataclasses.replace(fitted, name=gpu), gpu  # PROFILE@NETWORK still names the same one
        assert default.inter_node.fitted and hardware.network_warning(default) is None, gpu
        assert _network_fields(default) != _network_fields(own), gpu


def test_with_no_network_named_a_multi_node_all_reduce_at_1_to_16_mb_is_the_fitted_network_s():
    """The issue: ``-H h100-sxm`` across nodes used NCCL's constants, several times too fast at 1-16 MB. Sized for
    a graph's world (``for_graph``), the default is the fitted network's time to the bit, and on the cluster it was
    fitted to (gj-aion, 2/4/8 nodes) it is within 5 % median at 1-16 MB where NCCL's constants are 50 %+ off."""
    from commsched.cost.collectives import plan_collective

    for world in (16, 32, 64, 256):
        default = hardware.for_graph("h100-sxm", world_size=world)
        fitted = hardware.for_graph("h100-sxm@ib-ndr-8x400", world_size=world)
        nccl = hardware.for_graph("h100-sxm@nccl-defaults", world_size=world)
        assert default.num_nodes == world // 8
        for nbytes in (1 << 20, 4 << 20, 16 << 20):
            t = plan_collective("all_reduce", nbytes, world, default).time_s
            assert t == plan_collective("all_reduce", nbytes, world, fitted).time_s
            assert t > 1.2 * plan_collective("all_reduce", nbytes, world, nccl).time_s, (world, nbytes)
    for nodes in (2, 4, 8):
        log = indexed(f"nccl_tests_issue309_h100_{nodes}node_ib_ar_gjaion.txt")
        errs = {hw: statistics.median(abs(s.rel_err) for s in compare_with_model(log, hw).sizes
                                      if CLASSES[0][0] <= s.size_bytes <= CLASSES[0][1])
                for hw in ("h100-sxm", "h100-sxm@nccl-defaults")}  # fmt: skip
        assert errs["h100-sxm"] <= 0.05 < 0.5 < errs["h100-sxm@nccl-defaults"], (nodes, errs)


def test_the_not_fitted_warning_is_one_line_across_nodes_only(tmp_path):
    a100 = hardware.get("a100-sxm-80g", num_nodes=4)
    line = hardware.network_warning(a100)
    assert line is not None and "\n" not in line and "a100-sxm-80g on 4 nodes" in line and "ib-ndr-8x400" in line
    assert hardware.network_warning(a100.with_nodes(1)) is None  # one node: NVLink only
    assert hardware.network_warning(hardware.get("h100-sxm@roce-8x400", num_nodes=4)) is None
    assert hardware.network_warning(hardware.get("h100-sxm@nccl-defaults", num_nodes=2)) is not None
    # a network file that does not say it was fitted (a hand-made one) warns; save_network keeps the fitted mark
    hand = tmp_path / "hand.toml"
    hand.write_text('name = "hand"\n[inter_node]\nnic_efficiency = 0.9\n')
    assert hardware.network_warning(hardware.get(f"h100-sxm@{hand}", num_nodes=2)) is not None
    saved = hardware.save_network(hardware.get("h100-sxm"), tmp_path / "copy.toml", description="copy")
    assert hardware.network_warning(hardware.get(f"a100-sxm-80g@{saved}", num_nodes=2)) is None

"""Collective times against public nccl-tests measurements, and the model's invariants.

References (also in /work/shared/reference/README.md): [azure-h100] Azure/AI-benchmarking-guide, ND H100 v5, NCCL
2.18.5, all_reduce busbw on 8 GPUs; [azure-a100] the same guide, ND A100 v4; [nt212/326] NVIDIA/nccl-tests issues
#212 and #326 (NVIDIA maintainers: ring all_reduce / all_gather / reduce_scatter ceiling ~360-370 GB/s on 8 H100);
[nt290] NVIDIA/nccl-tests #290 (46-48 GB/s per 400G NDR NIC); [gtc] NVIDIA GTC slides on multi-node NCCL
(DGX H100 8 x 400G ring all_reduce ~370-380 GB/s; DGX A100 8 x 200G 192 GB/s; all_to_all busbw 8 GPUs: A100 210,
H100 320, B200 640; 32 H100 across nodes 48 = one NIC).
"""

from __future__ import annotations

import dataclasses
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

import commsched
from commsched import hardware
from commsched.cost import LinkClass, collective_time_s, plan_collective
from commsched.cost.collectives import KINDS, bus_factor
from commsched.ir import CollType

MB = 1 << 20
H100_ALL_REDUCE_BUSBW = {MB: 43.7, 8 * MB: 172.1, 64 * MB: 361.8, 256 * MB: 423.4, 1024 * MB: 466.4, 8192 * MB: 478.9}
A100_ALL_REDUCE_BUSBW = {MB: 36.2, 8 * MB: 90.0, 64 * MB: 166.6, 256 * MB: 213.9, 1024 * MB: 228.1, 8192 * MB: 231.6}


def busbw_gbs(kind: str, nbytes: int, n: int, hw) -> float:
    return bus_factor(kind, n) * nbytes / collective_time_s(kind, nbytes, n, hw) / 1e9


@pytest.mark.parametrize(("nbytes", "ref"), sorted(H100_ALL_REDUCE_BUSBW.items()))
def test_h100_all_reduce_within_15_percent_from_1mb(nbytes, ref):
    got = busbw_gbs("all_reduce", nbytes, 8, hardware.get("h100-sxm"))
    assert got == pytest.approx(ref, rel=0.15), f"{nbytes} B: {got:.1f} vs {ref} GB/s [azure-h100]"


def test_h100_small_all_reduce_within_30_percent():
    # [azure-h100]: a 1 KB all_reduce takes about 25.6 us
    t = collective_time_s("all_reduce", 1024, 8, hardware.get("h100-sxm"))
    assert t == pytest.approx(25.6e-6, rel=0.30)


@pytest.mark.parametrize(("nbytes", "ref"), sorted(A100_ALL_REDUCE_BUSBW.items()))
def test_a100_all_reduce(nbytes, ref):
    got = busbw_gbs("all_reduce", nbytes, 8, hardware.get("a100-sxm-80g"))
    assert got == pytest.approx(ref, rel=0.15), f"{nbytes} B: {got:.1f} vs {ref} GB/s [azure-a100]"


@pytest.mark.parametrize("kind", ["all_gather", "reduce_scatter"])
def test_h100_ring_ceilings(kind):
    hw = hardware.get("h100-sxm")
    plan = plan_collective(kind, 4096 * MB, 8, hw)
    assert plan.algorithm == "ring"
    assert plan.bus_bandwidth_bytes_per_s / 1e9 == pytest.approx(365, rel=0.05)  # [nt212/326]
    # a forced ring all_reduce has the same ceiling; NVLS is what takes all_reduce past it
    assert busbw_gbs("all_reduce", 8192 * MB, 8, hw) > 1.2 * plan.bus_bandwidth_bytes_per_s / 1e9


@pytest.mark.parametrize("kind", ["all_reduce", "all_gather", "reduce_scatter"])
@pytest.mark.parametrize("nbytes", [1024 * MB, 4096 * MB])
def test_h100_four_nodes_large(kind, nbytes):
    """4 nodes x 8 H100 with 8 x 400G NDR: busbw bounded by the NICs, 8 x 46-48 GB/s = 368-384 ([nt290], [gtc])."""
    hw = hardware.get("h100-sxm", num_nodes=4)
    plan = plan_collective(kind, nbytes, 32, hw)
    assert plan.link == LinkClass.INTER_NODE
    assert plan.bus_bandwidth_bytes_per_s / 1e9 == pytest.approx(375, rel=0.20)


@pytest.mark.parametrize("nbytes", [64 * MB, 256 * MB])
def test_h100_four_nodes_from_64mb(nbytes):
    """At 64-256 MB the network ceiling is not reached yet: all_reduce on 4 nodes x 8 H100 measured 211 and 236 GB/s
    busbw (NVIDIA/nccl-tests#309, gj-aion's cluster; shipped with the package), 55-65 % of the ceiling; the model with
    the InfiniBand network fitted to that cluster is within 15 % / 20 % of that (256 MB is the fit's worst size,
    17 %, where the model moves from tree to NVLS-tree) (NCCL's constants, the GPU profile's own,
    are 20-60 % too fast there: benchmarks/RESULTS.md)."""
    from commsched.cost.nccl_tests import read_nccl_tests

    data = Path(commsched.__file__).parent / "cost" / "data" / "nccl_tests"
    (log,) = read_nccl_tests(data / "nccl_tests_issue309_h100_4node_ib_ar_gjaion.txt", collective="all_reduce")
    measured_s = next(r.time_s for r in log.rows if r.size_bytes == nbytes)
    measured = bus_factor("all_reduce", 32) * nbytes / measured_s / 1e9
    bw = busbw_gbs("all_reduce", nbytes, 32, hardware.get("h100-sxm@ib-ndr-8x400", num_nodes=4))
    assert bw == pytest.approx(measured, rel=0.15 if nbytes == 64 * MB else 0.2) and bw < 0.75 * 375


def test_a100_multi_node_endpoint():
    assert busbw_gbs("all_reduce", 4096 * MB, 32, hardware.get("a100-sxm-80g", num_nodes=4)) == pytest.approx(
        192, rel=0.2
    )  # [gtc]


@pytest.mark.parametrize(("profile", "ref"), [("a100-sxm-80g", 210), ("h100-sxm", 320), ("b200", 640)])
def test_all_to_all_in_a_node(profile, ref):
    assert busbw_gbs("all_to_all", 1024 * MB, 8, hardware.get(profile)) == pytest.approx(ref, rel=0.15)  # [gtc]


def test_all_to_all_across_nodes_is_one_nic():
    hw = hardware.get("h100-sxm", num_nodes=4)
    assert busbw_gbs("all_to_all", 1024 * MB, 32, hw) == pytest.approx(48, rel=0.2)  # [gtc]


def test_mesh_placement_inner_on_nvlink_outer_across_nodes():
    hw = hardware.get("h100-sxm", num_nodes=4)
    tp = plan_collective("all_reduce", 64 * MB, 8, hw, stride=1)
    fsdp = plan_collective("all_gather", 64 * MB, 4, hw, stride=8)
    assert tp.link == LinkClass.INTRA_NODE and (tp.ranks_per_node, tp.nodes) == (8, 1)
    assert fsdp.link == LinkClass.INTER_NODE and (fsdp.ranks_per_node, fsdp.nodes) == (1, 4)
    # one rank per node owns one NIC: far slower than NVLink for the same bytes
    assert fsdp.time_s > 5 * plan_collective("all_gather", 64 * MB, 4, hw, stride=1).time_s


def test_multi_node_algorithms_are_considered():
    hw = hardware.get("h100-sxm", num_nodes=16)
    algos = {plan_collective("all_reduce", s, 128, hw).algorithm for s in (1 << 12, 1 << 20, 1 << 26, 1 << 32)}
    assert len(algos) >= 2 and algos <= {"ring", "tree", "nvls_tree", "hierarchical"}


def test_group_larger_than_cluster_is_an_error():
    with pytest.raises(ValueError, match=r"spans 4 nodes.*num_nodes=1.*--num-nodes 4"):
        collective_time_s("all_reduce", MB, 32, hardware.get("h100-sxm"))
    with pytest.raises(ValueError, match=r"unknown collective kind 'allfoo'"):
        collective_time_s("allfoo", MB, 8, hardware.get("h100-sxm"))


def test_trivial_collectives_cost_nothing():
    hw = hardware.get("h100-sxm")
    assert collective_time_s("all_reduce", MB, 1, hw) == 0.0
    assert collective_time_s("all_gather", 0, 8, hw) == 0.0
    assert collective_time_s(CollType.BROADCAST, MB, 8, hw) > 0


_profiles = st.sampled_from(["h100-sxm", "a100-sxm-80g", "b200", "gb200-nvl72", "mi300x", "h200-sxm"])


@given(
    _profiles,
    st.sampled_from(KINDS),
    st.sampled_from([2, 4, 8, 16, 64, 256]),
    st.sampled_from([1, 2, 8]),
    st.integers(1, 1 << 33),
    st.integers(1, 1 << 20),
)
def test_time_grows_with_bytes_and_latency_is_a_part(profile, kind, size, stride, nbytes, extra):
    hw = hardware.get(profile, num_nodes=256)
    a = plan_collective(kind, nbytes, size, hw, stride=stride)
    b = plan_collective(kind, nbytes + extra, size, hw, stride=stride)
    assert 0 < a.time_s <= b.time_s
    assert 0 <= a.latency_s <= a.time_s
    assert a.link == (LinkClass.INTER_NODE if a.nodes > 1 else LinkClass.INTRA_NODE)
    # the busbw never beats the fastest fabric the profile has: NVLS moves nvls_efficiency x the link per GPU, and
    # an all_reduce's busbw is 2 (n - 1) / n of what each GPU moves (1.75 at 8 ranks, 1.875 at 16)
    factor = 2 * (size - 1) / size if kind == "all_reduce" else 1.75
    ceiling = max(hw.intra_node.link_bandwidth_bytes_per_s * max(1.0, factor * hw.intra_node.nvls_efficiency), 1)
    assert a.bus_bandwidth_bytes_per_s <= ceiling * 1.0001


@given(_profiles, st.sampled_from(["all_reduce", "all_gather"]), st.integers(1 << 10, 1 << 32))
def test_crossing_nodes_never_faster(profile, kind, nbytes):
    hw = hardware.get(profile, num_nodes=2)
    inside = plan_collective(kind, nbytes, 8, hw)
    across = plan_collective(kind, nbytes, 16, hw)
    assert across.time_s >= inside.time_s * 0.999


@settings(max_examples=60, deadline=None)
@given(
    st.sampled_from(["h100-sxm", "a100-sxm-80g", "b200", "mi300x"]),
    st.sampled_from([1, 2, 4, 16]),
    st.sampled_from(["all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast"]),
    st.sampled_from([2, 8, 16, 64]),
    st.sampled_from([1, 2, 8]),
    st.lists(st.integers(0, 1 << 36), min_size=1, max_size=20),
)
def test_vectorised_times_equal_the_planner_bit_for_bit(profile, nodes, kind, n, stride, sizes):
    """``collective_times_s`` (a plan search's many sizes at once) is ``plan_collective`` bit for bit."""
    import numpy as np

    from commsched.cost.collectives import collective_times_s

    hw = hardware.get(profile, num_nodes=nodes)
    if hw.placement(n, stride)[1] > nodes:
        return  # the group does not fit this cluster (the planner says so; covered elsewhere)
    got = collective_times_s(kind, np.array(sizes), n, hw, stride=stride)
    want = [plan_collective(kind, s, n, hw, stride=stride).time_s for s in sizes]
    assert got.tolist() == want


def test_all_to_all_across_ten_nodes_posts_every_peer_at_once():
    """The public 10-node all_to_all (80 H100, xxrjun cluster01; shipped with the package): the model is within 10 %
    median from 32 MB up. Every peer's send is posted at once, so the latency is one network step plus a small cost
    per peer, not n - 1 network steps in a row (which made it 11 % off here, and far worse with slower steps). Under
    the default network (ib-ndr-8x400, fitted on all_reduce only: NIC efficiency 0.833) the model runs 18 % slow
    here; NCCL's constants (0.94 of line rate) are the ones within 10 %."""
    import dataclasses

    from commsched.cost.nccl_tests import compare_with_model, read_nccl_tests

    data = Path(commsched.__file__).parent / "cost" / "data" / "nccl_tests"
    (log,) = read_nccl_tests(data / "xxrjun_cluster01_h100_10node_g8_alltoall.txt", collective="all_to_all")
    log = dataclasses.replace(log, nranks=80, nodes=10, ranks_per_host=(8,) * 10)
    assert compare_with_model(log, "h100-sxm@nccl-defaults").median_abs_err < 0.10
    assert 0.15 < compare_with_model(log, "h100-sxm").median_abs_err < 0.20
    hw = hardware.get("h100-sxm", num_nodes=128)
    fastest_step_s = min(p.inter_hop_latency_s for p in hw.protocols)
    assert collective_time_s("all_to_all", MB, 1024, hw) < 1023 * fastest_step_s  # not 1023 network steps


def test_sendrecv_is_one_link_per_pair():
    """nccl-tests' sendrecv_perf (each rank to the next): one NVLink link in a node, one NIC across nodes. Against the
    public 1-node H100 log (xxrjun cluster01, shipped) the large sizes are within 5 % (367 GB/s measured)."""
    import dataclasses

    from commsched.cost.nccl_tests import compare_with_model, read_nccl_tests

    data = Path(commsched.__file__).parent / "cost" / "data" / "nccl_tests"
    (log,) = read_nccl_tests(data / "xxrjun_cluster01_h100_1node_g8_sendrecv.txt", collective="sendrecv")
    log = dataclasses.replace(log, nranks=8, nodes=1, ranks_per_host=(8,))
    big = [s for s in compare_with_model(log, "h100-sxm").sizes if s.size_bytes >= 512 * MB]
    assert big and all(abs(s.rel_err) < 0.05 for s in big)
    hw = hardware.get("h100-sxm", num_nodes=2)
    across = plan_collective("sendrecv", 1 << 30, 16, hw)
    assert across.algorithm == "p2p" and across.link == LinkClass.INTER_NODE
    nic = hw.inter_node.nic_bandwidth_bytes_per_s * hw.inter_node.nic_efficiency
    assert across.bus_bandwidth_bytes_per_s == pytest.approx(nic, rel=0.02)


def test_the_gpu_profiles_as_shipped_keep_their_collective_times():
    """The GPU profiles' own network fields (``@nccl-defaults``, NCCL's constants; the default before issue 36 moved
    it to the fitted network): 240 plans (h100-sxm, b200, a100-sxm-80g at 2-16 nodes; all_reduce, all_gather,
    reduce_scatter, all_to_all; 1 MB-2 GB) hash to the same bits as on main before the network profiles learned
    NVLS-tree's pace and the two-children tree (branch netfit3)."""
    import hashlib
    import struct

    times = []
    for profile in ("h100-sxm", "b200", "a100-sxm-80g"):
        for nodes in (2, 4, 8, 16):
            hw = hardware.get(f"{profile}@nccl-defaults", num_nodes=nodes)
            for kind in ("all_reduce", "all_gather", "reduce_scatter", "all_to_all"):
                for nbytes in (1 << 20, 4 << 20, 32 << 20, 256 << 20, 2 << 30):
                    times.append(plan_collective(kind, nbytes, 8 * nodes, hw).time_s)
    digest = hashlib.sha256(b"".join(struct.pack("<d", t) for t in times)).hexdigest()
    assert digest == "fa3c8e12d8255fe65a901b1396996a78952488ce10c1d03aa10545aa2dca27aa"


def test_a_tree_level_below_the_root_costs_two_network_steps_under_the_shipped_networks():
    """NCCL's binary tree across nodes gives the root one child and every other inner node two (trees.cc): under a
    shipped network profile the tree pays 1, 3, 5 network steps one way at 2, 4, 8 nodes; the GPU profiles' own
    network keeps NCCL's tuning model, log2(nodes) = 1, 2, 3. A 2-node tree is the same either way."""
    from commsched.cost.collectives import tree_network_steps

    for network in hardware.list_networks():
        hw = hardware.get(f"h100-sxm@{network}")
        assert [tree_network_steps(hw, n) for n in (1, 2, 4, 8, 10)] == [0, 1, 3, 5, 7], network
    own = hardware.get("h100-sxm@nccl-defaults")
    assert [tree_network_steps(own, n) for n in (1, 2, 4, 8, 10)] == [0, 1, 2, 3, 4]
    two, four = (hardware.get("h100-sxm@ib-ndr-8x400", num_nodes=n) for n in (2, 4))
    flat = dataclasses.replace(four, inter_node=dataclasses.replace(four.inter_node, tree_two_children=False))
    tree = [plan_collective("all_reduce", 8 << 20, 32, hw) for hw in (four, flat)]
    assert tree[0].algorithm == tree[1].algorithm == "tree" and tree[0].latency_s > tree[1].latency_s
    assert plan_collective("all_reduce", 8 << 20, 16, two).algorithm == "tree"

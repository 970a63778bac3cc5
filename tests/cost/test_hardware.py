"""Hardware profiles: the shipped files load and are cited, the placement rule, strict errors, user precedence."""

from __future__ import annotations

import dataclasses
import re
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from commsched import hardware
from commsched.hardware import Hardware, hardware_to_dict, load_profile, save_profile, shipped_profile

SHIPPED = ("h100-sxm", "h100-sxm-96g", "h100-nvl", "h800", "h200-sxm", "a100-sxm-80g", "b200", "gb200-nvl72",
           "gb300-nvl72", "mi300x", "mi325x", "cpu-local")  # fmt: skip


@pytest.fixture(autouse=True)
def _isolated_profiles(tmp_path, monkeypatch):
    monkeypatch.setenv("COMMSCHED_PROFILE_DIR", str(tmp_path / "user-profiles"))


@pytest.mark.parametrize("name", SHIPPED)
def test_shipped_profiles_load(name):
    hw = hardware.get(name)
    assert isinstance(hw, Hardware) and hw.name == name and hw.num_nodes == 1
    assert hw.compute.peak_flops_for("float32") > 0
    assert any(p.name == "simple" for p in hw.protocols)
    assert hardware.get(name, num_nodes=4, gpus_per_node=4).world_size == 16


def test_every_shipped_profile_is_tested():
    """SHIPPED is the package's whole list: a new profile file is loaded and checked by the tests below."""
    assert set(SHIPPED) == set(hardware.list_profiles())  # the user folder is empty here (_isolated_profiles)


@pytest.mark.parametrize("name", [n for n in SHIPPED if n != "cpu-local"])
def test_every_number_cites_a_source(name):
    """Each numeric line of a GPU profile carries a comment (its source, or 'assumed'/'fit' with the reason)."""
    text = shipped_profile(name).read_text()
    for line in text.splitlines():
        if re.match(r"^\s*[a-z0-9_]+\s*=\s*[-\d\[]", line):
            assert "#" in line, f"{name}: uncited number: {line!r}"


def test_public_datasheet_numbers():
    h100 = hardware.get("h100-sxm")
    assert h100.compute.peak_flops_for("bfloat16") == pytest.approx(989e12)
    assert h100.compute.hbm_bandwidth_bytes_per_s == pytest.approx(3.35e12)
    assert h100.intra_node.link_bandwidth_bytes_per_s == pytest.approx(450e9)
    assert h100.inter_node.nic_bandwidth_bytes_per_s == pytest.approx(50e9)
    assert h100.intra_node.nvls and not hardware.get("a100-sxm-80g").intra_node.nvls
    assert hardware.get("h200-sxm").compute.hbm_capacity_bytes == pytest.approx(141e9)
    # unknown dtypes fall back to the float32 entry
    assert h100.compute.peak_flops_for("int64") == h100.compute.peak_flops_for("float32")


@pytest.mark.parametrize(
    ("size", "stride", "expected"),
    [
        (8, 1, (8, 1)),  # TP inside a node
        (4, 1, (4, 1)),
        (32, 1, (8, 4)),  # contiguous ranks over 4 nodes
        (4, 8, (1, 4)),  # the outer dimension of a (4, 8) mesh: one rank per node
        (16, 2, (4, 4)),  # stride 2: 4 of the group's ranks in each node
        (2, 4, (2, 1)),  # 2 ranks 4 apart still fit in one node of 8
        (1, 1, (1, 1)),
    ],
)
def test_placement_rule(size, stride, expected):
    assert hardware.get("h100-sxm", num_nodes=8).placement(size, stride) == expected


@given(st.integers(1, 512), st.sampled_from([1, 2, 4, 8, 16, 64]), st.sampled_from([1, 2, 4, 8]))
def test_placement_properties(size, stride, gpn):
    hw = hardware.get("h100-sxm").with_nodes(1, gpn)
    per_node, nodes = hw.placement(size, stride)
    assert 1 <= per_node <= min(size, gpn)
    assert per_node * nodes >= size  # every rank is placed
    assert (nodes > 1) == (size > 1 and size * stride > gpn)


def test_save_load_round_trip(tmp_path):
    hw = hardware.get("h100-sxm")
    path = save_profile(hw, tmp_path / "copy.toml", header="a copy\nfor the test")
    again = load_profile(path)
    assert hardware_to_dict(again) == hardware_to_dict(hw)
    assert path.read_text().startswith("# a copy\n# for the test\n")


def _write(tmp_path: Path, text: str) -> Path:
    p = tmp_path / "bad.toml"
    p.write_text(text)
    return p


@pytest.mark.parametrize(
    ("edit", "message"),
    [
        (lambda s: s.replace("num_units = 132", "num_units = 132\nwarp_size = 32"), "unknown key(s) 'warp_size'"),
        (lambda s: s.replace("hbm_tb_per_s = 3.35", "hbm_tb_per_s = -1.0"), "hbm_tb_per_s = -1.0"),
        (lambda s: s.replace("ring_efficiency = 0.81", "ring_efficiency = 1.5"), "ring_efficiency = 1.5"),
        (lambda s: s.replace("gpus_per_node = 8", 'gpus_per_node = "eight"'), "gpus_per_node = 'eight'"),
        (lambda s: s.replace("[protocols.simple]", "[protocols.fast]"), "unknown protocol 'fast'"),
        (lambda s: s.replace("nvls = true", "nvls = 1"), "nvls = 1: expected true or false"),
        (lambda s: s.replace("link_gb_per_s = 450.0", ""), "missing key 'link_gb_per_s'"),
        (lambda s: s + "\n[[broken", "not valid TOML"),
    ],
)
def test_bad_profiles_name_file_and_key(tmp_path, edit, message):
    path = _write(tmp_path, edit(shipped_profile("h100-sxm").read_text()))
    with pytest.raises(ValueError) as exc:
        load_profile(path)
    assert str(path) in str(exc.value) and message in str(exc.value)


def test_unknown_profile_lists_known_ones():
    with pytest.raises(FileNotFoundError, match=r"unknown hardware profile 'h900'.*h100-sxm"):
        hardware.get("h900")
    with pytest.raises(FileNotFoundError, match="does not exist"):
        hardware.get("/nonexistent/profile.toml")


def test_user_profile_shadows_shipped(tmp_path):
    shipped = hardware.get("cpu-local")
    mine = dataclasses.replace(shipped, description="calibrated here", stream_sync_s=7e-6)
    save_profile(mine, hardware.user_profile_dir() / "cpu-local.toml")
    found = hardware.get("cpu-local")
    assert found.description == "calibrated here" and found.stream_sync_s == pytest.approx(7e-6)
    assert hardware.list_profiles()["cpu-local"].parent == hardware.user_profile_dir()
    # by path works too, and num_nodes is applied on top
    assert hardware.get(str(hardware.user_profile_dir() / "cpu-local.toml"), num_nodes=3).num_nodes == 3


def test_bad_cluster_shape():
    with pytest.raises(ValueError, match="num_nodes=0"):
        hardware.get("h100-sxm", num_nodes=0)


def test_nodes_for_world():
    assert [hardware.nodes_for_world(w, 8) for w in (1, 8, 9, 64, 65)] == [1, 1, 2, 8, 9]
    assert hardware.nodes_for_world(64, 4) == 16
    with pytest.raises(ValueError, match="world_size=0"):
        hardware.nodes_for_world(0, 8)


def _graph_with_groups(*groups: tuple[int, int], meta: dict | None = None):
    """What the world size is read from: the graph's meta and its process groups (size, stride)."""
    from types import SimpleNamespace

    from commsched.ir import ProcessGroup

    return SimpleNamespace(meta=meta or {}, groups=[ProcessGroup(f"g{k}", *sg) for k, sg in enumerate(groups)])


def test_world_size_of_a_graph():
    assert hardware.world_size_of(_graph_with_groups()) is None
    assert hardware.world_size_of(_graph_with_groups((16, 1))) == 16
    assert hardware.world_size_of(_graph_with_groups((8, 1), (4, 8))) == 32  # a 2-D mesh: the outer group spans it
    assert hardware.world_size_of(_graph_with_groups((8, 1), meta={"world_size": 64})) == 64  # the trace says


def test_for_graph_infers_nodes_from_the_world_size():
    g = _graph_with_groups((8, 1), (4, 8))  # world 32
    assert hardware.for_graph("h100-sxm", g).num_nodes == 4
    assert hardware.for_graph("h100-sxm", g, gpus_per_node=4).num_nodes == 8
    assert hardware.for_graph("h100-sxm", g, num_nodes=6).num_nodes == 6  # given: used as is
    assert hardware.for_graph("h100-sxm").num_nodes == 1
    assert hardware.for_graph("h100-sxm", world_size=65).num_nodes == 9
    assert hardware.for_graph(str(shipped_profile("b200")), g).num_nodes == 4  # a path, like a name
    given_hw = hardware.get("h100-sxm", num_nodes=2)
    assert hardware.for_graph(given_hw, g) is given_hw  # a Hardware is used as given...
    assert hardware.for_graph(given_hw, g, num_nodes=5).num_nodes == 5  # ...reshaped only by what is given
    with pytest.raises(TypeError, match="expected a profile name"):
        hardware.for_graph(3, g)


# ------------------------------------------------------------------------------------------ network profiles
def test_a_network_profile_replaces_only_the_inter_node_fields():
    from commsched.cost import plan_collective

    base = hardware.get("a100-sxm-80g", num_nodes=4)
    ib = hardware.get("a100-sxm-80g@ib-ndr-8x400", num_nodes=4)
    assert ib == hardware.get("a100-sxm-80g", num_nodes=4, network="ib-ndr-8x400")
    assert ib.name == "a100-sxm-80g@ib-ndr-8x400" and ib.num_nodes == 4
    assert ib.inter_node.nic_bandwidth_bytes_per_s == 2 * base.inter_node.nic_bandwidth_bytes_per_s  # NDR vs HDR
    assert (ib.compute, ib.intra_node, ib.gpus_per_node) == (base.compute, base.intra_node, base.gpus_per_node)
    assert [p.base_latency_s for p in ib.protocols] == [p.base_latency_s for p in base.protocols]

    # across nodes the collective changes; inside one node it does not
    def t(hw, n):
        return plan_collective("all_reduce", 1 << 30, n, hw).time_s

    assert t(ib, 32) < t(base, 32) and t(ib, 8) == t(base, 8)


def test_the_shipped_ib_network_is_the_h100_profile_s_links_with_fitted_constants():
    """Same NICs as the H100 profile's own network; the efficiency and step latencies are the fit's (slower)."""
    fitted, own = hardware.get("h100-sxm@ib-ndr-8x400"), hardware.get("h100-sxm@nccl-defaults")
    assert fitted.inter_node.nics_per_node == own.inter_node.nics_per_node
    assert fitted.inter_node.nic_bandwidth_bytes_per_s == own.inter_node.nic_bandwidth_bytes_per_s
    assert fitted.inter_node.nic_efficiency < own.inter_node.nic_efficiency
    assert all(f.inter_hop_latency_s > o.inter_hop_latency_s for f, o in zip(fitted.protocols, own.protocols))
    assert "ib-ndr-8x400" in hardware.list_networks()


def test_a_saved_profile_keeps_the_network_it_was_saved_with(tmp_path):
    """Issue 36: ``get`` puts a profile's ``default_network`` under it once. A profile saved from that result holds
    the network's fields and no default (loading it does not put the network under it again, nor under a network
    given with ``@``: a fit written by ``calibrate --fit`` keeps its fields); a profile saved as loaded from its file
    keeps its default network."""
    h100 = hardware.get("h100-sxm", num_nodes=2)
    assert h100.default_network == "" and load_profile(shipped_profile("h100-sxm")).default_network == "ib-ndr-8x400"
    saved = save_profile(h100, tmp_path / "mine.toml")
    assert "default_network" not in saved.read_text()
    again = hardware.get(str(saved), num_nodes=2)
    assert (again.inter_node, again.protocols, again.intra_node) == (h100.inter_node, h100.protocols, h100.intra_node)
    efa = save_profile(hardware.get("h100-sxm@efa-p5"), tmp_path / "efa.toml")
    assert hardware.get(str(efa)).inter_node == hardware.get("h100-sxm@efa-p5").inter_node  # not ib-ndr-8x400's
    raw = save_profile(load_profile(shipped_profile("b200")), tmp_path / "raw.toml")
    assert hardware.get(str(raw)).inter_node == hardware.get("b200").inter_node  # its default network applied
    bad = _write(tmp_path, shipped_profile("h100-sxm").read_text().replace('"ib-ndr-8x400"', '"ib-xdr"'))
    with pytest.raises(FileNotFoundError, match=r"bad.toml: default_network: unknown network profile 'ib-xdr'"):
        hardware.get(str(bad))
    assert hardware.get(f"{bad}@nccl-defaults").inter_node == hardware.get("h100-sxm@nccl-defaults").inter_node


def test_bad_network_profiles_give_one_line_naming_the_file(tmp_path):
    with pytest.raises(FileNotFoundError, match="unknown network profile 'nope'"):
        hardware.get("h100-sxm@nope")
    bad = tmp_path / "net.toml"
    bad.write_text('name = "x"\n[compute]\nnum_units = 1\n')
    with pytest.raises(ValueError, match=r"net.toml: unexpected key 'compute'"):
        hardware.get("h100-sxm", network=str(bad))
    bad.write_text('name = "x"\n[protocols.ll]\nbase_latency_us = 1.0\n')
    with pytest.raises(ValueError, match=r"\[protocols.ll\]: expected a protocol .* with only inter_hop_us"):
        hardware.get("h100-sxm", network=str(bad))
    bad.write_text('name = "x"\n[intra_node]\nring_efficiency = 0.5\n')
    with pytest.raises(ValueError, match=r"\[intra_node\]: a network profile may only set nvls_tree_efficiency"):
        hardware.get("h100-sxm", network=str(bad))
    bad.write_text('name = "x"\n[intra_node]\nnvls_tree_efficiency = 0.8\n')
    assert hardware.get("h100-sxm", network=str(bad)).intra_node.nvls_tree_efficiency == 0.8
    assert hardware.get("a100-sxm-80g", network=str(bad)).intra_node == hardware.get("a100-sxm-80g").intra_node
    bad.write_text('name = "x"\n[inter_node]\nnic_efficiency = 3.0\n')
    with pytest.raises(ValueError, match="nic_efficiency"):
        hardware.get("h100-sxm", network=str(bad))

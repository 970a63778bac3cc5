"""The public API's one way in: the same hardware arguments for schedule / simulate / estimate_costs, pass and
preset names resolved in one place, and knobs checked (names, types, allowed values) before any work."""

from __future__ import annotations

import numpy as np
import pytest

import commsched
from commsched import hardware
from commsched.cost import estimate_costs
from programs import trace_program


@pytest.fixture(scope="module")
def graph16():
    _, g = trace_program("fsdp_mlp", 16, layers=2, dim=256)  # 16 ranks: two nodes of 8 GPUs
    return g


def test_same_hardware_arguments_everywhere(graph16):
    g = graph16
    explicit = estimate_costs(g, hardware.get("h100-sxm", num_nodes=2))
    inferred = estimate_costs(g, "h100-sxm")  # nodes from the world size
    assert inferred.meta["num_nodes"] == 2
    np.testing.assert_array_equal(explicit.node_s, inferred.node_s)
    s = commsched.schedule(g, "h100-sxm", "default", num_nodes=2)
    assert np.array_equal(s.order, commsched.schedule(g, explicit, "default").order)
    assert np.array_equal(s.order, commsched.schedule(g, "h100-sxm", "default").order)
    r = commsched.simulate(g, "h100-sxm", s.order, num_nodes=2)
    assert r.makespan_ns == commsched.simulate_costs(g, explicit, s.order).makespan_ns
    assert commsched.simulate(g, explicit, s.order).makespan_ns == r.makespan_ns  # a CostEstimate, as schedule
    four_per_node = estimate_costs(g, hardware.get("h100-sxm", num_nodes=4, gpus_per_node=4)).node_s
    np.testing.assert_array_equal(commsched.estimate(g, "h100-sxm", gpus_per_node=4), four_per_node)


def test_hardware_argument_errors(graph16):
    g = graph16
    with pytest.raises(ValueError, match="spans 2 nodes"):
        commsched.schedule(g, "h100-sxm", num_nodes=1)
    with pytest.raises(ValueError, match="a CostEstimate is already estimated"):
        commsched.schedule(g, estimate_costs(g, "h100-sxm"), num_nodes=2)
    with pytest.raises(FileNotFoundError, match="unknown hardware profile 'h900'"):
        commsched.simulate(g, "h900")


def test_pass_and_preset_resolution():
    from commsched.passes import PRESETS, resolve_passes

    assert resolve_passes("default") == ["overlap"] == resolve_passes(["default"])
    assert resolve_passes("torch") == resolve_passes(["torch"]) == PRESETS["torch"]  # a preset inside a list too
    assert resolve_passes("sink_waits, raise_comms") == ["sink_waits", "raise_comms"]
    assert resolve_passes(["decide_global_ordering_of_comms", "default"]) == [
        "decide_global_ordering_of_comms",
        "overlap",
    ]
    assert resolve_passes("none") == [] == resolve_passes("")
    custom = resolve_passes  # any callable is kept as is
    assert resolve_passes(["default", custom]) == ["overlap", custom]
    with pytest.raises(ValueError, match=r"unknown pass 'nope'; known passes: \[.*'overlap'.*presets: \[.*'torch'"):
        resolve_passes("overlap,nope")


def test_default_passes_are_ours(graph16):
    costs = estimate_costs(graph16, "h100-sxm")
    s = commsched.schedule(graph16, costs)
    assert s.passes == ["overlap"]
    assert np.array_equal(s.order, commsched.schedule(graph16, costs, "default").order)

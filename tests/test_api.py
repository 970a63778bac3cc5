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

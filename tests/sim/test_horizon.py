"""Issue 20 item 1: time never overflows. A step that could pass the simulator's horizon (a tiny bandwidth, huge
sizes or durations) is an error naming the node, raised before any loop runs, never a hang or a wrapped time."""

from __future__ import annotations

import time

import numpy as np
import pytest

from commsched.cost import CostEstimate
from commsched.frontends.json_io import save_graph
from commsched.sim import simulate, simulate_costs
from commsched.sim.model import HORIZON_NS
from hostile import assert_user_error, profile_dict, small_graph, write_profile


def _costs(g, coll_s: float, kernel_s: float = 1e-3, **kw) -> CostEstimate:
    is_coll = g.coll_type >= 0
    timed = np.isin(g.kinds, (1, 5))
    return CostEstimate.from_times(np.where(is_coll, coll_s, np.where(timed, kernel_s, 0.0)), **kw)


@pytest.mark.parametrize("coll_s", [1e9, 4e9, 1e10, 1e15, 1e300])
@pytest.mark.parametrize("streams", [None, "two"])
def test_beyond_horizon_is_an_error_not_a_hang(coll_s, streams):
    g = small_graph()
    st = None if streams is None else np.arange(len(g)) % 2
    t0 = time.perf_counter()
    with pytest.raises(ValueError, match=r"node 'ar' takes .* expected a step under"):
        simulate_costs(g, _costs(g, coll_s, compute_slowdown=2.0, comm_slowdown=3.0), streams=st)
    assert time.perf_counter() - t0 < 2.0


def test_slowdowns_and_syncs_count_toward_the_horizon():
    g = small_graph()
    just_under = HORIZON_NS * 1e-9 / 2.5  # alone it fits; at comm_slowdown 3 it could not
    simulate_costs(g, _costs(g, just_under))
    with pytest.raises(ValueError, match="expected a step under"):
        simulate_costs(g, _costs(g, just_under, comm_slowdown=3.0))
    with pytest.raises(ValueError, match=r"stream_sync_s=9.01e\+06"):
        simulate_costs(g, _costs(g, 1e-3, stream_sync_s=HORIZON_NS * 1e-9))


def test_close_to_horizon_times_are_exact():
    g = small_graph()
    coll_s = HORIZON_NS * 1e-9 / 4
    res = simulate_costs(g, _costs(g, coll_s))
    assert res.makespan_ns == res.standalone_ns.sum()  # nothing overlaps the all_reduce: the sum, to the ns
    assert all(0 <= u <= 1 for u in res.stream_utilization.values())


@pytest.mark.parametrize("field", ["nan", "inf", "-1"])
def test_cost_estimate_rejects_impossible_factors(field):
    g = small_graph()
    with pytest.raises(ValueError, match="comm_slowdown"):
        _costs(g, 1e-3, comm_slowdown=float(field))
    with pytest.raises(ValueError, match="stream_sync_s"):
        _costs(g, 1e-3, stream_sync_s=float(field))


def test_tiny_bandwidth_profile_fails_in_library_and_cli(tmp_path):
    data = profile_dict()
    data["intra_node"]["link_gb_per_s"] = 1e-15  # below the profile's range: refused at load
    with pytest.raises(ValueError, match=r"link_gb_per_s = 1e-15: expected a positive number >= 1e-12"):
        simulate(small_graph(), str(write_profile(tmp_path / "slower.toml", data)))
    data["intra_node"]["link_gb_per_s"] = 1e-9  # 1 B/s: in range, but 2^40 bytes take longer than the horizon
    data["protocols"]["simple"].pop("max_bus_gb_per_s", None)
    prof = write_profile(tmp_path / "slow.toml", data)
    g = small_graph(nbytes=1 << 40)
    with pytest.raises(ValueError, match="node 'ar'"):
        simulate(g, str(prof))
    save_graph(g, tmp_path / "g.json")
    assert_user_error(["simulate", str(tmp_path / "g.json"), "--hardware", str(prof)], "node 'ar'", "expected a step")

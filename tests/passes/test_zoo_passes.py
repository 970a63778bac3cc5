"""Every registered pass on every zoo parallelism and mode returns a valid, SPMD-safe schedule."""

from __future__ import annotations

import numpy as np
import pytest

from commsched.cost import estimate_costs
from commsched.hardware import get
from commsched.ir.order import collective_chains
from commsched.passes import PASSES, check_schedule, schedule
from commsched.sim import simulate_costs
from commsched.workloads import build

WORKLOADS = [
    ("llama-tiny", "fsdp", "train"),
    ("llama-tiny", "ddp", "train"),
    ("llama-tiny", "tp", "train"),
    ("llama-tiny", "tp+sp", "train"),
    ("llama-tiny", "fsdp+tp", "train"),
    ("llama-tiny", "tp", "decode"),
    ("llama-tiny", "tp+sp", "prefill"),
    ("mixtral-tiny", "ep", "train"),
    ("mixtral-tiny", "ep", "decode"),
]


@pytest.fixture(scope="module", params=WORKLOADS, ids=lambda w: "-".join(w))
def workload(request):
    preset, parallel, mode = request.param
    g = build(preset, parallel=parallel, world_size=8, layers=1, mode=mode).graph
    return g, estimate_costs(g, get("h100-sxm"))


# "framework" is a reference, not a scheduler: it reorders FSDP's collectives as FSDP2's streams do (test_framework.py)
@pytest.mark.parametrize("name", sorted(p for p in PASSES if p not in ("exact", "framework")))
def test_pass_on_zoo_workload(workload, name):
    g, costs = workload
    s = schedule(g, costs, [name])
    check_schedule(g, s.order, streams=s.streams)
    a, b = collective_chains(g, np.arange(len(g), dtype=np.int32)), collective_chains(g, s.order)
    assert all(np.array_equal(a[k], b[k]) for k in a)
    if name in ("overlap", "multi_stream"):
        # never worse than the input in simulation
        assert simulate_costs(g, costs, s.order, s.streams).makespan_ns <= simulate_costs(g, costs).makespan_ns


def test_overlap_reordering_on_zoo_workloads(workload):
    g, costs = workload
    s = schedule(g, costs, "default", reorder_collectives=True)
    check_schedule(g, s.order, allow_collective_reorder=True)
    base = simulate_costs(g, costs)
    res = simulate_costs(g, costs, s.order)
    assert res.makespan_ns <= base.makespan_ns
    assert res.peak_memory_bytes <= int(base.peak_memory_bytes * 1.05)

"""Bucketing: the plan's rules and caps, and the FX rewrite's validity and exactness on random and zoo programs."""

from __future__ import annotations

import random

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from random_programs import programs, random_topological_order

from commsched import hardware
from commsched.cost import collective_time_s, plan_collective
from commsched.cost.collectives import bus_factor
from commsched.frontends.fake_pg import fake_process_group
from commsched.frontends.fx import from_fx
from commsched.rewrites import BucketConfig, apply_bucket_plan, bucket_cap_bytes, plan_buckets, run_spmd
from commsched.rewrites.bucket_plan import BUCKETABLE

H100 = hardware.get("h100-sxm", num_nodes=2)


def _identical(a, b) -> bool:
    return all(torch.equal(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def _check_plan(graph, plan):
    colls = {graph.names[c] for c in graph.collectives.tolist() if graph.targets[c] in BUCKETABLE}
    members = [m for b in plan.buckets for m in b.members]
    assert sorted(members) == sorted(colls), "every eligible collective is in exactly one bucket"
    for b in plan.merged:
        ids = [graph.id_of(m) for m in b.members]
        assert len({int(graph.coll_group[i]) for i in ids}) == 1
        assert len({graph.targets[i] for i in ids}) == 1
        assert len({graph.buf_dtype[int(graph.buf_ptr[i])] for i in ids}) == 1
        assert b.nbytes <= b.cap_bytes
        assert b.time_s < b.members_time_s  # one latency instead of several


@settings(max_examples=40)
@given(programs(), st.integers(0, 2**16), st.sampled_from([None, 64, 256, 4096]), st.booleans(), st.booleans())
def test_bucketing_random_programs_keeps_outputs_bit_identical(program, seed, cap, use_random_order, early_use):
    """``early_use=False`` (structural plans) merges across uses; only the cycle rules keep the result valid."""
    gm, graph = program.trace()
    order = random_topological_order(graph, random.Random(seed)) if use_random_order else None
    cfg = BucketConfig(cap_bytes=cap, overlap_aware=False, early_use=early_use)
    plan = plan_buckets(graph, H100, order, config=cfg)
    _check_plan(graph, plan)
    result = apply_bucket_plan(gm, graph, plan, order)
    result.gm.graph.lint()
    with fake_process_group(program.world):
        new_graph = from_fx(result.gm).validate()
    merged = sum(len(b.members) - 1 for b in plan.merged)
    assert len(new_graph.collectives) == len(graph.collectives) - merged
    inputs = program.real_inputs(seed)
    assert _identical(run_spmd(gm, inputs), run_spmd(result.gm, inputs))
    # the original module is untouched
    assert len([n for n in gm.graph.nodes]) == len(graph)


def test_cap_is_where_the_collective_reaches_ninety_percent_of_its_bus_bandwidth():
    for kind, n, nodes in (("all_gather", 8, 1), ("reduce_scatter", 16, 2), ("all_reduce", 8, 1)):
        hw = hardware.get("h100-sxm", num_nodes=nodes)
        cap = bucket_cap_bytes(kind, n, hw)
        peak = bus_factor(kind, n) * (1 << 44) / collective_time_s(kind, 1 << 44, n, hw)
        at = plan_collective(kind, cap, n, hw).bus_bandwidth_bytes_per_s
        below = plan_collective(kind, int(cap * 0.9), n, hw).bus_bandwidth_bytes_per_s
        assert at >= 0.9 * peak > below, (kind, n, cap)
        assert 1 << 20 < cap < 1 << 34


def test_fixed_cap_closes_buckets_and_says_so():
    from commsched.workloads import build

    w = build("llama-tiny", parallel="fsdp", world_size=2, seq_len=16, batch=2, attention="sdpa")
    cap = 300_000
    plan = plan_buckets(w.graph, H100, config=BucketConfig(cap_bytes=cap, overlap_aware=False))
    _check_plan(w.graph, plan)
    assert plan.closed_counts().get("cap", 0) > 0
    assert all(b.nbytes <= cap or len(b.members) == 1 for b in plan.buckets)
    rows = plan.rows()
    assert {"closed_by", "bytes", "members", "cap_bytes"} <= set(rows[0])
    summary = plan.summary()
    assert summary["collectives"] == len(w.graph.collectives)
    assert summary["caps_bytes"] == {"0/all_gather": cap, "0/reduce_scatter": cap}


def test_a_collective_that_reads_an_earlier_result_closes_the_bucket():
    from random_programs import Program

    # all_gather(x) -> wait -> all_gather(of that result): merging would make a cycle
    p = Program(2, ((2, 3, "float32"),), (("all_gather", 0, 1, "sum"), ("all_gather", 1, 1, "sum")))
    _gm, graph = p.trace()
    plan = plan_buckets(graph, H100, config=BucketConfig(overlap_aware=False))
    assert [len(b.members) for b in plan.buckets] == [1, 1]
    assert plan.buckets[0].closed_by in ("cycle", "early_use")


def test_wrong_plan_for_module_is_a_clear_error():
    from random_programs import Program

    from commsched.ir import GraphError

    p = Program(2, ((2, 3, "float32"), (2, 3, "float32")), (("all_reduce", 0, 3, "sum"), ("all_reduce", 1, 3, "sum")))
    _gm, graph = p.trace()
    plan = plan_buckets(graph, H100, config=BucketConfig(overlap_aware=False))
    assert len(plan.merged) == 1
    other, _ = Program(2, ((2, 3, "float32"),), (("unary", 0),)).trace()
    with pytest.raises(GraphError, match="is not a all_reduce of this GraphModule"):
        apply_bucket_plan(other, graph, plan)


def test_bad_config_is_rejected():
    with pytest.raises(ValueError, match="saturation"):
        BucketConfig(saturation=1.5)
    with pytest.raises(ValueError, match="unknown kind"):
        BucketConfig(kinds=("all_to_all",))

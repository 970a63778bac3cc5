"""torch's OverlapScheduler run on our traced graphs with our costs: valid orders, our numbers, no leaked patches."""

from __future__ import annotations

import functools

import numpy as np
import pytest

from commsched.cost.model import CostEstimate
from commsched.frontends.fx import from_fx
from commsched.ir import OpKind
from commsched.passes.check import check_schedule
from commsched.peers import TorchPeerResult, run_torch_overlap_scheduler
from costs_helper import simple_costs
from programs import trace_program

FSDP_SIZES = [dict(layers=2, dim=128), dict(layers=4, dim=256), dict(layers=6, dim=64)]


@functools.cache
def traced(kind: str, **kw):
    if kind == "two_groups":
        return _trace_two_groups()
    return trace_program(kind, 8, **kw)


def _trace_two_groups():
    """Data-parallel all_gathers on ranks {0,2,4,6} and tensor-parallel all_reduces on {0,1}: two process groups."""
    import torch
    import torch.distributed as dist
    import torch.distributed._functional_collectives as fc
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from commsched.frontends.fake_pg import fake_process_group

    with fake_process_group(8):
        dp, tp = dist.new_group([0, 2, 4, 6]), dist.new_group([0, 1])

        def step(x, *shards):
            h = x
            for s in shards:
                w = fc.all_gather_tensor(s, 0, dp).view(256, 256)
                h = fc.all_reduce(torch.relu(h @ w.t()), "sum", tp)
            return h.sum()

        with FakeTensorMode():
            gm = make_fx(step)(torch.randn(128, 256), *[torch.randn(64, 256) for _ in range(4)])
        return gm, from_fx(gm)


def makespan_s(g, costs: CostEstimate, order: np.ndarray) -> float:
    """One compute stream, one FIFO comm stream per process group; a wait blocks compute until its collective ends."""
    compute_t = 0.0
    comm_free: dict[int, float] = {}
    done: dict[int, float] = {}
    for i in order.tolist():
        if g.coll_type[i] >= 0 and not g.coll_sync[i]:
            grp = int(g.coll_group[i])
            start = max(compute_t, comm_free.get(grp, 0.0))
            comm_free[grp] = done[i] = start + float(costs.node_s[i])
        elif g.kinds[i] == OpKind.WAIT:
            compute_t = max(compute_t, done[int(g.wait_of[i])])
        else:
            compute_t += float(costs.node_s[i])
    return max([compute_t, *comm_free.values()])


def _torch_state() -> dict[str, object]:
    """Every object the harness patches, plus torch's global state it touches."""
    import torch.distributed as dist
    import torch.utils._runtime_estimation as runtime_estimation
    from torch._dynamo.utils import counters
    from torch._inductor import comm_analysis, config
    from torch._inductor import utils as inductor_utils
    from torch._inductor.fx_passes import fsdp, node_runtime_estimation
    from torch._inductor.fx_passes import overlap_scheduling as osch

    return {
        "OverlapScheduler": osch.OverlapScheduler,
        "MemoryTracker": osch.MemoryTracker,
        "estimate_roofline_runtime_ms": osch.estimate_roofline_runtime_ms,
        "estimate_nccl": comm_analysis.estimate_nccl_collective_runtime_from_fx_node,
        "get_gpu_type": comm_analysis.get_gpu_type,
        "re.get_device_tflops": runtime_estimation.get_device_tflops,
        "re.get_gpu_dram_gbps": runtime_estimation.get_gpu_dram_gbps,
        "iu.get_device_tflops": inductor_utils.get_device_tflops,
        "iu.get_gpu_dram_gbps": inductor_utils.get_gpu_dram_gbps,
        "pre_bucket": fsdp.pre_bucket_fsdp_collectives,
        "log_compute": node_runtime_estimation._log_compute_estimations,
        "log_colls": node_runtime_estimation._log_collective_benchmarks,
        "assume_bucketing": config.test_configs.assume_bucketing_reduces_latency,
        "dist_initialized": dist.is_initialized(),
        "counters": dict(counters["inductor"]),
    }


@pytest.mark.parametrize("kw", FSDP_SIZES, ids=lambda kw: f"L{kw['layers']}d{kw['dim']}")
def test_fsdp_order_is_a_valid_schedule_that_reorders_and_does_not_lose_to_the_input(kw):
    gm, g = traced("fsdp_mlp", **kw)
    costs = simple_costs(g)
    r = run_torch_overlap_scheduler(gm, g, costs)
    assert isinstance(r, TorchPeerResult)
    assert r.order.dtype == np.int32 and sorted(r.order.tolist()) == list(range(len(g)))
    assert r.new_nodes == () and r.removed_nodes == ()
    check_schedule(g, r.order, allow_collective_reorder=True)
    assert r.valid is True and r.invalid_reason is None
    # fsdp: the next layer's all_gather can be issued under the current matmul, so torch must move something
    identity = np.arange(len(g), dtype=np.int32)
    assert not np.array_equal(r.order, identity)
    assert makespan_s(g, costs, r.order) <= makespan_s(g, costs, identity) * (1 + 1e-12)
    assert r.wall_s > 0 and r.stats["time_s"]["run"] > 0


def test_a_graph_without_collectives_is_a_clear_error():
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    with FakeTensorMode():
        gm = make_fx(lambda x, w: torch.relu(x @ w))(torch.randn(8, 8), torch.randn(8, 8))
    g = from_fx(gm)
    with pytest.raises(ValueError, match="no wait_tensor"):
        run_torch_overlap_scheduler(gm, g, simple_costs(g))


def test_torch_overlap_strictly_beats_the_traced_order_when_compute_can_hide_comm():
    gm, g = traced("fsdp_mlp", **FSDP_SIZES[1])
    costs = simple_costs(g)
    r = run_torch_overlap_scheduler(gm, g, costs)
    identity = np.arange(len(g), dtype=np.int32)
    assert makespan_s(g, costs, r.order) < 0.95 * makespan_s(g, costs, identity)
    # its own bookkeeping agrees that it hid something: less exposed than the total collective time
    assert 0 < r.torch_exposed_comm_s < r.stats["collective_s"]
    assert r.torch_exposed_comm_s == pytest.approx(sum(r.stats["collective_exposed_s"].values()))


def test_every_collective_program_gives_a_valid_schedule():
    gm, g = traced("every_collective")
    costs = simple_costs(g)
    r = run_torch_overlap_scheduler(gm, g, costs)
    check_schedule(g, r.order, allow_collective_reorder=True)
    assert r.valid is True
    # broadcast ends in a wait but torch cannot classify it: it is answered with zero time, never as compute
    bcast = next(n for n in g.names if g.targets[g.index[n]].startswith("_c10d_functional.broadcast"))
    assert r.torch_estimates_s.get(bcast, 0.0) == 0.0
    assert r.stats["questions"].get("untracked_collective_zero", 0) >= 1
    tracked = {g.names[c] for c in g.collectives.tolist()} - {bcast}
    assert set(r.stats["collective_estimates_s"]) == tracked


def test_two_process_groups_schedule_and_bucket_without_a_live_process_group():
    import torch.distributed as dist
    from torch.distributed.distributed_c10d import _resolve_process_group

    gm, g = traced("two_groups")
    assert len(g.groups) == 2 and not dist.is_initialized()
    costs = simple_costs(g)
    r = run_torch_overlap_scheduler(gm, g, costs)
    assert r.valid is True and r.stats["reordered_group_collectives"] is False
    assert makespan_s(g, costs, r.order) < makespan_s(g, costs, np.arange(len(g), dtype=np.int32))
    # bucketing resolves the subgroups by name: the harness recreates them in its fake world, then removes them
    b = run_torch_overlap_scheduler(gm, g, costs, bucket=True)
    assert b.new_nodes and b.stats["questions"]["bucket_model"] >= 1
    assert not dist.is_initialized()
    for grp in g.groups:
        with pytest.raises(RuntimeError):
            _resolve_process_group(grp.name)


@pytest.mark.parametrize("compute_scale", [1.0, 7.0])
def test_torch_scheduler_sees_exactly_our_costs(compute_scale):
    from torch._inductor.fx_passes.overlap_scheduling import is_compute_node

    gm, g = traced("fsdp_mlp", **FSDP_SIZES[1])
    costs = simple_costs(g, compute_scale=compute_scale)
    r = run_torch_overlap_scheduler(gm, g, costs)
    est = r.torch_estimates_s
    compute = [n.name for n in gm.graph.nodes if is_compute_node(n)]
    colls = [g.names[c] for c in g.collectives.tolist()]
    assert compute and colls
    assert set(compute) | set(colls) <= set(est)
    for name, seconds in est.items():
        assert seconds == pytest.approx(float(costs.node_s[g.index[name]]), rel=1e-12, abs=1e-18), name
    # the collective times the scheduler planned with are ours too (the values it subtracts overlap from)
    for name, seconds in r.stats["collective_estimates_s"].items():
        assert seconds == pytest.approx(float(costs.node_s[g.index[name]]), rel=1e-12)
    # nothing was answered by torch's own device numbers or left to a default
    assert set(r.stats["questions"]) == {"ours"}


def test_more_compute_lets_torch_hide_more_communication():
    gm, g = traced("fsdp_mlp", **FSDP_SIZES[1])
    slow = run_torch_overlap_scheduler(gm, g, simple_costs(g, compute_scale=20.0))
    fast = run_torch_overlap_scheduler(gm, g, simple_costs(g, compute_scale=0.05))
    assert slow.torch_exposed_comm_s < fast.torch_exposed_comm_s


def test_caller_gm_is_not_modified():
    gm, g = traced("fsdp_mlp", **FSDP_SIZES[0])
    names = [n.name for n in gm.graph.nodes]
    code = gm.code
    r = run_torch_overlap_scheduler(gm, g, simple_costs(g))
    assert r.gm is not gm
    assert [n.name for n in gm.graph.nodes] == names and gm.code == code
    assert [n.name for n in r.gm.graph.nodes] != names


def test_patches_are_undone_after_the_call_and_after_an_error(monkeypatch):
    from torch._inductor.fx_passes import overlap_scheduling as osch

    gm, g = traced("fsdp_mlp", **FSDP_SIZES[0])
    before = _torch_state()
    r = run_torch_overlap_scheduler(gm, g, simple_costs(g))
    assert _torch_state() == before
    assert r.stats["counters"]  # torch did count, and the counts went to the result instead
    assert any("MemoryTracker" in note for note in r.notes)

    def boom(graph):
        raise RuntimeError("injected failure inside OverlapScheduler")

    monkeypatch.setattr(osch, "stable_topological_sort", boom)
    with pytest.raises(RuntimeError, match="injected failure"):
        run_torch_overlap_scheduler(gm, g, simple_costs(g))
    monkeypatch.undo()
    assert _torch_state() == before


def test_memory_accounting_counts_fake_cpu_tensors_and_the_budget_is_live():
    gm, g = traced("fsdp_mlp", layers=6, dim=256)
    costs = simple_costs(g, compute_scale=10.0)
    free = run_torch_overlap_scheduler(gm, g, costs)
    inputs = np.flatnonzero(g.kinds == OpKind.INPUT)
    input_bytes = int(g.storage_nbytes[np.isin(g.storage_owner, inputs)].sum())
    # inputs persist and are counted, so the baseline is at least their size (torch's default tracker says 0)
    assert free.torch_baseline_peak_memory_bytes >= input_bytes > 0
    assert free.torch_peak_memory_bytes >= free.torch_baseline_peak_memory_bytes
    # default limit: baseline + max(1 GiB, 5 %)
    assert free.torch_memory_limit_bytes == free.torch_baseline_peak_memory_bytes + 2**30
    budget = free.torch_baseline_peak_memory_bytes
    tight = run_torch_overlap_scheduler(gm, g, costs, memory_budget=budget)
    assert tight.torch_memory_limit_bytes == budget
    assert tight.valid is True
    assert not np.array_equal(tight.order, free.order)  # the budget changed decisions


def test_bucketing_returns_the_new_graph_and_estimates_new_collectives_from_our_costs():
    gm, g = traced("fsdp_mlp", **FSDP_SIZES[1])
    r = run_torch_overlap_scheduler(gm, g, simple_costs(g), bucket=True)
    assert r.new_nodes and r.removed_nodes
    assert r.valid is None  # not a permutation of our graph any more
    assert set(r.removed_nodes) >= {g.names[c] for c in g.collectives.tolist()}
    assert len(r.order) == len(g) - len(r.removed_nodes)
    # pre-bucketing leaves the bucketed collectives before some of their inputs: detected and reported
    assert r.stats["prebucket_out_of_order"] > 0
    assert r.stats["questions"]["bucket_model"] >= 2
    assert r.stats["questions"].get("device_query", 0) == 0
    g2 = from_fx(r.gm)
    check_schedule(g2, np.arange(len(g2), dtype=np.int32))
    assert r.knobs["collective_bucketing"] and r.knobs["assume_bucketing_reduces_latency"]
    assert 10.0 <= r.knobs["pre_bucketing_fsdp_collectives_bucket_cap_mb"] <= 500.0


@pytest.mark.parametrize(
    ("latency_s", "bytes_per_s", "cap_mb"),
    [
        (100e-6, 50e9, 9 * 100e-6 * 50e9 / 2**20),  # 90 % efficiency at 9 x latency x bandwidth = 42.9 MiB
        (10e-6, 4e9, 10.0),  # 0.34 MiB: raised to torch's 10 MB floor
        (1e-3, 100e9, 500.0),  # 858 MiB: lowered to torch's 500 MB ceiling
    ],
)
def test_bucket_cap_comes_from_our_latency_and_bandwidth(latency_s, bytes_per_s, cap_mb):
    gm, g = traced("fsdp_mlp", **FSDP_SIZES[0])
    base = simple_costs(g)
    is_coll = g.coll_type >= 0
    costs = CostEstimate(
        node_s=np.where(is_coll, latency_s + g.comm_bytes / bytes_per_s, base.node_s),
        coll_latency_s=np.where(is_coll, latency_s, 0.0),
        coll_link=base.coll_link,
    )
    r = run_torch_overlap_scheduler(gm, g, costs, bucket=True)
    assert r.knobs["pre_bucketing_fsdp_collectives_bucket_cap_mb"] == pytest.approx(cap_mb, rel=1e-9)


def test_knobs_are_validated_and_passed_through():
    gm, g = traced("fsdp_mlp", **FSDP_SIZES[0])
    costs = simple_costs(g)
    with pytest.raises(ValueError, match="compute_estimator"):
        run_torch_overlap_scheduler(gm, g, costs, compute_estimator="benchmark")
    with pytest.raises(ValueError, match="custom_runtime_estimation"):
        run_torch_overlap_scheduler(gm, g, costs, custom_runtime_estimation=lambda n, s: 1.0)
    with pytest.raises(ValueError, match="unknown torch knob 'max_prefetch'"):
        run_torch_overlap_scheduler(gm, g, costs, max_prefetch=3)
    with pytest.raises(ValueError, match="memory_budget"):
        run_torch_overlap_scheduler(gm, g, costs, memory_budget=0)
    _, other = traced("every_collective")
    with pytest.raises(ValueError, match=r"expected graph = commsched\.from_fx"):
        run_torch_overlap_scheduler(gm, other, simple_costs(other))
    slowed = CostEstimate(costs.node_s, costs.coll_latency_s, costs.coll_link, compute_slowdown=2.0)
    r = run_torch_overlap_scheduler(gm, g, slowed, max_compute_pre_fetch=0)
    assert r.knobs["compute_overlap_multipler"] == 0.5 and r.knobs["max_compute_pre_fetch"] == 0
    assert r.knobs["assume_bucketing_reduces_latency"] is False
    # no prefetching across compute nodes: every all_gather is issued after the previous compute node's inputs
    free = run_torch_overlap_scheduler(gm, g, costs)
    assert not np.array_equal(r.order, free.order)

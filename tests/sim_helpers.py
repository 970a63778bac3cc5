"""Shared helpers for simulator tests: simple costs from a traced graph's flops and bytes, invariant checks."""

from __future__ import annotations

import numpy as np
import torch
import torch.distributed as dist
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from commsched.cost import CostEstimate
from commsched.frontends.fake_pg import fake_process_group
from commsched.frontends.fx import from_fx
from commsched.ir import OpKind
from commsched.ir.transform import topological_order

c10d = torch.ops._c10d_functional


def simple_costs(g, compute_slowdown: float = 1.0, stream_sync_s: float = 0.0, comm_scale: float = 1.0, link=None):
    """Seconds from a simple formula (simulator tests check semantics, not cost accuracy): kernels at 100 TFLOP/s
    or 1 TB/s, collectives at 10 GB/s."""
    node_s = (
        np.where(g.kinds == OpKind.COMPUTE, g.flops / 1e14 + 1e-6, 0)
        + np.where(g.kinds == OpKind.OTHER, (g.out_bytes + g.in_bytes) / 1e12 + 5e-7, 0)
        + np.where(g.coll_type >= 0, comm_scale * (g.comm_bytes / 1e10 + 2e-6), 0)
    )
    return CostEstimate.from_times(
        node_s, coll_link=link, compute_slowdown=compute_slowdown, stream_sync_s=stream_sync_s
    )


def eager_wait_order(g) -> np.ndarray:
    """A topological order that runs each wait (and the getitems leading to it) as soon as it is ready."""
    feeds_wait = np.zeros(len(g), bool)
    reader = np.repeat(np.arange(len(g)), np.diff(g.in_ptr))
    feeds_wait[g.in_idx[np.isin(reader, np.flatnonzero(g.wait_of >= 0))]] = True
    prio = [0 if g.wait_of[i] >= 0 or (g.kinds[i] == OpKind.VIEW and feeds_wait[i]) else 1 for i in range(len(g))]
    return topological_order(g, prio)


def trace_two_group_layer():
    """A 1-layer step with an FSDP all_gather on the world group and a TP all_reduce on a 4-rank group, both
    hidden behind an independent matmul + relu; then the waits and the layer that needs both."""
    with fake_process_group(8) as pg:
        tp = dist.new_group([0, 1, 2, 3])

        def step(x, w_shard, a):
            w = c10d.all_gather_into_tensor(w_shard, 8, pg.group_name)
            r = c10d.all_reduce(a, "sum", tp.group_name)
            y = torch.relu(x @ x.t())
            w = c10d.wait_tensor(w)
            r = c10d.wait_tensor(r)
            return (y @ w) + r

        with FakeTensorMode():
            gm = make_fx(step)(torch.randn(64, 64), torch.randn(8, 64), torch.randn(64, 64))
        return from_fx(gm)


def available_ns(res) -> np.ndarray:
    """When each node's result may be used by a successor under the simulator's rules."""
    g = res.graph
    avail = res.end_ns.copy()
    async_coll = (g.coll_type >= 0) & ~g.coll_sync
    avail[async_coll] = res.issue_ns[async_coll]
    return avail


def assert_valid_simulation(res) -> None:
    """Invariants of any simulation: streams run one thing at a time, dependencies respected, FIFO comm streams,
    makespan above every lower bound."""
    g = res.graph
    n = len(g)
    start, end = res.start_ns, res.end_ns
    assert (end >= start).all()
    runs = np.isin(g.kinds, (OpKind.COMPUTE, OpKind.OTHER)) | (g.coll_type >= 0)
    for s in range(len(res.stream_names)):
        ids = np.flatnonzero(runs & (res.stream == s) & (end > start))
        o = ids[np.lexsort((end[ids], start[ids]))]
        assert (start[o][1:] >= end[o][:-1]).all(), f"stream {res.stream_names[s]} runs two nodes at once"
    avail = available_ns(res)
    ptr, idx = g.predecessors_csr()
    dst = np.repeat(np.arange(n), np.diff(ptr))
    assert (start[dst] >= avail[idx]).all(), "a node started before a predecessor was available"
    colls = g.collectives
    assert (start[colls] >= res.issue_ns[colls]).all()
    waits = np.flatnonzero(g.wait_of >= 0)
    assert (start[waits] >= end[g.wait_of[waits]]).all(), "a wait unblocked before its collective ended"
    for k in range(len(g.groups)):
        cs = colls[g.coll_group[colls] == k]
        # simultaneous issues from different streams may enter the FIFO in either order
        by_issue = cs[np.lexsort((start[cs], res.issue_ns[cs]))]
        assert (np.diff(start[by_issue]) >= 0).all(), "a comm stream is not FIFO in issue order"
    span = res.makespan_s + 1e-12
    assert span >= res.bound.compute_s
    assert span >= res.bound.critical_path_s
    assert all(span >= v for v in res.bound.comm_s.values())


US = 1e-6


def layer_costs(g, link_ag, link_ar, slowdown=1.0, sync_s=0.0, lat_ag=0.0, comm_slowdown=1.0):
    """Hand-picked costs (us) for trace_two_group_layer: mm 4, relu 1, mm_1 3, add 1, all_gather 10, all_reduce 6."""
    times = {"mm": 4, "relu": 1, "mm_1": 3, "add": 1, "all_gather_into_tensor": 10, "all_reduce": 6}
    node_s = np.array([times.get(name, 0) * US for name in g.names])
    lat = np.zeros(len(g))
    lat[g.id_of("all_gather_into_tensor")] = lat_ag * US
    link = np.full(len(g), -1, np.int8)
    link[g.id_of("all_gather_into_tensor")] = link_ag
    link[g.id_of("all_reduce")] = link_ar
    return CostEstimate(node_s, lat, link, compute_slowdown=slowdown, stream_sync_s=sync_s, comm_slowdown=comm_slowdown)

"""Entry points: ``simulate`` (graph + hardware) and ``simulate_costs`` (graph + a CostEstimate)."""

from __future__ import annotations

import functools
import weakref
from collections.abc import Sequence
from typing import Any

import numpy as np

from commsched.cost.model import CostEstimate
from commsched.ir.graph import Graph, OpKind
from commsched.ir.order import as_order, check_topological
from commsched.memory.liveness import memory_profile
from commsched.sim.bounds import lower_bound
from commsched.sim.comm import CommEngine
from commsched.sim.engine import Step, Timeline, run_multi_stream, run_single_stream
from commsched.sim.jit import ENABLED as JIT_ENABLED
from commsched.sim.model import StreamModel, durations_ns, latency_ns, takes_sms
from commsched.sim.result import SimResult

# passes simulate many orders of one graph with one CostEstimate: the bounds do not depend on the order
_BOUNDS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def _cached_bound(g: Graph, costs: CostEstimate, dur: np.ndarray, stream: np.ndarray, default_streams: bool):
    slowdown = float(costs.compute_slowdown)
    sms = takes_sms(g, costs)
    if not default_streams:
        return lower_bound(g, dur, stream, slowdown, sms)
    per_costs = _BOUNDS.setdefault(costs, {})
    key = (id(g), len(g))
    if key not in per_costs:
        per_costs[key] = lower_bound(g, dur, stream, slowdown, sms)
    return per_costs[key]


def _resolve_streams(g: Graph, streams: Sequence[int] | np.ndarray | None) -> np.ndarray:
    if streams is None:
        return np.zeros(len(g), np.int64)
    arr = np.asarray(streams)
    if arr.shape != (len(g),) or not np.issubdtype(arr.dtype, np.integer):
        raise ValueError(f"streams must be {len(g)} integers (one compute stream per node), got shape {arr.shape}")
    if len(arr) and arr.min() < 0:
        bad = int(np.flatnonzero(arr < 0)[0])
        raise ValueError(f"streams[{bad}] (node {g.names[bad]!r}) is {int(arr[bad])}; expected a stream index >= 0")
    return arr.astype(np.int64)


def _links(g: Graph, costs: CostEstimate, is_coll: np.ndarray) -> np.ndarray:
    """Per node: its collective's link class (0 for other nodes); ValueError naming a collective without one."""
    link = np.where(is_coll, np.asarray(costs.coll_link, np.int64), 0)
    if is_coll.any() and link[is_coll].min() < 0:
        bad = int(np.flatnonzero(is_coll & (link < 0))[0])
        raise ValueError(
            f"CostEstimate.coll_link of collective {g.names[bad]!r} is {int(link[bad])}; expected a LinkClass"
        )
    return link


def _step(g: Graph, costs: CostEstimate, dur: np.ndarray, is_coll: np.ndarray) -> Step:
    """The simulation loops' input for ``g``: per-node facts, the stream model, a comm engine, an empty timeline."""
    n = len(g)
    lat = latency_ns(g, costs, dur)
    link = _links(g, costs, is_coll)
    model = StreamModel.from_costs(costs)
    out = Timeline(start=[0] * n, end=np.where(is_coll, -1, 0).tolist(), issue=[-1] * n, blocked=[0] * n)
    comm = CommEngine(
        num_groups=len(g.groups),
        group=g.coll_group.tolist(),
        lat_ns=lat.tolist(),
        bw_ns=(dur - lat).tolist(),
        link=link.tolist(),
        model=model,
        start_ns=out.start,
        end_ns=out.end,
        sms=takes_sms(g, costs).tolist(),
    )
    return Step(g.kinds.tolist(), dur.tolist(), g.wait_of.tolist(), g.coll_sync.tolist(), model, comm, out)


def _compiled_args(g: Graph, costs: CostEstimate, dur: np.ndarray, is_coll: np.ndarray) -> tuple:
    """The order-independent arguments of the compiled loop, kept on ``g`` for the next simulation with ``costs``
    (a pass simulates many orders of one graph)."""
    kept = g.__dict__.setdefault("_commsched_sim_args", [])
    for c, args in kept:
        if c is costs:  # the entry holds ``costs``: its identity cannot be reused meanwhile
            return args
    lat = latency_ns(g, costs, dur)
    link = _links(g, costs, is_coll)
    kinds = g.kinds
    node_class = np.full(len(g), 3, np.int64)  # instantaneous
    node_class[np.isin(kinds, (OpKind.COMPUTE, OpKind.OTHER))] = 0
    node_class[kinds == OpKind.COLLECTIVE] = 1
    node_class[kinds == OpKind.WAIT] = 2
    model = StreamModel.from_costs(costs)
    args = (
        node_class, dur.astype(np.int64), g.wait_of.astype(np.int64), g.coll_sync.astype(np.bool_),
        g.coll_group.astype(np.int64), lat.astype(np.int64), (dur - lat).astype(np.int64), link,
        takes_sms(g, costs).astype(np.int64), len(g.groups), int(model.sync_ns), float(model.compute_slowdown),
        float(model.comm_slowdown),
    )  # fmt: skip
    kept[:] = [(costs, args)]  # the latest costs only
    return args


def _run_compiled(g: Graph, costs: CostEstimate, dur: np.ndarray, is_coll: np.ndarray, order: np.ndarray):
    """The single-stream loop, compiled (:mod:`commsched.sim.engine_jit`): (start, end, issue, blocked) arrays."""
    from commsched.sim.engine_jit import run_single_stream_jit

    args = _compiled_args(g, costs, dur, is_coll)
    start, end, issue, blocked, ok = run_single_stream_jit(order.astype(np.int64), *args)
    if not ok:
        raise RuntimeError("a collective can never finish: it was not issued")
    return start, end, issue, blocked


def simulate_costs(
    g: Graph,
    costs: CostEstimate,
    order: Sequence[str | int] | np.ndarray | None = None,
    streams: Sequence[int] | np.ndarray | None = None,
    *,
    hold_collective_inputs: bool = True,
    engine: str = "auto",
) -> SimResult:
    """Simulate one step of ``g`` with per-node ``costs`` (semantics: :mod:`commsched.sim.engine`).

    ``order``: node names or ids, a topological order (default: the graph's). ``streams``: the compute stream of
    every node (default: all on stream 0); a collective is issued from its entry's stream and runs on its process
    group's comm stream. Costs of inputs, views, waits and the output are ignored (they take no time).
    ``hold_collective_inputs``: the memory rule of :mod:`commsched.memory.liveness`. ``engine``: "auto" (the
    single-stream loop when every node is on stream 0, else the event loop) or "events" (always the event loop;
    both give identical results, which the tests check).
    """
    if engine not in ("auto", "events"):
        raise ValueError(f"engine={engine!r}: expected 'auto' or 'events'")
    n = len(g)
    if len(costs.node_s) != n:
        raise ValueError(f"CostEstimate has {len(costs.node_s)} entries but the graph has {n} nodes")
    order_arr = as_order(g, order, dtype=np.int64)
    check_topological(g, order_arr)
    stream = _resolve_streams(g, streams)
    dur = durations_ns(g, costs)
    is_coll = g.coll_type >= 0
    num_streams = int(stream.max(initial=0)) + 1
    if num_streams == 1 and engine == "auto" and JIT_ENABLED:
        start, end, issue, blocked = _run_compiled(g, costs, dur, is_coll, order_arr)
    else:
        step = _step(g, costs, dur, is_coll)
        if num_streams == 1 and engine == "auto":
            run_single_stream(step, order_arr.tolist())
        else:
            ptr, idx = g.predecessors_csr()
            run_multi_stream(step, order_arr.tolist(), stream.tolist(), num_streams, ptr.tolist(), idx.tolist(),
                             g.names)  # fmt: skip
        start, end, issue, blocked = step.out.start, step.out.end, step.out.issue, step.out.blocked
    names = tuple(f"compute:{s}" for s in range(num_streams)) + tuple(f"comm:{grp.name}" for grp in g.groups)
    node_stream = np.where(is_coll, num_streams + g.coll_group.astype(np.int64), stream)
    return SimResult(
        graph=g,
        order=order_arr,
        stream=node_stream,
        issue_stream=stream,
        stream_names=names,
        num_compute_streams=num_streams,
        start_ns=np.asarray(start, np.int64),
        end_ns=np.asarray(end, np.int64),
        issue_ns=np.asarray(issue, np.int64),
        blocked_ns=np.asarray(blocked, np.int64),
        standalone_ns=dur,
        bound_fn=functools.partial(_cached_bound, g, costs, dur, stream, streams is None),
        memory=memory_profile(g, order_arr, hold_collective_inputs=hold_collective_inputs),
    )


def simulate(
    g: Graph,
    hardware: Any,
    order: Sequence[str | int] | np.ndarray | None = None,
    streams: Sequence[int] | np.ndarray | None = None,
    *,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
) -> SimResult:
    """Estimate ``g`` on ``hardware`` and simulate it; see :func:`simulate_costs`. ``hardware``, ``num_nodes``,
    ``gpus_per_node`` as ``commsched.schedule`` takes them: a profile name or ``.toml`` path (nodes inferred from
    the graph's world size unless given), a Hardware, or a CostEstimate (``commsched.cost.resolve_costs``)."""
    from commsched.cost import resolve_costs

    costs = resolve_costs(g, hardware, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
    return simulate_costs(g, costs, order, streams)

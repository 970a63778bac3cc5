"""Run a multi-stream schedule: stream anchor ops (``torch.ops.commsched.*``) and the FX lowering that inserts them.

The ops, registered with ``torch.library`` in the ``commsched`` namespace, switch, record and wait on CUDA streams
when their tensors are on a CUDA device, and do nothing on CPU and Meta (fake) tensors, so a lowered graph runs
everywhere and gives the same results as the original:

* ``stream_begin(Tensor anchor, int num_streams) -> ()``: stream 0 is the caller's current stream; side streams
  1..n-1 (one pool per device, created once) first wait for it, since the inputs were made there.
* ``set_stream(Tensor anchor, int stream) -> ()``: the following ops launch on ``stream``.
* ``stream_record(Tensor[] xs, int event) -> ()``: record event ``event`` on the current stream (after the producer
  of ``xs``).
* ``stream_wait(Tensor[] xs, int event) -> ()``: the current stream waits for event ``event``; ``xs`` (produced on
  another stream) are marked as used by this stream, so the caching allocator does not hand their memory to the
  producer's stream while this one may still read it.
* ``stream_join(Tensor anchor, Tensor[] outs) -> ()``: back on the caller's stream, wait for every side stream;
  ``outs`` are marked as used by the caller's stream.

All five are registered as side-effecting, so FX dead-code elimination keeps them; they are placed by order, so a
lowered graph must not be re-sorted. ``anchor`` is a graph input: its device picks the kernel (CUDA or no-op).
"""

from __future__ import annotations

import threading
from typing import Any

import numpy as np
import torch
import torch.fx

from commsched.ir import Graph, GraphError, OpKind

_LIB = torch.library.Library("commsched", "FRAGMENT")  # FRAGMENT: other modules may add ops to the namespace
_SCHEMAS = {
    "stream_begin": "stream_begin(Tensor anchor, int num_streams) -> ()",
    "set_stream": "set_stream(Tensor anchor, int stream) -> ()",
    "stream_record": "stream_record(Tensor[] xs, int event) -> ()",
    "stream_wait": "stream_wait(Tensor[] xs, int event) -> ()",
    "stream_join": "stream_join(Tensor anchor, Tensor[] outs) -> ()",
}


class _State(threading.local):
    """Per thread: the streams and events of the graph being run."""

    def __init__(self) -> None:
        self.entry: Any = None  # the caller's stream (stream 0)
        self.streams: list[Any] = []
        self.events: dict[int, Any] = {}


_STATE = _State()
_POOL: dict[tuple[int, int], Any] = {}  # (device index, stream id) -> torch.cuda.Stream, created once
_POOL_LOCK = threading.Lock()


def _pool_stream(device: torch.device, stream: int) -> Any:
    index = device.index if device.index is not None else torch.cuda.current_device()
    with _POOL_LOCK:
        key = (index, stream)
        if key not in _POOL:
            _POOL[key] = torch.cuda.Stream(device=index)
        return _POOL[key]


def _need_begun(what: str) -> None:
    if _STATE.entry is None:
        raise RuntimeError(f"commsched.{what}: no stream_begin ran before it on this thread (a hand-edited graph?)")


def _begin_cuda(anchor: torch.Tensor, num_streams: int) -> None:
    entry = torch.cuda.current_stream(anchor.device)
    _STATE.entry = entry
    _STATE.streams = [entry] + [_pool_stream(anchor.device, s) for s in range(1, num_streams)]
    _STATE.events = {}
    for s in _STATE.streams[1:]:
        s.wait_stream(entry)


def _set_stream_cuda(anchor: torch.Tensor, stream: int) -> None:
    _need_begun("set_stream")
    if not 0 <= stream < len(_STATE.streams):
        raise RuntimeError(f"commsched.set_stream: stream {stream} is not one of the {len(_STATE.streams)} begun")
    torch.cuda.set_stream(_STATE.streams[stream])


def _record_cuda(xs: list[torch.Tensor], event: int) -> None:
    _need_begun("stream_record")
    ev = torch.cuda.Event()
    ev.record(torch.cuda.current_stream(xs[0].device))
    _STATE.events[event] = ev


def _wait_cuda(xs: list[torch.Tensor], event: int) -> None:
    _need_begun("stream_wait")
    ev = _STATE.events.get(event)
    if ev is None:
        raise RuntimeError(f"commsched.stream_wait: event {event} was never recorded (a wait placed before its record)")
    cur = torch.cuda.current_stream(xs[0].device)
    cur.wait_event(ev)
    for x in xs:
        if x.is_cuda:
            x.record_stream(cur)


def _join_cuda(anchor: torch.Tensor, outs: list[torch.Tensor]) -> None:
    _need_begun("stream_join")
    entry = _STATE.entry
    torch.cuda.set_stream(entry)
    for s in _STATE.streams[1:]:
        entry.wait_stream(s)
    for x in outs:
        if x.is_cuda:
            x.record_stream(entry)
    _STATE.entry, _STATE.streams, _STATE.events = None, [], {}


def _noop(*args: Any) -> None:
    return None


_CUDA_IMPLS = {
    "stream_begin": _begin_cuda,
    "set_stream": _set_stream_cuda,
    "stream_record": _record_cuda,
    "stream_wait": _wait_cuda,
    "stream_join": _join_cuda,
}
for _name, _schema in _SCHEMAS.items():
    _LIB.define(_schema)
    _LIB.impl(_name, _noop, "CPU")
    _LIB.impl(_name, _noop, "Meta")
    _LIB.impl(_name, _CUDA_IMPLS[_name], "CUDA")
    torch.fx.node.has_side_effect(getattr(torch.ops.commsched, _name).default)

OPS = {name: getattr(torch.ops.commsched, name).default for name in _SCHEMAS}
"""The anchor ops by name (``OpOverload`` s)."""


# ---------------------------------------------------------------------------------------------------- lowering
def lower_streams(
    gm: torch.fx.GraphModule,
    schedule: Any,
    *,
    graph: Graph | None = None,
    order: np.ndarray | None = None,
    streams: np.ndarray | None = None,
) -> torch.fx.GraphModule:
    """A new GraphModule that runs ``gm`` in ``schedule``'s order on its streams (``gm`` is not modified).

    ``schedule`` is a :class:`commsched.passes.Schedule` of the graph imported from ``gm`` (node names must match
    one to one), or None with ``graph`` / ``order`` / ``streams`` given. Placeholders keep their order (they are
    the signature); the other nodes follow the schedule. Without streams (or all on stream 0) only the order
    changes. With streams: ``stream_begin`` after the inputs, ``set_stream`` wherever the stream changes, a
    ``stream_record`` after each node some other stream depends on and a ``stream_wait`` before the first node of
    each stream that needs it (a stream that already waited for a later point of the producer's stream needs
    none), ``stream_join`` before the output. Every dependency of the commsched graph counts, control deps (e.g.
    write-after-read of an in-place op) included. Raises GraphError if the graph does not match ``gm`` or the
    order is not a valid schedule. O(N + E).
    """
    from commsched.passes.check import check_schedule

    if schedule is not None:
        graph, order, streams = schedule.graph, schedule.order, schedule.streams
    if graph is None or order is None:
        raise ValueError("lower_streams: give a Schedule, or graph= and order=")
    order = np.asarray(order)
    if streams is not None:
        streams = np.asarray(streams, np.int64)
        if streams.shape != (len(graph),) or (len(streams) and streams.min() < 0):
            raise ValueError(f"lower_streams: streams must be {len(graph)} stream ids >= 0, one per node")
    order = check_schedule(graph, order, allow_collective_reorder=True, streams=streams)
    fx_nodes = _match_nodes(gm, graph)
    multi = streams is not None and bool(streams.any())
    if not multi:
        streams = np.zeros(len(graph), np.int64)
    new = torch.fx.Graph()
    env: dict[torch.fx.Node, torch.fx.Node] = {}

    def copy(node: torch.fx.Node) -> torch.fx.Node:
        env[node] = new.node_copy(node, lambda a: env[a])
        return env[node]

    placeholders = [n for n in gm.graph.nodes if n.op in ("placeholder", "get_attr")]
    for node in placeholders:
        copy(node)
    anchor = _anchor(placeholders, env)
    if multi and anchor is None:
        raise GraphError("lower_streams: the graph has no tensor input to anchor the stream ops to")
    kinds = graph.kinds
    pred_ptr, pred_idx = graph.predecessors_csr()
    succ_ptr, succ_idx = graph.successors_csr()
    num_streams = int(streams.max()) + 1
    # per stream: position of each node in that stream's program, and how far each stream has waited on each other
    prog_pos = np.zeros(len(graph), np.int64)
    counts = [0] * num_streams
    for i in order.tolist():
        prog_pos[i] = counts[streams[i]]
        counts[streams[i]] += 1
    # vector clocks: synced[dst][src] = the last program index of stream src that stream dst has waited for
    synced = [[-1] * num_streams for _ in range(num_streams)]
    event_of: dict[int, int] = {}
    clock_at_record: dict[int, list[int]] = {}
    if multi:
        new.call_function(OPS["stream_begin"], (anchor, num_streams))
    cur = 0
    for i in order.tolist():
        if kinds[i] in (OpKind.INPUT, OpKind.OUTPUT):
            continue
        s = int(streams[i])
        node = fx_nodes[i]
        if multi and s != cur:
            new.call_function(OPS["set_stream"], (anchor, s))
            cur = s
        if multi:
            for p in pred_idx[pred_ptr[i] : pred_ptr[i + 1]].tolist():
                a = int(streams[p])
                if a == s or kinds[p] == OpKind.INPUT or synced[s][a] >= prog_pos[p]:
                    continue
                new.call_function(OPS["stream_wait"], (_tensors_of(fx_nodes[p], env, anchor), event_of[p]))
                # the wait covers the producer's stream up to the record, and all that stream had waited for then
                synced[s] = [max(x, y) for x, y in zip(synced[s], clock_at_record[p], strict=True)]
                synced[s][a] = int(prog_pos[p])
        copy(node)
        if multi and any(
            int(streams[q]) != s and kinds[q] != OpKind.OUTPUT for q in succ_idx[succ_ptr[i] : succ_ptr[i + 1]].tolist()
        ):
            event_of[i] = len(event_of)
            clock_at_record[i] = list(synced[s])
            new.call_function(OPS["stream_record"], (_tensors_of(node, env, anchor), event_of[i]))
    out_node = next(n for n in gm.graph.nodes if n.op == "output")
    if multi:
        outs = [env[a] for a in out_node.all_input_nodes if isinstance(a.meta.get("val"), torch.Tensor)]
        new.call_function(OPS["stream_join"], (anchor, outs))
    copy(out_node)
    new.lint()
    lowered = torch.fx.GraphModule(gm, new)
    lowered.meta = dict(getattr(gm, "meta", {}))
    lowered.meta["commsched_streams"] = num_streams if multi else 1
    return lowered


def _match_nodes(gm: torch.fx.GraphModule, graph: Graph) -> list[torch.fx.Node]:
    """The FX node of each commsched node (by name); every FX node must have one."""
    by_name = {n.name: n for n in gm.graph.nodes}
    if len(by_name) != len(graph):
        raise GraphError(
            f"lower_streams: the GraphModule has {len(by_name)} nodes but the commsched graph has {len(graph)}; "
            "expected the graph imported from this GraphModule (commsched.frontends.from_fx)"
        )
    out = []
    for name in graph.names:
        node = by_name.get(name)
        if node is None:
            raise GraphError(f"lower_streams: commsched node {name!r} has no FX node of that name in the GraphModule")
        out.append(node)
    return out


def _anchor(placeholders: list[torch.fx.Node], env: dict) -> torch.fx.Node | None:
    for node in placeholders:
        if isinstance(node.meta.get("val"), torch.Tensor):
            return env[node]
    return None


def _tensors_of(node: torch.fx.Node, env: dict, anchor: torch.fx.Node) -> Any:
    """The argument standing for ``node``'s tensors: [node] for a tensor, node itself for a tuple/list of
    tensors, else [anchor] (nothing to protect; the anchor only picks the device)."""
    val = node.meta.get("val")
    new_node = env.get(node, node)
    if isinstance(val, torch.Tensor):
        return [new_node]
    if isinstance(val, (tuple, list)) and val and all(isinstance(v, torch.Tensor) for v in val):
        return new_node
    return [anchor]

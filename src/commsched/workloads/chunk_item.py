"""``chunk_item(t, n, i)``: ``t.chunk(n)[i]``, traced by ``make_fx`` into the same FX graph at a fraction of the cost.

``make_fx`` tracks every output of a multi-output op: ``t.chunk(n)`` makes one ``aten.split.Tensor`` node and then,
for each of its ``n`` outputs, a ``getitem`` node with its own FakeTensor snapshot, tensor metadata and proxy slot;
:func:`commsched.workloads.trace.tidy_traced` later erases the ``n - 1`` getitems nothing reads. Ring attention's
all-gather rotation (``_AllGatherRotater.next_buffer``: ``buffer.chunk(cp)[i]`` at each of its ``cp`` steps) pays
this ``cp`` times per layer and pass: ``cp ** 2`` getitems, ~85 % of the nodes ``make_fx`` made at ``cp = 128``;
the head / tail halves of its load-balanced sequence (``x.chunk(2, dim=2)[i]``) one more per use.

Under ``make_fx`` this records what ``make_fx`` records (the split node with every output's snapshot in its
``meta['val']``, then the getitem of output ``i`` with its ``val`` and ``tensor_meta``) and only reserves the names of
the other getitems in the graph's namespace, in the order ``make_fx`` would have named them, so that every node
name after it is the same; the result is the same FX graph once the unused getitems are erased
(tests/workloads/test_trace_speed.py checks it node for node against ``t.chunk(n)[i]``). Outside ``make_fx``, or where
torch's tracer lacks the attributes used here, it is ``t.chunk(n)[i]`` itself.
"""

from __future__ import annotations

import operator

import torch

_SPLIT = torch.ops.aten.split.Tensor


def chunk_item(t: torch.Tensor, chunks: int, index: int, dim: int = 0) -> torch.Tensor:
    """``t.chunk(chunks, dim)[index]`` (``index`` may be negative; ``dim`` not), the unused chunks untracked by
    ``make_fx``."""
    tracer = _tracer()
    if tracer is None or not 0 <= dim < t.dim() or t.shape[dim] == 0:
        return t.chunk(chunks, dim)[index]
    from torch.fx.experimental import proxy_tensor as pt

    split_size = -(-t.shape[dim] // chunks)  # aten.chunk's split size: ceil(size / chunks)
    slot = pt.get_proxy_slot(t, tracer, None)
    if slot is None:  # a tensor the trace does not know (a constant): make_fx's own path
        return t.chunk(chunks, dim)[index]
    tail = () if dim == 0 else (dim,)  # make_fx records the arguments as given, a default dim left out
    # as proxy_call: the node first, then the op on the fake tensors (the proxy mode off, the fake mode on)
    node = tracer.create_proxy("call_function", _SPLIT, (slot.proxy, split_size, *tail), {},
                               name=tracer.graph._target_to_str(_SPLIT.overloadpacket.__name__))  # fmt: skip
    with pt.disable_proxy_modes_tracing():
        parts = _SPLIT(t, split_size, *tail)
    pt.set_meta(node, parts)
    k = index % len(parts)
    names = tracer.graph._graph_namespace
    getitem = tracer.graph._target_to_str(operator.getitem.__name__)
    for _ in range(k):  # the names the erased getitems before it would have taken
        names.create_name(getitem, None)
    item = node[k]
    pt.track_tensor(parts[k], item, constant=None, tracer=tracer)
    with pt.disable_proxy_modes_tracing():  # make_fx's metadata is taken before autograd gives the output history
        pt.set_meta(item, parts[k].detach())
    for _ in range(k + 1, len(parts)):
        names.create_name(getitem, None)
    return parts[k]


def _tracer() -> torch.fx.Tracer | None:
    """The tracer of the running ``make_fx`` (None: not tracing, or a torch without what :func:`chunk_item` uses)."""
    from torch.fx.experimental import proxy_tensor as pt

    mode = pt.get_proxy_mode()
    if mode is None or getattr(mode, "pre_dispatch", False):
        return None
    tracer = mode.tracer
    graph = getattr(tracer, "graph", None)
    needed = (hasattr(pt, name) for name in ("get_proxy_slot", "disable_proxy_modes_tracing", "set_meta",
                                             "track_tensor"))  # fmt: skip
    if graph is None or not hasattr(graph, "_graph_namespace") or not hasattr(graph, "_target_to_str"):
        return None
    return tracer if all(needed) else None

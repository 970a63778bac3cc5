"""Node tags of a traced zoo step: which FX nodes are an activation checkpoint's recompute and which are float8
training's kernels, so that ``commsched info`` (:mod:`commsched.report.shares`) and the HTML report can tell them
apart from the rest of the step.

A tag is set while ``make_fx`` traces (no-op otherwise): the nodes the tracer's graph gains inside
:func:`tagged` get the tag in ``node.meta[TAGS_KEY]`` (a frozenset, so nested regions add up), the technique torch's
own selective checkpoint uses to mark its nodes (``torch/utils/checkpoint.py``, ``_CachingTorchDispatchMode``:
``get_proxy_mode().tracer.graph`` before and after the op). ``commsched.frontends.fx.from_fx`` carries the tags into
the IR as ``graph.meta[NODE_TAGS_META]`` (tag -> node names).

* ``recompute``: a checkpointed block's second run, the recompute ``torch.utils.checkpoint`` issues in the backward
  (:func:`recomputing`, wrapped around the block function by ``commsched.workloads.ac``).
* ``float8``: a float8 linear's forward (its amax, scale and cast kernels and ``_scaled_mm``), its backward (the
  same, through autograd hooks on its grad_fn, minus any recompute the backward triggers when it unpacks a
  checkpointed input), and FSDP's float8 weight casts and scale precompute (:func:`float8_linear`,
  :func:`tagged`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

import torch

from commsched.ir.transform import FX_TAGS_KEY as TAGS_KEY

RECOMPUTE, FLOAT8 = "recompute", "float8"


def _tracer_graph() -> torch.fx.Graph | None:
    """The graph ``make_fx`` is recording into (None: not tracing)."""
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    mode = get_proxy_mode()
    return None if mode is None else mode.tracer.graph


def _tag_since(graph: torch.fx.Graph, count: int, tag: str, skip: str | None = None) -> None:
    """Tag the nodes ``graph`` gained after its first ``count`` (those already tagged ``skip`` left as they are)."""
    new = len(graph.nodes) - count
    for node in reversed(graph.nodes):
        if new <= 0:
            break
        new -= 1
        tags = node.meta.get(TAGS_KEY, frozenset())
        if skip is None or skip not in tags:
            node.meta[TAGS_KEY] = tags | {tag}


@contextlib.contextmanager
def tagged(tag: str) -> Iterator[None]:
    """Tag every node traced inside (nothing outside ``make_fx``)."""
    graph = _tracer_graph()
    count = len(graph.nodes) if graph is not None else 0
    try:
        yield
    finally:
        if graph is not None:
            _tag_since(graph, count, tag)


def recomputing(fn: Callable[..., Any]) -> Callable[..., Any]:
    """``fn`` whose calls after the first are tagged ``recompute``: a checkpointed function runs once in the forward,
    then again for each recompute in the backward."""
    calls = 0

    def run(*args: Any, **kwargs: Any) -> Any:
        nonlocal calls
        calls += 1
        with tagged(RECOMPUTE) if calls > 1 else contextlib.nullcontext():
            return fn(*args, **kwargs)

    return run


def float8_linear(linear: Callable[[torch.Tensor, Any], torch.Tensor], x: torch.Tensor, w: Any) -> torch.Tensor:
    """``linear(x, w)`` (a float8 linear) with its forward and backward tagged ``float8``."""
    with tagged(FLOAT8):
        out = linear(x, w)
    graph, node = _tracer_graph(), out.grad_fn
    if graph is None or node is None:
        return out
    start: list[int] = []
    node.register_prehook(lambda grads: start.append(len(graph.nodes)))
    # the backward unpacks its saved input first: under a checkpoint that runs the block's recompute (tagged there)
    node.register_hook(lambda grads_in, grads_out: _tag_since(graph, start.pop(), FLOAT8, skip=RECOMPUTE))
    return out

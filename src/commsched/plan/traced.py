"""The traced step a layout without PP is judged on: from this process's memory, the trace cache
(:mod:`commsched.execute.cache`) or traced afresh (and cached). With the trace, the cache keeps its cost analysis
(:func:`commsched.execute.cache.store_features`): a process that reads a trace back takes it instead of analysing the
graph again (most of a warm layout's costing).

A step with async TP (``StepConfig.async_tp``, torchtitan's ``enable_async_tensor_parallel``) is rewritten right after
its trace, while the ``GraphModule`` the rewrite needs is at hand (:func:`commsched.experiments.predict.async_tp_step`),
and the rewritten IR is what is cached, under a key that names async TP. The graph returned is then the program as
the framework runs it; cost it with :func:`as_traced`'s config, which does not ask for the rewrite again.
"""

from __future__ import annotations

import collections
import dataclasses
from typing import Any

_MEMORY: collections.OrderedDict[str, Any] = collections.OrderedDict()  # trace key -> Graph, this process's last few
_MEMORY_SIZE = 8


@dataclasses.dataclass(frozen=True)
class GraphOnly:
    """A traced step's IR alone (what :func:`predict_workload` reads of a Workload), as the trace cache keeps it."""

    graph: Any


def trace_key_of(config: Any) -> str:
    """The trace-cache key of ``config``'s step as plan judges it (FSDP bucketed per block; async TP applied)."""
    from commsched.execute import cache as trace_cache

    kw = {**config.build_kwargs(), "fsdp_bucket": "block"}
    if config.async_tp:  # the cached IR is the rewritten one
        kw["async_tp"] = True
    return trace_cache.trace_key(config.preset, kw.pop("parallel"), kw.pop("world_size"), kw.pop("layers", None), kw)


def as_traced(config: Any) -> Any:
    """``config`` as the graph :func:`traced` returns is costed: async TP is already in the graph."""
    return dataclasses.replace(config, async_tp=False) if config.async_tp else config


def traced(config: Any, cache: bool, hardware: Any = None, gpus_per_node: int | None = None) -> Any:
    """The graph of ``config``'s step as the framework runs it (see the module docstring). ``hardware`` (with
    ``gpus_per_node``): where async TP must run (a one-line ValueError where it cannot); needed only for async TP."""
    from commsched.execute import cache as trace_cache

    key = trace_key_of(config)
    graph = _MEMORY.get(key)
    if graph is None and cache:
        graph = trace_cache.load_trace(key)
        if graph is not None and not trace_cache.load_features(key, graph):
            trace_cache.store_features(key, graph)  # its cost analysis, kept for the next process that reads it
    if graph is None:
        graph = _trace(config, hardware, gpus_per_node)
        if cache:
            trace_cache.store_trace(key, graph)
            trace_cache.store_features(key, graph)
    _MEMORY[key] = graph
    _MEMORY.move_to_end(key)
    while len(_MEMORY) > _MEMORY_SIZE:
        _MEMORY.popitem(last=False)
    return graph


def _trace(config: Any, hardware: Any, gpus_per_node: int | None) -> Any:
    from commsched.experiments.predict import async_tp_step, trace

    workload = trace(config)
    if not config.async_tp:
        return workload.graph
    from commsched.hardware import for_graph

    if hardware is None:
        raise ValueError("async TP: the hardware it runs on is needed (symmetric-memory copies)")
    return async_tp_step(workload, for_graph(hardware, workload.graph, gpus_per_node=gpus_per_node))

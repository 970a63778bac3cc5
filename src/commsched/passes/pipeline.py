"""The pass pipeline: ``commsched.schedule(graph, hardware, passes=[...] | preset, **knobs) -> Schedule``."""

from __future__ import annotations

import gc
import json
import os
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from commsched.cost import resolve_costs
from commsched.io import read_input_json
from commsched.ir import Graph, GraphError, OpKind
from commsched.ir.order import as_order
from commsched.passes.check import check_schedule
from commsched.passes.registry import (
    PASSES,
    KnobNamespace,
    NoConfig,
    PassConfig,
    PassContext,
    PassResult,
    PassStats,
)

SCHEDULE_FORMAT = "commsched.schedule"
SCHEDULE_VERSION = 1

# named pipelines; "torch" is the pass list torch recommends for reorder_for_compute_comm_overlap_passes
PRESETS: dict[str, list[str]] = {
    "default": ["overlap"],
    "none": [],
    "torch": [
        "reorder_communication_preserving_peak_memory",
        "sink_waits_iterative",
        "reorder_communication_preserving_peak_memory",
    ],
    "classic": ["sink_waits", "raise_comms", "reorder_compute_for_overlap"],
}


PassItem = str | Callable[..., PassResult]


def resolve_passes(passes: str | Sequence[PassItem]) -> list[PassItem]:
    """The pass list ``passes`` names, presets expanded: a preset or pass name, a comma-separated string of them,
    or a sequence of names and callables (a pass ``fn(graph, order, ctx) -> PassResult``). ValueError naming the
    first unknown name, with the known passes and presets."""
    items = passes.split(",") if isinstance(passes, str) else list(passes)
    resolved: list[PassItem] = []
    for item in items:
        name = item.strip() if isinstance(item, str) else item
        if callable(name):
            resolved.append(name)
        elif name in PRESETS:
            resolved.extend(PRESETS[name])
        elif name in PASSES:
            resolved.append(name)
        elif name != "":  # "a,,b" and "" name nothing
            raise ValueError(f"unknown pass {name!r}; known passes: {sorted(PASSES)}; presets: {sorted(PRESETS)}")
    return resolved


def check_knobs(passes: str | Sequence[PassItem], knobs: Mapping[str, Any]) -> dict[str, PassConfig]:
    """The config of every registered pass of ``passes``, built from ``knobs`` (:class:`KnobNamespace`): what
    :func:`schedule` checks before any work. ValueError naming an unknown pass or knob, or a value that does not fit."""
    return KnobNamespace.of(resolve_passes(passes)).configs(knobs)


@dataclass
class Schedule:
    """An order of the graph's nodes (ids), optional compute streams, and what each pass did."""

    graph: Graph
    order: np.ndarray
    streams: np.ndarray | None = None
    stats: list[PassStats] = field(default_factory=list)
    passes: list[str] = field(default_factory=list)

    @property
    def names(self) -> list[str]:
        return [self.graph.names[i] for i in self.order.tolist()]

    def to_dict(self) -> dict[str, Any]:
        d: dict[str, Any] = {
            "format": SCHEDULE_FORMAT,
            "version": SCHEDULE_VERSION,
            "num_nodes": len(self.graph),
            "passes": self.passes,
            "order": self.names,
        }
        if self.streams is not None:
            d["streams"] = [int(s) for s in self.streams[self.order].tolist()]
        return d

    def save(self, path: str | os.PathLike[str]) -> None:
        from commsched.io import atomic_write_text

        atomic_write_text(path, json.dumps(self.to_dict()))


def load_schedule(graph: Graph, path: str | os.PathLike[str]) -> Schedule:
    """Read a schedule written by :meth:`Schedule.save` for ``graph`` (node names must match)."""
    path = Path(path)
    try:
        data = read_input_json(path, "schedule")
    except FileNotFoundError:
        raise GraphError(f"{path}: no such file") from None
    except ValueError as exc:
        raise GraphError(str(exc)) from None
    if not isinstance(data, dict) or data.get("format") != SCHEDULE_FORMAT:
        raise GraphError(f"{path}: field 'format': expected {SCHEDULE_FORMAT!r}")
    if data.get("version") != SCHEDULE_VERSION:
        raise GraphError(f"{path}: field 'version': unknown schedule version {data.get('version')!r}")
    names = data.get("order")
    if not isinstance(names, list) or not all(isinstance(x, str) for x in names):
        raise GraphError(f"{path}: field 'order': expected a list of node names")
    try:
        order = as_order(graph, names)
    except GraphError as exc:
        raise GraphError(f"{path}: field 'order': {exc}") from None
    streams = None
    if "streams" in data:
        s = data["streams"]
        if not isinstance(s, list) or len(s) != len(order) or not all(isinstance(x, int) and x >= 0 for x in s):
            raise GraphError(f"{path}: field 'streams': expected one stream id (int >= 0) per entry of 'order'")
        streams = np.zeros(len(graph), np.int32)
        streams[order] = s
    passes = data.get("passes", [])
    return Schedule(graph, order, streams, passes=list(passes) if isinstance(passes, list) else [])


def inputs_first(graph: Graph, order: np.ndarray) -> np.ndarray:
    """``order`` with the graph inputs moved to the front (stable): they have no predecessors, and FX code reads
    best with placeholders first."""
    is_input = graph.kinds[order] == OpKind.INPUT
    if is_input[: int(is_input.sum())].all():
        return order
    return np.concatenate([order[is_input], order[~is_input]]).astype(np.int32)


@contextmanager
def _gc_paused() -> Iterator[None]:
    """Passes build many small lists and tuples and no reference cycles; Python's cyclic collector would rescan the
    whole heap again and again while they do (superlinear time on 100k-node graphs), so it waits until they return."""
    enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if enabled:
            gc.enable()


def schedule(
    graph: Graph,
    hardware: Any,
    passes: str | Sequence[PassItem] = "default",
    *,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
    order: np.ndarray | Sequence[int | str] | None = None,
    check: bool = True,
    **knobs: Any,
) -> Schedule:
    """Run ``passes`` (see :func:`resolve_passes`; default: our ``overlap`` pass) on ``graph`` and return the
    resulting :class:`Schedule`.

    ``hardware`` is a profile name or ``.toml`` path (on ``num_nodes`` nodes of ``gpus_per_node`` GPUs; by default
    as many nodes as the graph's world size needs), a Hardware, or a precomputed CostEstimate
    (``commsched.cost.resolve_costs``). ``knobs`` set pass config fields: ``memory_budget=1.1`` on every pass that
    has the field, ``overlap={"waits": "late"}`` on one pass (:class:`KnobNamespace`); names, types and allowed
    values are checked before any work. Every pass result is checked (topological order, per-group collective
    order) unless ``check=False``.
    """
    names = resolve_passes(passes)
    configs = KnobNamespace.of(names).configs(knobs)
    costs = resolve_costs(graph, hardware, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
    cur = as_order(graph, order)
    reference = cur.copy()
    extra_src = np.zeros(0, np.int32)
    extra_dst = np.zeros(0, np.int32)
    streams: np.ndarray | None = None
    all_stats: list[PassStats] = []
    pass_names: list[str] = []
    for p in names:
        if callable(p):
            fn, cfg, pname = p, NoConfig(), getattr(p, "__name__", "custom")
        else:
            fn, cfg, pname = PASSES[p].fn, configs[p], p
        ctx = PassContext(costs=costs, config=cfg, extra_src=extra_src, extra_dst=extra_dst, streams=streams)
        t0 = time.perf_counter()
        with _gc_paused():
            result = fn(graph, cur, ctx)
        wall = time.perf_counter() - t0
        result.stats.wall_s = wall
        if check:
            check_schedule(
                graph,
                result.order,
                reference,
                allow_collective_reorder=result.reorders_collectives,
                streams=result.streams,
                extra_src=extra_src,
                extra_dst=extra_dst,
            )
        if result.reorders_collectives:
            reference = result.order.copy()
        cur = inputs_first(graph, result.order.astype(np.int32, copy=False))
        if result.streams is not None:
            streams = result.streams
        if result.extra_src is not None and len(result.extra_src):
            extra_src = np.concatenate([extra_src, result.extra_src]).astype(np.int32)
            extra_dst = np.concatenate([extra_dst, result.extra_dst]).astype(np.int32)
        all_stats.append(result.stats)
        pass_names.append(pname)
    return Schedule(graph, cur, streams, all_stats, pass_names)

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
from commsched.ir.order import as_order, collective_chains
from commsched.passes.check import check_given_order, check_schedule
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
# a schedule file with streams but no 'compute_interference' (written before it was recorded): multi_stream's default
DEFAULT_COMPUTE_INTERFERENCE = 1.0

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
    """An order of the graph's nodes (ids), optional compute streams, and what each pass did.

    ``compute_interference``: with several compute streams, the share of the time kernels overlap that the pass
    that placed them charged as contention (the simulator runs concurrent kernels at full speed each); every
    prediction of this schedule adds it (:func:`commsched.report.step.predict`), so it has one step time
    everywhere.

    ``reordered_by``: the passes that changed a process group's collective order on purpose (``reorder_collectives``:
    a deterministic order every rank computes alike). The file records them and each group's resulting issue order
    (``collective_order``), so ``commsched check`` verifies the schedule against that order instead of refusing it."""

    graph: Graph
    order: np.ndarray
    streams: np.ndarray | None = None
    stats: list[PassStats] = field(default_factory=list)
    passes: list[str] = field(default_factory=list)
    compute_interference: float = 0.0
    reordered_by: list[str] = field(default_factory=list)
    recorded_chains: dict[int, np.ndarray] | None = None  # loaded from a file: group index -> collective ids

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
            d["compute_interference"] = self.compute_interference
        if self.reordered_by:
            chains = collective_chains(self.graph, self.order)
            d["collectives_reordered_by"] = list(self.reordered_by)
            d["collective_order"] = {
                self.graph.groups[grp].name: [self.graph.names[c] for c in colls.tolist()]
                for grp, colls in chains.items()
            }
        return d

    def save(self, path: str | os.PathLike[str]) -> None:
        from commsched.io import atomic_write_text

        atomic_write_text(path, json.dumps(self.to_dict()))


def _read(path: Path, what: str) -> Any:
    try:
        return read_input_json(path, what)
    except FileNotFoundError:
        raise GraphError(f"{path}: no such file") from None
    except ValueError as exc:
        raise GraphError(str(exc)) from None


def load_schedule(graph: Graph, path: str | os.PathLike[str], *, allow_collective_reorder: bool = False) -> Schedule:
    """Read a schedule written by :meth:`Schedule.save` for ``graph`` (node names must match), checked as every
    given order is (:func:`commsched.passes.check.check_given_order`: topological, each group's collectives in the
    graph's order or in the order the file records, forced issue order across its streams; ScheduleError naming the
    file). ``allow_collective_reorder``: accept any per-group collective order (``check
    --allow-collective-reorder``)."""
    path = Path(path)
    return _schedule_of(graph, _read(path, "schedule"), path, allow_collective_reorder)


def load_order(graph: Graph, path: str | os.PathLike[str], *, allow_collective_reorder: bool = False) -> Schedule:
    """A schedule file (:func:`load_schedule`) or a plain JSON list of node names (or ids), checked alike: what
    ``simulate --order`` and ``commsched check`` read."""
    path = Path(path)
    data = _read(path, "schedule (a schedule file or a JSON list of node names)")
    if isinstance(data, dict) and data.get("format") == SCHEDULE_FORMAT:
        return _schedule_of(graph, data, path, allow_collective_reorder)
    if not isinstance(data, list) or not all(isinstance(v, (str, int)) and not isinstance(v, bool) for v in data):
        raise GraphError(f"{path}: expected a schedule file (commsched schedule -o) or a JSON list of node names")
    try:
        order = as_order(graph, data)
    except GraphError as exc:  # a ScheduleError stays one
        raise type(exc)(f"{path}: {exc}") from None
    return Schedule(graph, check_given_order(graph, order, allow_collective_reorder=allow_collective_reorder,
                                             where=str(path)))  # fmt: skip


def _schedule_of(graph: Graph, data: Any, path: Path, allow_collective_reorder: bool = False) -> Schedule:
    """The checked :class:`Schedule` of a schedule file's JSON ``data``."""
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
    interference = data.get("compute_interference", DEFAULT_COMPUTE_INTERFERENCE if streams is not None else 0.0)
    if isinstance(interference, bool) or not isinstance(interference, (int, float)) or not interference >= 0:
        raise GraphError(f"{path}: field 'compute_interference': expected a number >= 0, got {interference!r}")
    passes = data.get("passes", [])
    reordered_by, chains = _reordered_by(graph, data, path)
    check_given_order(graph, order, streams=streams, recorded_chains=chains,
                      allow_collective_reorder=allow_collective_reorder, where=str(path))  # fmt: skip
    return Schedule(graph, order, streams, passes=list(passes) if isinstance(passes, list) else [],
                    compute_interference=float(interference), reordered_by=reordered_by,
                    recorded_chains=chains)  # fmt: skip


def _reordered_by(graph: Graph, data: dict[str, Any], path: Path) -> tuple[list[str], dict[int, np.ndarray] | None]:
    """The file's ``collectives_reordered_by`` (pass names) and its ``collective_order`` (group index -> collective
    ids in the recorded issue order), checked to name every group's collectives once; ([], None) when the file
    records no reordering."""
    by = data.get("collectives_reordered_by", [])
    if not isinstance(by, list) or not all(isinstance(x, str) for x in by):
        raise GraphError(f"{path}: field 'collectives_reordered_by': expected a list of pass names")
    if not by:
        return [], None
    recorded = data.get("collective_order")
    groups = {grp.name: k for k, grp in enumerate(graph.groups)}
    want = {k: sorted(graph.names[c] for c in colls.tolist()) for k, colls in
            collective_chains(graph, np.arange(len(graph), dtype=np.int32)).items()}  # fmt: skip
    if not isinstance(recorded, dict) or {groups.get(name, -1) for name in recorded} != set(want):
        raise GraphError(f"{path}: field 'collective_order': expected each process group of the graph with its "
                         "collectives in issue order (it comes with 'collectives_reordered_by')")  # fmt: skip
    ids = {name: i for i, name in enumerate(graph.names)}
    chains = {}
    for name, names in recorded.items():
        if not isinstance(names, list) or sorted(map(str, names)) != want[groups[name]]:
            raise GraphError(f"{path}: field 'collective_order' group {name!r}: expected each of the group's "
                             f"{len(want[groups[name]])} collectives once")  # fmt: skip
        chains[groups[name]] = np.array([ids[n] for n in names], np.int32)
    return list(by), chains


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
    interference = 0.0
    reordered_by: list[str] = []
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
            if not np.array_equal(collective_chains_flat(graph, reference), collective_chains_flat(graph, cur)):
                reordered_by.append(pname)
        cur = inputs_first(graph, result.order.astype(np.int32, copy=False))
        if result.streams is not None:
            streams = result.streams
            # the contention the placing pass charged (multi_stream: compute_interference, unless interference off)
            interference = float(getattr(cfg, "compute_interference", 0.0)) if getattr(cfg, "interference", 1) else 0.0
        if result.extra_src is not None and len(result.extra_src):
            extra_src = np.concatenate([extra_src, result.extra_src]).astype(np.int32)
            extra_dst = np.concatenate([extra_dst, result.extra_dst]).astype(np.int32)
        all_stats.append(result.stats)
        pass_names.append(pname)
    return Schedule(graph, cur, streams, all_stats, pass_names, compute_interference=interference,
                    reordered_by=reordered_by)  # fmt: skip


def collective_chains_flat(graph: Graph, order: np.ndarray) -> np.ndarray:
    """Every collective in ``order``'s issue order, grouped by process group (group index, then issue order): two
    orders issue each group's collectives alike iff these are equal."""
    colls = order[graph.coll_type[order] >= 0]
    return colls[np.argsort(graph.coll_group[colls], kind="stable")]

"""Pipeline stages traced once per machine, and a long stage costed from two short traces.

**Trace cache.** A stage's traced program (:func:`commsched.pipeline.stages.trace_stage`) is kept on disk with the
project's trace cache (:mod:`commsched.execute.cache`: the graph's arrays under ``traces/``, a key of
everything that changes the trace plus commsched's source fingerprint and torch's version) and in memory. The key
holds the whole micro-batch spec (model, TP plan, micro-batch size, sequence, dtypes, AC, float8, ...: its ``repr``,
hashed) and the stage's shape (first, layers, last); the forward / weight-gradient masks and the byte counts travel
in the graph's ``meta``. An unreadable entry is a miss and is rewritten.

**Layer scaling.** A stage's programs repeat one transformer block: with the embedding and the head fixed, F, B, I,
W (int64 ns, as the simulator times them) and the activation bytes grow by the same amount per block once the
blocks reach their steady state (the first block's TP collectives find the streams idle, so its increment differs
by a few ns; from the second on they repeat, to the ns rounding of the compute slowdown). So a stage of L > K + 1
layers is traced at K and K + 1 layers (:data:`SCALE_LAYERS`) and extrapolated, ``y(L) = y(K) + (L - K) x (y(K + 1)
- y(K))`` (:func:`extrapolate`; ``benchmarks/bench_published.py``'s ``--layers-scale`` does the same for whole
steps), which ``tests/pipeline/test_pipeline_optimize.py`` checks against full traces to 1e-6 and
``benchmarks/bench_pipeline.py`` on the 405B stages. Every layer count then shares the same few traces: one
(first, K, last) and (first, K + 1, last) per kind of stage and micro-batch size.

**Records.** Each stage's costs per hardware (``records/``), torch's lowered schedules (``programs/``) and each
pipeline rank's optimizer-step seconds (``tails/``, :func:`cached_seconds`) are kept as small JSON files, so a warm
process neither traces nor imports torch's pipelining.
"""

from __future__ import annotations

import copy
import dataclasses
import functools
import hashlib
import json
from collections.abc import Callable
from pathlib import Path
from typing import Any

import numpy as np

from commsched.pipeline.stage_memory import backward_peak_bytes
from commsched.pipeline.stages import StageTimesS, TracedStage, async_tp_stage, stage_seconds, trace_stage

SCALE_LAYERS = 2
"""K: a stage of more than K + 1 layers is costed from traces of K and K + 1 layers (:func:`stage_record`)"""
_META_KEY = "pipeline_stage_cache"

_TRACED: dict[str, TracedStage] = {}
_RECORDS: dict[tuple, StageRecord] = {}


@dataclasses.dataclass(frozen=True)
class StageRecord:
    """What a stage costs per micro-batch on one hardware: F, B, I, W seconds, the activations it holds from its
    forward to its backward, the hidden state it sends; ``traced_layers``: the layer counts traced for it (one: the
    stage itself; two: K and 2K, extrapolated)."""

    times: StageTimesS
    activation_bytes: int
    send_bytes: int
    traced_layers: tuple[int, ...]
    backward_peak_bytes: int = 0  # the backward's transient (stage_memory.backward_peak_bytes)


def stage_key(spec: Any, first: bool, layers: int, last: bool, policies: tuple[str, ...] | None = None) -> str:
    """The trace-cache key of one stage program (see the module docstring); ``policies``: its blocks' AC policies
    (None: none checkpointed)."""
    from commsched.execute.cache import trace_key

    options = {"spec": _spec_digest(spec), "first": bool(first), "last": bool(last)}
    if policies is not None:
        options["ac"] = list(policies)
    return trace_key(f"pipeline-stage:{spec.model.name}", spec.plan.parallel, spec.plan.world_size, layers, options)


@functools.lru_cache(maxsize=64)
def _spec_digest(spec: Any) -> str:
    """A hash of the spec's repr (every field: model, plan, shapes, dtypes, AC, float8, the parameter layout)."""
    return hashlib.sha256(repr(spec).encode()).hexdigest()[:32]


def cached_trace(spec: Any, first: bool, layers: int, last: bool, *, disk: bool = True,
                 policies: tuple[str, ...] | None = None) -> TracedStage:  # fmt: skip
    """:func:`trace_stage`, from memory, else from the disk cache (``disk``), else traced (and stored)."""
    from commsched.execute.cache import load_trace, store_trace

    key = stage_key(spec, first, layers, last, policies)
    hit = _TRACED.get(key)
    if hit is None and disk:
        hit = _from_graph(load_trace(key))
    if hit is None:
        hit = trace_stage(spec, first, layers, last, policies)
        if disk:
            store_trace(key, _to_graph(hit))
    _TRACED[key] = hit
    return hit


def _to_graph(traced: TracedStage) -> Any:
    """The graph with the masks and byte counts in its meta (what the JSON format stores)."""
    meta = {**traced.graph.meta, _META_KEY: {
        "forward": np.flatnonzero(traced.forward).tolist(), "weight": np.flatnonzero(traced.weight).tolist(),
        "activation_bytes": int(traced.activation_bytes), "send_bytes": int(traced.send_bytes)}}  # fmt: skip
    graph = copy.copy(traced.graph)  # the same columns; only the meta differs
    graph.meta = meta
    return graph


def _from_graph(graph: Any) -> TracedStage | None:
    """A TracedStage from a cached graph, or None if it does not hold one (a miss)."""
    info = None if graph is None else graph.meta.get(_META_KEY)
    if not isinstance(info, dict):
        return None
    try:
        masks = []
        for name in ("forward", "weight"):
            mask = np.zeros(len(graph), bool)
            mask[np.asarray(info[name], dtype=np.int64)] = True
            masks.append(mask)
        return TracedStage(graph, masks[0], masks[1], int(info["activation_bytes"]), int(info["send_bytes"]))
    except (KeyError, IndexError, TypeError, ValueError):
        return None


def stage_record(
    spec: Any, shape: tuple[bool, int, bool], hardware: Any, *, scale: bool = True, disk: bool = True,
    policies: tuple[str, ...] | None = None, fusion: bool = True, async_tp: bool = False,
) -> StageRecord:  # fmt: skip
    """The costs of the stage ``shape`` = (first, layers, last) of ``spec`` on ``hardware``, from memory, else the
    disk cache (``disk``: under a key of the stage's trace key, the hardware's content and the cost data), else
    traced and simulated; with ``scale`` a stage of more than K + 1 layers (:data:`SCALE_LAYERS`) from traces of K
    and K + 1 layers (its blocks under one AC policy: ``policies`` None or all equal). ``fusion``: the kernels
    fused as a compiled block's (:func:`commsched.pipeline.stages.stage_seconds`). ``async_tp``: each trace rewritten
    by :func:`commsched.pipeline.stages.async_tp_stage` (traced afresh: the rewrite needs the GraphModule), the
    record kept as any other."""
    first, layers, last = shape
    scale = scale and scalable(policies)
    mem_key = (spec, tuple(shape), _hardware_key(hardware), scale, policies, fusion, async_tp)
    hit = _RECORDS.get(mem_key)
    if hit is not None:  # a plan's worker looks up the same few stage shapes for every layout it judges
        return hit
    path = _record_path(spec, shape, hardware, scale, policies, fusion, async_tp) if disk else None
    if path is not None:
        hit = _record_from_json(_read_json(path))
    if hit is None:
        hit = _record(spec, first, layers, last, hardware, scale, disk, policies, fusion, async_tp)
        if path is not None:
            _write_json(path, {**dataclasses.asdict(hit.times), "activation_bytes": hit.activation_bytes,
                               "send_bytes": hit.send_bytes, "traced_layers": list(hit.traced_layers),
                               "backward_peak_bytes": hit.backward_peak_bytes})  # fmt: skip
    _RECORDS[mem_key] = hit
    return hit


def scalable(policies: tuple[str, ...] | None) -> bool:
    """Whether a stage whose blocks run ``policies`` may be costed from shorter traces: all blocks alike."""
    return policies is None or len(set(policies)) == 1


def policies_at(policies: tuple[str, ...] | None, count: int, layers: int) -> tuple[str, ...] | None:
    """The AC policies of a ``count``-layer trace standing for a ``layers``-layer stage whose blocks run
    ``policies``: its own at full length, else the (shared) policy of a :func:`scalable` stage, ``count`` times."""
    if policies is None or count == layers:
        return policies
    return (policies[0],) * count


def _record(spec: Any, first: bool, layers: int, last: bool, hardware: Any, scale: bool, disk: bool,
            policies: tuple[str, ...] | None, fusion: bool, async_tp: bool = False) -> StageRecord:  # fmt: skip
    k = SCALE_LAYERS
    counts = (k, k + 1) if scale and layers > k + 1 else (layers,)
    parts = []
    for count in counts:
        at = policies_at(policies, count, layers)
        if async_tp:
            traced = async_tp_stage(trace_stage(spec, first, count, last, at), spec, hardware)
        else:
            traced = cached_trace(spec, first, count, last, disk=disk, policies=at)
        secs = stage_seconds(traced, hardware, fusion=fusion)
        parts.append((*_ns(secs), traced.activation_bytes, traced.send_bytes, backward_peak_bytes(traced)))
    values = parts[0] if len(parts) == 1 else extrapolate(parts[0], parts[1], k, layers)
    return StageRecord(StageTimesS(*(v * 1e-9 for v in values[:4])), int(values[4]), int(values[5]), counts,
                       max(int(values[6]), 0))  # fmt: skip


def _record_from_json(data: Any) -> StageRecord | None:
    try:
        times = StageTimesS(*(float(data[f.name]) for f in dataclasses.fields(StageTimesS)))
        return StageRecord(times, int(data["activation_bytes"]), int(data["send_bytes"]),
                           tuple(int(x) for x in data["traced_layers"]), int(data["backward_peak_bytes"]))  # fmt: skip
    except (KeyError, TypeError, ValueError):
        return None


def _record_path(spec: Any, shape: tuple[bool, int, bool], hardware: Any, scale: bool,
                 policies: tuple[str, ...] | None = None, fusion: bool = True,
                 async_tp: bool = False) -> Path:  # fmt: skip
    from commsched.hardware import for_graph

    hw = for_graph(hardware, world_size=spec.plan.world_size)
    table = _file_digest(Path(hw.table_path)) if hw.table_path else ""
    key = _digest({"stage": stage_key(spec, *shape, policies), "hardware": repr(hw), "table": table, "scale": scale,
                   "scale_layers": SCALE_LAYERS, "cost_data": _cost_data_digest(),
                   **({} if fusion else {"fusion": False}), **({"async_tp": True} if async_tp else {})})  # fmt: skip
    return _root() / "records" / f"{key}.json"


def cached_seconds(kind: str, spec: Any, key: dict[str, Any], hardware: Any,
                   compute: Callable[[], tuple[float, ...]]) -> tuple[float, ...]:  # fmt: skip
    """``compute()`` (a few seconds values of ``spec`` on ``hardware``, a Hardware) from the disk cache under
    ``kind`` / ``key`` (with the spec, the hardware's content, the cost data and the versions), else computed and
    stored: what a warm run would otherwise trace again (each rank's optimizer step)."""
    table = _file_digest(Path(hardware.table_path)) if hardware.table_path else ""
    whole = {**key, "spec": _spec_digest(spec), "hardware": repr(hardware), "table": table,
             "cost_data": _cost_data_digest()}  # fmt: skip
    path = _root() / kind / f"{_digest(whole)}.json"
    data = _read_json(path)
    if isinstance(data, list) and data and all(isinstance(x, int | float) for x in data):
        return tuple(float(x) for x in data)
    out = tuple(compute())
    _write_json(path, list(out))
    return out


def cached_program(name: str, pp_size: int, microbatches: int, v: int, defer_recv: bool, lower: Any, make: Any) -> Any:
    """``lower(name, pp_size, microbatches, v, defer_recv)`` (torch's lowering: a ``PipelineProgram``) from the
    disk cache when an earlier process lowered the same schedule with the same torch (rebuilt by ``make``, the
    program class), else lowered and stored: a warm run never imports ``torch.distributed.pipelining`` (seconds)."""
    args = {"schedule": name, "pp_size": pp_size, "microbatches": microbatches, "v": v, "defer_recv": defer_recv}
    path = _root() / "programs" / f"{_digest(args)}.json"
    data = _read_json(path)
    try:
        arrays = [np.asarray(rows, dtype=np.int32).reshape(-1, 6) for rows in data["actions"]]
        s2r = np.asarray(data["stage_to_rank"], dtype=np.int32)
        for arr in (*arrays, s2r):
            arr.flags.writeable = False
        return make(name, pp_size, microbatches, v, s2r, tuple(arrays))
    except (KeyError, TypeError, ValueError):
        pass  # absent or unreadable: a miss
    program = lower(name, pp_size, microbatches, v, defer_recv)
    _write_json(path, {"stage_to_rank": program.stage_to_rank.tolist(),
                       "actions": [acts.tolist() for acts in program.actions]})  # fmt: skip
    return program


def _root() -> Path:
    from commsched.execute.cache import cache_dir

    return cache_dir() / "pipeline"


def _digest(obj: Any) -> str:
    """A key of ``obj`` and the versions that decide a result (commsched with its source fingerprint, torch)."""
    from commsched.execute.base import versions

    text = json.dumps({"key": obj, **versions()}, sort_keys=True, separators=(",", ":"))
    return hashlib.sha256(text.encode()).hexdigest()[:32]


@functools.cache
def _cost_data_digest() -> str:
    """The cost model's data files (fusible ops, NCCL tables) and the hardware profiles: not in the source
    fingerprint, but they change a stage's seconds."""
    import commsched

    root = Path(commsched.__file__).parent
    h = hashlib.sha256()
    for folder in (root / "cost" / "data", root / "hardware"):
        for path in sorted(p for p in folder.rglob("*") if p.is_file() and p.suffix != ".py"):
            h.update(str(path.relative_to(root)).encode())
            h.update(path.read_bytes())
    return h.hexdigest()[:16]


def _file_digest(path: Path) -> str:
    try:
        return hashlib.sha256(path.read_bytes()).hexdigest()[:16]
    except OSError:
        return "missing"


def _read_json(path: Path) -> Any:
    """The JSON at ``path``, or None (absent or unreadable: a miss)."""
    from commsched.io import read_input_json

    try:
        return read_input_json(path, "pipeline cache entry")
    except (OSError, ValueError):
        return None


def _write_json(path: Path, obj: Any) -> None:
    """Write atomically; a full disk or a read-only cache folder only costs the next run the work."""
    from commsched.io import atomic_write_text

    try:
        atomic_write_text(path, json.dumps(obj, separators=(",", ":"), allow_nan=False))
    except (OSError, ValueError):
        return


def extrapolate(at_k: tuple[int, ...], at_k1: tuple[int, ...], k: int, layers: int) -> tuple[int, ...]:
    """Integers at ``layers`` from their values at ``k`` and ``k + 1`` layers, linear in the layer count."""
    return tuple(a + (layers - k) * (b - a) for a, b in zip(at_k, at_k1, strict=True))


def _ns(secs: StageTimesS) -> tuple[int, int, int, int]:
    """F, B, I, W back in the simulator's int64 ns (stage_seconds made them from ns: exact)."""
    return tuple(round(v * 1e9) for v in (secs.forward_s, secs.backward_s, secs.backward_input_s,
                                           secs.backward_weight_s))  # type: ignore[return-value]  # fmt: skip


def _hardware_key(hardware: Any) -> Any:
    """``hardware`` as a memo key: a profile name or path as given, else the object's repr (frozen dataclasses)."""
    return hardware if isinstance(hardware, str) else repr(hardware)


def clear_memory() -> None:
    """Forget the in-process traces and records (the disk cache stays): what a new process starts with, but for
    the optimizer steps (:func:`commsched.pipeline.per_step.clear_tails`)."""
    from commsched.pipeline import stages

    _TRACED.clear()
    _RECORDS.clear()
    stages.trace_stage.cache_clear()

"""One task of a sweep, as a pure function of its spec: trace one (preset, parallel, world size, FSDP buckets) (or
take it from the trace cache), then estimate, schedule (or ``optimize``) and simulate it on every hardware profile.

The spec is plain data plus the hardware profiles by content (``Hardware`` values resolved on the driver), so a
worker on another machine computes the same rows as the driver would; the rows come back as plain dicts
(:meth:`commsched.experiments.sweep_row.SweepRow.to_dict`), each stamped with the commsched / torch / numpy versions.
It runs in any process: the driver, a local worker, a Ray actor (whose memory keeps the last traces).
"""

from __future__ import annotations

import collections
import functools
import os
import socket
import time
from typing import Any

from commsched.execute.base import error_text, versions

TaskSpec = dict[str, Any]
"""``index, preset, parallel, world_size, layers, schedule, gpus_per_node, build_kw (dict), hardware ([(name,
Hardware)]), optimize ([bool]), cache (bool)``; a pipeline sweep's tasks also ``pipeline``, the row fields it fixes
(:mod:`commsched.experiments.sweep_pipeline`)"""

_MEMORY: collections.OrderedDict[str, Any] = collections.OrderedDict()  # trace key -> Graph, this process's last few
_MEMORY_SIZE = 4

# a degree option only means something to the parallelisms with that mesh dimension; sweeping "fsdp,fsdp+tp" with
# tp_size=8 gives it to fsdp+tp alone (the workload builder rejects tp_size for fsdp)
_DEGREE_OPTIONS = {"tp_size": "tp", "ep_size": "ep"}


@functools.cache
def warm_imports() -> None:
    """What a task imports first (torch and a first trace's lazy imports, the passes, numba) and numba's cached
    compiled loops (:func:`commsched.sim.jit.load_cached`: what a first simulation would load), once per process
    with the cyclic collector paused and then frozen (:func:`commsched.heap.imports_settled`). A local pool calls
    it before it forks its workers (:func:`commsched.execute.base.warm_imports_of`), which so inherit all of it,
    and a sweep that will trace here before it checks its names (which imports the same)."""
    from commsched.heap import imports_settled

    with imports_settled():
        import commsched.cost
        import commsched.passes
        import commsched.report.step
        import commsched.sim  # noqa: F401
        from commsched.sim.jit import load_cached
        from commsched.workloads.trace import settle_imports

        settle_imports()
        load_cached()


def build_options(parallel: str, build_kw: dict[str, Any]) -> dict[str, Any]:
    """The subset of ``build_kw`` that :func:`commsched.workloads.build` should get for ``parallel``."""
    dims = set(parallel.split("+"))
    return {k: v for k, v in build_kw.items() if k not in _DEGREE_OPTIONS or _DEGREE_OPTIONS[k] in dims}


def row_head(spec: TaskSpec, hardware: str, optimize: bool) -> dict[str, Any]:
    """The fields every row of ``spec`` on ``hardware`` starts with (a pipeline task's P, schedule, M and V too)."""
    return {
        "preset": spec["preset"], "parallel": spec["parallel"], "world_size": spec["world_size"],
        "hardware": hardware, "schedule": spec["schedule"], "optimize": optimize,
        "fsdp_bucket": spec["build_kw"].get("fsdp_bucket", "param"),
        "pid": os.getpid(), "host": socket.gethostname(), **versions(), **spec.get("pipeline", {}),
    }  # fmt: skip


def error_rows(spec: TaskSpec, error: str, **fields: Any) -> list[dict[str, Any]]:
    """Every row of ``spec`` failed with ``error`` (also the executor's ``fail`` for a task whose worker died)."""
    from commsched.experiments.sweep_row import SweepRow

    out = []
    for name, _ in spec["hardware"]:
        for opt in spec["optimize"]:
            head = {**row_head(spec, name, opt), "pid": -1, "host": ""}
            out.append(SweepRow(**{**head, **fields}, error=error).to_dict())
    return out


def _trace(spec: TaskSpec, need_module: bool) -> tuple[Any, Any, bool]:
    """(graph, GraphModule or None, whether the graph came from a cache). A sweep that optimizes needs the FX
    module, which only a trace gives; its graph still refreshes the cache."""
    from commsched.execute import cache as trace_cache

    options = build_options(spec["parallel"], spec["build_kw"])
    key = trace_cache.trace_key(spec["preset"], spec["parallel"], spec["world_size"], spec["layers"], options)
    if not need_module and spec["cache"]:
        graph = _MEMORY.get(key) or trace_cache.load_trace(key)
        if graph is not None:
            _remember(key, graph)
            return graph, None, True
    from commsched.workloads import build

    w = build(spec["preset"], parallel=spec["parallel"], world_size=spec["world_size"], layers=spec["layers"],
              **options)  # fmt: skip
    if spec["cache"]:
        trace_cache.store_trace(key, w.graph)
        _remember(key, w.graph)
    return w.graph, w.graph_module, False


def _remember(key: str, graph: Any) -> None:
    _MEMORY[key] = graph
    _MEMORY.move_to_end(key)
    while len(_MEMORY) > _MEMORY_SIZE:
        _MEMORY.popitem(last=False)


def run_task(spec: TaskSpec) -> list[dict[str, Any]]:
    """The rows of one task: for each hardware profile, for each optimize setting. Never raises for a bad
    configuration: a trace that fails gives error rows, a profile that fails its own row."""
    t0 = time.perf_counter()
    try:
        graph, gm, cached = _trace(spec, need_module=any(spec["optimize"]))
    except Exception as exc:
        return error_rows(spec, error_text("trace", exc), trace_wall_s=time.perf_counter() - t0)
    trace_wall_s = time.perf_counter() - t0
    rows = []
    for name, hw in spec["hardware"]:
        for opt in spec["optimize"]:
            rows.append(_evaluate(spec, graph, gm, name, hw, opt, trace_wall_s, cached).to_dict())
    return rows


def _evaluate(spec: TaskSpec, g: Any, gm: Any, name: str, profile: Any, optimize: bool, trace_wall_s: float,
              cached: bool) -> Any:  # fmt: skip
    """Estimate, schedule (or optimize) and simulate one traced workload on one hardware profile."""
    from commsched.experiments.sweep_row import SweepRow
    from commsched.hardware import for_graph, nodes_for_world

    meta = g.meta
    common = {
        **row_head(spec, name, optimize),
        "layers": int(meta.get("layers", -1)),
        "num_graph_nodes": len(g),
        "tokens_per_step": int(meta.get("tokens_per_step", -1)),
        "fsdp_pad_bytes": int(meta.get("padding", {}).get("fsdp_all_gather_pad_bytes", 0)),
        "trace_wall_s": trace_wall_s,
        "trace_cached": cached,
    }
    stage = "hardware"
    try:
        gpn = spec["gpus_per_node"]
        nodes = nodes_for_world(spec["world_size"], gpn or profile.gpus_per_node)
        hw = for_graph(profile, num_nodes=nodes, gpus_per_node=gpn)
        common.update(num_nodes=hw.num_nodes, gpus_per_node=hw.gpus_per_node)
        stage = "optimize" if optimize else "estimate"
        figures = _optimized(g, gm, hw) if optimize else _scheduled(g, hw, spec["schedule"])
    except Exception as exc:  # one failing configuration must not sink the sweep
        return SweepRow(**common, error=error_text(stage, exc))
    return SweepRow(**common, **figures)


def _figures(before: Any, after: Any, step_s: float) -> dict[str, Any]:
    return {
        "step_time_input_s": before.makespan_s, "step_time_s": step_s,
        "exposed_comm_input_s": before.exposed_comm_s, "exposed_comm_s": after.exposed_comm_s,
        "overlap_ratio_input": before.overlap_ratio, "overlap_ratio": after.overlap_ratio,
        "peak_memory_input_bytes": before.peak_memory_bytes, "peak_memory_bytes": after.peak_memory_bytes,
        "lower_bound_s": after.lower_bound_s,
    }  # fmt: skip


def _scheduled(g: Any, hw: Any, schedule: str | None) -> dict[str, Any]:
    from commsched.cost import estimate_costs
    from commsched.passes import schedule as run_schedule
    from commsched.report.step import predict
    from commsched.sim import simulate_costs

    t0 = time.perf_counter()
    costs = estimate_costs(g, hw)
    t1 = time.perf_counter()
    sched = None if schedule is None else run_schedule(g, costs, schedule)
    t2 = time.perf_counter()
    before = simulate_costs(g, costs)
    # the schedule's one step time: with several compute streams, plus the contention its pass charged
    step = None if sched is None else predict(g, costs, sched.order, sched.streams, sched.compute_interference)
    after = before if step is None else step.sim
    t3 = time.perf_counter()
    return {**_figures(before, after, after.makespan_s if step is None else step.makespan_s),
            "estimate_wall_s": t1 - t0, "schedule_wall_s": t2 - t1, "simulate_wall_s": t3 - t2}  # fmt: skip


def _optimized(g: Any, gm: Any, hw: Any) -> dict[str, Any]:
    """:func:`commsched.optimize.optimize` of the traced step: its whole search counts as the schedule stage."""
    from commsched.optimize import optimize

    o = optimize(gm, hw, group_sizes=g.group_sizes())
    return {**_figures(o.before, o.after, o.after.makespan_s), "optimize_kept": o.label,
            "schedule_wall_s": o.wall_s}  # fmt: skip

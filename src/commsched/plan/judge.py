"""One task of ``plan``: judge a few layouts (a pure function of its spec, so it runs on any executor).

A layout without PP is the step as FSDP2 runs it (:func:`commsched.experiments.predict.predict_workload`: the
framework's order, "without overlap optimisation") and the same program after :func:`commsched.optimize.optimize`
(our order and collective reordering, seeded with the framework's order: never slower than it, within 1.05 x its
peak; the FX rewrites need a fresh trace and are left to ``commsched optimize`` on the winner). Its traces come from
the trace cache (:mod:`commsched.execute.cache`) when warm. A layout with PP is torch's schedule simulated over the
traced stages (:func:`commsched.pipeline.job.simulate_job`), at the model's depth (its stages' costs
scaled per stage). Without PP each quantity is measured at the depths :func:`commsched.plan.scale.layer_counts` gives
and extrapolated to the model's depth.
"""

from __future__ import annotations

import collections
import time
import types
from typing import Any

from commsched.execute.base import error_text
from commsched.plan.layout import Layout, PlanRequest, pipeline_job, step_config
from commsched.plan.scale import extrapolate, extrapolate_peak, layer_counts
from commsched.plan.traced import GraphOnly, as_traced, traced

_JOBS: collections.OrderedDict[tuple[Any, Any], dict[str, Any]] = collections.OrderedDict()  # (job, hw) -> point
_JOBS_SIZE = 256
FRAMEWORK_SEED = "framework order"
"""the label of the framework's order among ``optimize``'s variants (its scheduled form: ``"framework order,
scheduled"``)"""
SCALED = ("framework_step_s", "framework_peak_bytes", "framework_exposed_s", "optimized_peak_bytes", "recompute_s",
          "lower_bound_s")  # fmt: skip
"""the row fields extrapolated in the layer count (the optimised step and its exposed communication are not: a
search's result, :func:`optimised_at_depth`; which order a row keeps is decided at full depth, :func:`_kept`); a
peak whose points have its order's parts (``framework_peak_parts`` / ``optimized_peak_parts``: the step's phases,
:func:`commsched.sim.phases.phase_peaks`, or each pipeline rank's peak) is extrapolated part by part
(:func:`commsched.plan.scale.extrapolate_peak`)"""
BUDGET = 1.05
"""``optimize``'s memory budget: this multiple of the framework order's peak (its seed's)"""


def warm_imports() -> None:
    """What a task imports first (the sweep's set: torch, the passes, the simulator's compiled loops)."""
    from commsched.experiments.sweep_task import warm_imports as sweep_warm_imports

    sweep_warm_imports()


def judge_task(spec: dict[str, Any]) -> list[dict[str, Any]]:
    """Rows of ``spec["layouts"]`` (dicts) for ``spec["request"]`` on ``spec["hardware"]`` (a Hardware), each with
    the layout, its numbers at full depth, ``points`` (its numbers at each depth judged) and ``error`` (None, or why
    it could not be judged). ``spec["framework_points"]`` (optional, one per layout): the ``points`` an earlier task
    judged for the framework's order, which this one then takes instead of simulating that order again."""
    req = PlanRequest(**spec["request"])
    rows = []
    earlier = spec.get("framework_points") or [None] * len(spec["layouts"])
    for data, framework in zip(spec["layouts"], earlier, strict=True):
        layout = Layout.from_dict(data)
        t0 = time.perf_counter()
        counts = spec.get("layers") or layer_counts(req, layout)
        try:
            points = [_judge_at(req, layout, spec["hardware"], n, spec, framework and framework[i])
                      for i, n in enumerate(counts)]  # fmt: skip
            row = {**_scaled(points, counts, req.model().n_layers), "points": points}
        except Exception as exc:  # one layout that cannot run must not sink the plan
            row = {"error": error_text("judge", exc)}
        how = "all layers" if counts == (None,) or counts == [None] else f"{counts[0]} and {counts[1]} layers scaled"
        rows.append({"layout": layout.to_dict(), **row, "how": how, "wall_s": time.perf_counter() - t0})
    return rows


def _scaled(points: list[dict[str, Any]], counts: Any, depth: int) -> dict[str, Any]:
    if len(points) == 1:
        return _kept(points[0])
    a, b = points
    k = int(counts[0])
    row = {**b, **{name: extrapolate(a[name], b[name], k, depth) for name in SCALED if a[name] is not None}}
    for which in ("framework", "optimized"):  # the peak is a maximum of lines: each part along its own
        if a.get(f"{which}_peak_parts") and b.get(f"{which}_peak_parts"):
            row[f"{which}_peak_bytes"] = extrapolate_peak(a[f"{which}_peak_parts"], b[f"{which}_peak_parts"], k, depth)
    return _kept({**row, **optimised_at_depth(b, row)} if b["optimized_step_s"] is not None else row)


def optimised_at_depth(deeper: dict[str, Any], row: dict[str, Any]) -> dict[str, Any]:
    """The optimised step, its exposed communication and its peak at the model's depth, from ``deeper`` (the point
    judged at 2K layers) and ``row`` (the framework's fields already scaled): the framework's step less the share
    of its exposed communication the search hid at 2K layers; the peak extrapolated, within the budget
    (:data:`BUDGET` x the framework's) and not under the framework's: at depth the search keeps the framework's
    order scheduled (its seed), whose peak is the framework's or a little above, while its order at 2K layers can
    be another with less (llama3-8b FSDP 8: 37.2 GiB extrapolated, 40.1 at 32 layers; a fit check must not
    under-estimate). Why not the search's step extrapolated: it is not linear in the depth (its
    gain per layer at 80 layers is a third to a half of that at 2 and 4 layers, llama3-70b), while the framework's
    step and exposed communication are (within 0.01 %), and the share hidden varies less (benchmarks/RESULTS.md,
    "plan: full-depth check")."""
    exposed_s = deeper["framework_exposed_s"]
    hidden = (deeper["framework_step_s"] - deeper["optimized_step_s"]) / exposed_s if exposed_s > 0 else 0.0
    gain_s = hidden * row["framework_exposed_s"]
    return {"optimized_step_s": row["framework_step_s"] - gain_s,
            "optimized_exposed_s": max(0.0, row["framework_exposed_s"] - gain_s),
            "optimized_peak_bytes": min(max(row["optimized_peak_bytes"], row["framework_peak_bytes"]),
                                        BUDGET * row["framework_peak_bytes"])}  # fmt: skip


def _kept(row: dict[str, Any]) -> dict[str, Any]:
    """The row's step: the optimised program's when it beats the framework's order, else the framework's."""
    optimised = row["optimized_step_s"] is not None and row["optimized_step_s"] < row["framework_step_s"]
    which = "optimized" if optimised else "framework"
    return {**row, "step_s": row[f"{which}_step_s"], "peak_memory_bytes": row[f"{which}_peak_bytes"],
            "exposed_comm_s": row[f"{which}_exposed_s"], "kept": row[f"{which}_label"], "error": None}  # fmt: skip


def _judge_at(req: PlanRequest, layout: Layout, hardware: Any, layers: int | None, spec: dict[str, Any],
              framework: dict[str, Any] | None) -> dict:  # fmt: skip
    if layout.pp > 1:
        return _pipelined(req, layout, hardware, layers)
    return _step(req, layout, hardware, layers, spec.get("cache", True), spec.get("optimize", True), framework)


def _pipelined(req: PlanRequest, layout: Layout, hardware: Any, layers: int | None) -> dict[str, Any]:
    """Torch's schedule simulated over the traced stages; a job simulated already in this process (layouts that map
    to one ``PipelineJob``: ``simulate_job`` is a pure function of the job and the hardware) is taken as it was."""
    job = pipeline_job(req, layout, layers)
    key = (job, hardware)
    point = _JOBS.get(key)
    if point is None:
        point = _JOBS[key] = _simulated(job, hardware)
    _JOBS.move_to_end(key)
    while len(_JOBS) > _JOBS_SIZE:
        _JOBS.popitem(last=False)
    return dict(point)


def _simulated(job: Any, hardware: Any) -> dict[str, Any]:
    from commsched.pipeline.job import simulate_job

    step = simulate_job(job, hardware)
    res = step.result
    exposed = max(r.exposed_comm_s for r in res.per_rank)
    # each rank's peak, a line in the depth apiece: which rank is the worst can change (llama-tiny PP 2, 1F1B: the
    # last, with the logits, at 2 layers; the first, with the most micro-batches in flight, from 4)
    ranks = {f"rank {r.rank}": (r.peak_memory_bytes, r.peak_memory_bytes) for r in res.per_rank}
    return {"framework_step_s": step.step_s, "framework_peak_bytes": res.peak_memory_bytes,
            "framework_peak_parts": ranks,
            "framework_exposed_s": exposed, "framework_label": "torch's schedule", "optimized_step_s": None,
            "optimized_peak_bytes": None, "optimized_exposed_s": None, "optimized_label": "",
            "recompute_s": 0.0, "lower_bound_s": None, "bubble_fraction": res.bubble_fraction}  # fmt: skip


def _step(req: PlanRequest, layout: Layout, hardware: Any, layers: int | None, cache: bool,
          optimize_it: bool, framework: dict[str, Any] | None = None) -> dict[str, Any]:  # fmt: skip
    """The framework's step (or ``framework``, this depth's point an earlier task judged) and, with
    ``optimize_it``, the optimised one, on the (cached) trace."""
    config = step_config(req, layout, layers)
    graph = traced(config, cache, hardware, req.gpus_per_node)
    config = as_traced(config)  # async TP is in the graph already
    row = dict(framework) if framework is not None else _framework_point(req, config, graph, hardware)
    if optimize_it:
        from commsched.hardware import for_graph
        from commsched.optimize import optimize
        from commsched.sim.phases import phase_peaks

        hw = for_graph(hardware, graph, gpus_per_node=req.gpus_per_node)  # as predict_workload sizes it
        # seeded with what the user runs today: started from the traced order alone, the search ends slower than
        # FSDP2's order where the budget binds at depth (llama3-70b at 80 layers: RESULTS.md, plan: full-depth check)
        # costed as the framework's step is (fused when compiled, eager otherwise): one cost model for both orders
        o = optimize(graph, hw, memory_budget=BUDGET, seeds={FRAMEWORK_SEED: "framework"}, fusion=config.compile)
        row.update(optimized_step_s=o.after.makespan_s, optimized_exposed_s=o.after.exposed_comm_s,
                   optimized_peak_bytes=o.after.peak_memory_bytes, optimized_label=o.label,
                   optimized_peak_parts=phase_peaks(o.after.graph, o.after.memory))  # fmt: skip
    return row


def _framework_point(req: PlanRequest, config: Any, graph: Any, hardware: Any) -> dict[str, Any]:
    """The step as the framework orders it (:func:`predict_workload`) at one depth, as a row's fields."""
    from commsched.experiments.predict import predict_workload
    from commsched.report.summary import compute_shares
    from commsched.sim.phases import phase_peaks

    p = predict_workload(GraphOnly(graph), config, hardware, gpus_per_node=req.gpus_per_node)
    # the kernels' times as the simulation charged them (ns): costing the graph again took a quarter of a judge
    charged = types.SimpleNamespace(node_s=p.sim.standalone_ns * 1e-9)
    recompute_s = compute_shares(graph, charged)["recompute"]["time_s"] or 0.0
    return {"framework_step_s": p.step_s, "framework_peak_bytes": p.peak_memory_bytes,
            "framework_peak_parts": phase_peaks(graph, p.sim.memory),
            "framework_exposed_s": p.sim.exposed_comm_s, "framework_label": p.order, "optimized_step_s": None,
            "optimized_peak_bytes": None, "optimized_exposed_s": None, "optimized_label": "",
            "recompute_s": recompute_s, "lower_bound_s": p.sim.lower_bound_s, "bubble_fraction": 0.0}  # fmt: skip

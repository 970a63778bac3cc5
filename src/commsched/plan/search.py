"""``plan``: enumerate the layouts of a request, prune what cannot fit or cannot win, judge the rest on an executor
and rank them by tokens/s per GPU.

Order of work: every layout (:mod:`commsched.plan.enumerate`); those whose memory lower bound exceeds the HBM go
(:func:`commsched.plan.prune.memory_lower_bound_bytes`); the rest are judged in rounds, fastest step lower bound
first, and before each round a layout whose bound is above the best step judged so far is pruned (as ``optimize``
prunes its variants: the simulator judges, bounds only prune). A judged layout whose simulated peak is over the HBM
is left out of the ranking. Tasks run on the executor (:mod:`commsched.execute`: a local pool or Ray), their traces
in the trace cache, their rows in a row store (an interrupted plan resumes).
"""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Callable
from typing import Any

from commsched.plan.enumerate import enumerate_layouts
from commsched.plan.layout import Layout, PlanRequest
from commsched.plan.prune import memory_lower_bound_bytes, optimised_step_lower_bound_s, step_lower_bound_s

TASK_FN = "commsched.plan.judge:judge_task"
GIB = 1 << 30


@dataclasses.dataclass(frozen=True)
class Judged:
    """One judged layout at the model's full depth: the optimised step (``step_s``), the framework's
    (``framework_step_s``, without overlap optimisation), peak memory per rank, and what the step spends."""

    layout: Layout
    step_s: float
    framework_step_s: float
    peak_memory_bytes: float
    exposed_comm_s: float
    recompute_s: float
    bubble_fraction: float
    tokens_per_s_per_gpu: float
    mfu: float | None
    how: str
    kept: str
    wall_s: float

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "layout": self.layout.to_dict(), "label": self.layout.label()}


@dataclasses.dataclass
class PlanResult:
    """The ranked layouts (best first, each fits its memory) and what was enumerated, pruned, judged, failed."""

    request: PlanRequest
    hardware: Any
    ranked: list[Judged]
    enumerated: int
    pruned_memory: int
    pruned_bound: int
    candidates_judged: int
    over_memory: int
    failed: list[tuple[Layout, str]]
    wall_s: float
    verified: dict[str, Any] | None = None  # the winner judged at every layer: its step against the scaled one
    not_optimised: int = 0  # fitting layouts without PP that optimize could not make the best: not run

    @property
    def winner(self) -> Judged:
        return self.ranked[0]

    @property
    def runner_up(self) -> Judged | None:
        return self.ranked[1] if len(self.ranked) > 1 else None

    @property
    def best_without_optimisation(self) -> Judged:
        """The layout a search blind to overlap optimisation picks: the best framework step."""
        return min(self.ranked, key=lambda j: j.framework_step_s)

    def as_dict(self, top: int | None = None) -> dict[str, Any]:
        rows = self.ranked if top is None else self.ranked[:top]
        return {"preset": self.request.preset, "gpus": self.request.gpus, "hardware": self.hardware.name,
                "request": dataclasses.asdict(self.request), "candidates_enumerated": self.enumerated,
                "pruned_memory": self.pruned_memory, "pruned_bound": self.pruned_bound,
                "candidates_judged": self.candidates_judged, "not_optimised": self.not_optimised,
                "over_memory": self.over_memory,
                "failed": [{"layout": lay.to_dict(), "error": err} for lay, err in self.failed],
                "wall_s": self.wall_s, "verified": self.verified,
                "best_without_optimisation": self.best_without_optimisation.as_dict(),
                "ranked": [j.as_dict() for j in rows]}  # fmt: skip


def plan_hardware(req: PlanRequest) -> Any:
    """The request's hardware profile with its GPUs per node and HBM as asked; ValueError (one line) for GPUs that
    do not fill whole nodes."""
    from commsched.hardware import get, nodes_for_world

    req.check()
    hw = get(req.hardware)
    gpn = req.gpus_per_node or hw.gpus_per_node
    if req.gpus > gpn and req.gpus % gpn:
        raise ValueError(f"--gpus {req.gpus}: expected a multiple of the {gpn} GPUs per node (or fewer)")
    hw = hw.with_nodes(nodes_for_world(req.gpus, gpn), gpn)  # every layout's groups placed on the whole cluster
    compute = hw.compute
    if req.hbm_gib is not None:
        compute = dataclasses.replace(compute, hbm_capacity_bytes=int(req.hbm_gib * GIB))
    return dataclasses.replace(hw, compute=compute)


def plan(req: PlanRequest, *, executor: Any = None, jobs: int | None = None, ray_address: str | None = None,
         cache: bool = True, resume: bool = True, verify: bool = False, progress: Callable[[str], None] | None = None,
         only: Callable[[Layout], bool] | None = None) -> PlanResult:  # fmt: skip
    """The ranked layouts of ``req`` (see the module docstring). ValueError (one line) when no layout exists or
    none fits, naming the smallest memory any layout needs. ``verify``: judge the winner again at every layer
    (``PlanResult.verified``). ``only``: judge just the enumerated layouts it accepts (a benchmark's sample)."""
    from commsched.execute.factory import make_executor

    t0 = time.perf_counter()
    hw = plan_hardware(req)
    hbm = hw.compute.hbm_capacity_bytes
    peaks = dict(hw.compute.peak_flops)
    layouts = [lay for lay in enumerate_layouts(req, hw.gpus_per_node, "float8_e4m3fn" in peaks)
               if only is None or only(lay)]  # fmt: skip
    if not layouts:
        raise ValueError(f"{req.preset} on {req.gpus} GPUs: no layout divides the GPUs, heads, layers and "
                         f"global batch {req.batch}")  # fmt: skip
    bounds = {lay: memory_lower_bound_bytes(req, lay) for lay in layouts}
    fits = [lay for lay in layouts if bounds[lay] <= hbm]
    if not fits:
        least = min(layouts, key=bounds.__getitem__)
        raise ValueError(f"{req.preset} on {req.gpus} x {hw.name}: no layout fits {hbm / GIB:.0f} GiB of HBM; the "
                         f"smallest any layout needs is {bounds[least] / GIB:.1f} GiB ({least.label()})")  # fmt: skip
    peak = max(peaks.get("float8_e4m3fn", 0.0), peaks.get(req.dtype, 0.0)) or max(peaks.values())
    fits.sort(key=lambda lay: step_lower_bound_s(req, lay, peak, hw))
    own = executor is None
    executor = executor or make_executor(jobs=jobs, ray_address=ray_address)
    try:
        rows, pruned, not_optimised = _judge_rounds(req, hw, fits, executor, cache, resume, peak, progress)
        result = _ranked(req, hw, rows, len(layouts), len(layouts) - len(fits), pruned, 0.0)
        result.not_optimised = not_optimised
        if verify:
            result.verified = _verify(req, hw, result.winner, executor, cache)
    finally:
        if own:
            executor.close()
    result.wall_s = time.perf_counter() - t0
    return result


def _verify(req: PlanRequest, hw: Any, winner: Judged, executor: Any, cache: bool) -> dict[str, Any]:
    """The winner judged at the model's full depth, against its scaled estimate."""
    spec = {**_tasks(req, hw, [winner.layout], cache, True)[0], "layers": [None]}
    row = executor.map(TASK_FN, [spec], fail=_failed_rows)[0][0]
    if row.get("error") is not None:
        return {"scaled_step_s": winner.step_s, "full_step_s": None, "error": row["error"]}
    full = row["step_s"]
    return {
        "scaled_step_s": winner.step_s,
        "full_step_s": full,
        "difference": winner.step_s / full - 1,
        "full_peak_memory_bytes": row["peak_memory_bytes"],
        "how": winner.how,
        "error": None,
    }


def _tasks(req: PlanRequest, hw: Any, layouts: list[Layout], cache: bool, optimize: bool) -> list[dict[str, Any]]:
    """One task per layout without PP; the PP layouts that share stage traces (TP, PP, V, micro-batch size) in one."""
    groups: dict[Any, list[Layout]] = {}
    for lay in layouts:
        key = lay if lay.pp == 1 else (lay.tp, lay.sp, lay.pp, lay.stages_per_rank, lay.dp, lay.microbatches)
        groups.setdefault(key, []).append(lay)
    request = dataclasses.asdict(req)
    return [{"request": request, "hardware": hw, "cache": cache, "optimize": optimize,
             "layouts": [lay.to_dict() for lay in group]} for group in groups.values()]  # fmt: skip


def _judge_rounds(req: PlanRequest, hw: Any, layouts: list[Layout], executor: Any, cache: bool, resume: bool,
                  peak: float, progress: Callable[[str], None] | None) -> tuple[list[dict], int, int]:  # fmt: skip
    """Rows of every layout not pruned: first the framework's step of each (pruned by the step bound), then the
    optimised step of each fitting layout without PP that ``optimize`` could still make the best: its optimised
    step's lower bound (:func:`commsched.plan.prune.optimised_step_lower_bound_s`, from its first round) is below
    both the best step so far and its own framework step (at or above it, the row keeps the framework's order
    whatever the search finds: nothing to hide). That round runs in the bound's order, so the best is met early.
    Returns the rows, the layouts pruned by the step bound and those not optimised."""
    first = _rounds(req, hw, _tasks(req, hw, layouts, cache, False), executor, resume, progress,
                    lambda spec, best: min(step_lower_bound_s(req, Layout.from_dict(d), peak, hw)
                                           for d in spec["layouts"]) > best)  # fmt: skip
    rows = [r for r in first[0] if r.get("error") is None]
    fitting = [r for r in rows if r["layout"]["pp"] == 1 and _fits(r, hw)]
    bounds = [optimised_step_lower_bound_s(r) for r in fitting]
    ordered = sorted((b, i) for i, b in enumerate(bounds) if b < fitting[i]["framework_step_s"])
    again = _tasks(req, hw, [Layout.from_dict(fitting[i]["layout"]) for _, i in ordered], cache, True)
    for spec, (b, i) in zip(again, ordered, strict=True):  # one layout a task: its framework step is judged already
        spec["framework_points"] = [fitting[i]["points"]]
        spec["bound_s"] = b
    second = _rounds(req, hw, again, executor, resume, progress, lambda spec, best: spec["bound_s"] > best,
                     best_s=min([r["step_s"] for r in rows if _fits(r, hw)], default=float("inf")))  # fmt: skip
    better = {Layout.from_dict(r["layout"]): r for r in second[0] if r.get("error") is None}
    rows_out = [better.get(Layout.from_dict(r["layout"]), r) for r in first[0]]
    return rows_out, first[1], second[1] + len(fitting) - len(ordered)


def _rounds(req: PlanRequest, hw: Any, tasks: list[dict], executor: Any, resume: bool,
            progress: Callable[[str], None] | None, prunable: Callable[[dict, float], bool],
            best_s: float = float("inf")) -> tuple[list[dict], int]:  # fmt: skip
    """Rows of ``tasks``, run in rounds of a few per worker; before each round, a task ``prunable`` by the best
    step found so far is skipped. Finished tasks go to a row store (an interrupted plan resumes)."""
    from commsched.execute.cache import RowStore

    key = {"request": dataclasses.asdict(req), "hardware": repr(hw),
           "tasks": [[t["optimize"], t["layouts"]] for t in tasks]}  # fmt: skip
    store = RowStore(key) if resume else None
    done: dict[int, list[dict]] = store.load() if store is not None else {}
    per_round = 4 * max(1, getattr(executor, "jobs", None) or 2)
    pruned, i = 0, 0
    for rows in done.values():
        best_s = min([best_s, *(r["step_s"] for r in rows if _fits(r, hw))])
    while i < len(tasks):
        batch: list[int] = []
        while i < len(tasks) and len(batch) < per_round:
            if i not in done and prunable(tasks[i], best_s):
                pruned += len(tasks[i]["layouts"])
                done[i] = []
            elif i not in done:
                batch.append(i)
            i += 1
        results = executor.map(TASK_FN, [tasks[j] for j in batch], fail=_failed_rows) if batch else []
        for j, rows in zip(batch, results, strict=True):
            done[j] = rows
            if store is not None:
                store.add(j, rows)
            best_s = min([best_s, *(r["step_s"] for r in rows if _fits(r, hw))])
        if progress is not None and batch:
            step = "optimised" if tasks[0]["optimize"] else "judged"
            progress(f"{step} {sum(len(r) for r in done.values())} of {sum(len(t['layouts']) for t in tasks)}")
    if store is not None:
        store.finish(keep=True)
    return [r for j in sorted(done) for r in done[j]], pruned


def _failed_rows(spec: dict[str, Any], text: str) -> list[dict[str, Any]]:
    return [{"layout": d, "error": text, "how": "", "wall_s": 0.0} for d in spec["layouts"]]


def _fits(row: dict[str, Any], hw: Any) -> bool:
    return row.get("error") is None and row["peak_memory_bytes"] <= hw.compute.hbm_capacity_bytes


def _ranked(req: PlanRequest, hw: Any, rows: list[dict], enumerated: int, pruned_memory: int, pruned_bound: int,
            wall_s: float) -> PlanResult:  # fmt: skip
    """Rows to :class:`Judged` (tokens/s per GPU and MFU as torchtitan logs them; decode: generated tokens), the
    fitting ones ranked."""
    peak = dict(hw.compute.peak_flops).get(req.dtype)
    tokens, flops_per_token = req.tokens_per_step, req.flops_per_token()
    ranked, failed, over = [], [], 0
    for r in rows:
        layout = Layout.from_dict(r["layout"])
        if r.get("error") is not None:
            failed.append((layout, r["error"]))
            continue
        if not _fits(r, hw):
            over += 1
            continue
        tps = tokens / r["step_s"] / req.gpus
        mfu = flops_per_token * tps / peak if peak else None
        ranked.append(Judged(layout, r["step_s"], r["framework_step_s"], r["peak_memory_bytes"], r["exposed_comm_s"],
                             r["recompute_s"], r.get("bubble_fraction", 0.0), tps, mfu, r["how"], r["kept"],
                             r["wall_s"]))  # fmt: skip
    if not ranked:
        first = f"; first failure: {failed[0][1]}" if failed else ""
        raise ValueError(f"{req.preset} on {req.gpus} x {hw.name}: no judged layout fits "
                         f"{hw.compute.hbm_capacity_bytes / GIB:.0f} GiB of HBM ({over} over it){first}")  # fmt: skip
    ranked.sort(key=lambda j: (-j.tokens_per_s_per_gpu, j.peak_memory_bytes))
    judged = len(rows) - len(failed)
    return PlanResult(req, hw, ranked, enumerated, pruned_memory, pruned_bound, judged, over, failed, wall_s)

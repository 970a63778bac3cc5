"""Optimise a pipeline job: torch's schedule, the micro-batch count M and the stages per rank V, judged by the
simulator under a per-rank memory budget.

Every schedule torch ships (:data:`commsched.pipeline.actions.SCHEDULES`) is tried at every M that divides the
replica's batch (torch splits it into equal micro-batches) and every V the schedule takes (1 for GPipe / 1F1B, 2 for
the V-shaped ones, :data:`STAGES_PER_RANK` for the looped ones), each simulated rank by rank
(:func:`commsched.pipeline.job.simulate_job`). The kept plan is the fastest whose worst rank's peak fits the budget
(default: the profile's HBM); the input job is one of the tries, so the kept plan is never slower than it when it
fits. Every other try says why it lost: slower by x ms, over the budget by y GiB, or torch (torchtitan's split)
refuses it and why. For the kept plan the report also gives the P2P transfers' cost: their time on the wire and
the step they expose (the step with every transfer free, :func:`exposed_p2p_s`), since the simulator posts them on
their own streams under compute.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import numpy as np

from commsched.pipeline.actions import SCHEDULES, SINGLE_STAGE, V_SHAPED, ActionKind
from commsched.pipeline.costs import StageCosts
from commsched.pipeline.job import PipelineJob, simulate_job
from commsched.pipeline.simulate import PipelineResult

PAIRED = ("DualPipeV",)
"""the schedules whose OVERLAP_F_B actions run a forward and a backward as one pair"""
STAGES_PER_RANK = (2, 4)
"""the V the looped schedules (Interleaved1F1B, LoopedBFS, InterleavedZeroBubble) are tried at"""
AC_POLICIES = ("none", "selective-op", "full")
"""the activation checkpointing policies ``ac_policies=AC_POLICIES`` tries (torchtitan's modes: none, selective by op,
full); each trades a stage's held activations for its backward's recompute, so under a tight budget it decides which
M and V fit"""


@dataclasses.dataclass(frozen=True)
class PipelineTry:
    """One (schedule, M, V[, AC]) tried: its simulated step and worst rank's peak, or why it could not run."""

    schedule: str
    microbatches: int
    stages_per_rank: int
    step_s: float | None = None
    peak_memory_bytes: int | None = None
    refused: str = ""
    """torch's (or torchtitan's split's) one-line reason it cannot run; empty when it ran"""
    verdict: str = ""
    """'kept', or why it lost: 'slower by x ms', 'over budget by y GiB', 'torch refuses: ...'"""
    ac: str = ""
    """the AC policy tried (empty: the job's, not searched)"""

    @property
    def label(self) -> str:
        return f"{self.schedule} M={self.microbatches} V={self.stages_per_rank}" + (f" ac={self.ac}" if self.ac else "")

    def as_dict(self) -> dict[str, Any]:
        return {**dataclasses.asdict(self), "label": self.label}


@dataclasses.dataclass(frozen=True, eq=False)
class PipelinePlan:
    """What :func:`optimize_pipeline` tried and kept. ``baseline`` is the input job's try; ``kept`` None when no
    try fits the budget; ``step`` the kept plan's simulated step."""

    baseline: PipelineTry
    kept: PipelineTry | None
    step: Any
    """the kept plan's simulated step: a :class:`commsched.pipeline.job.PipelineStep` (a job's), a
    :class:`PipelineResult` (given stage costs), or None"""
    tried: tuple[PipelineTry, ...]
    memory_budget_bytes: int
    p2p_wire_s: float = 0.0
    """the kept plan's P2P transfers on the wire, the busiest rank's (sends and receives it posts)"""
    exposed_p2p_s: float = 0.0
    """how much longer the kept plan's step is than with every P2P transfer free"""
    stage_overlap: str = ""
    """whether our ``overlap`` pass inside each stage was kept, with the two steps (empty: not tried)"""

    @property
    def speedup(self) -> float | None:
        """The input job's step over the kept plan's (both simulated; None without a kept plan)."""
        if self.kept is None or not self.baseline.step_s or not self.kept.step_s:
            return None
        return self.baseline.step_s / self.kept.step_s

    def summary(self) -> str:
        """One line: what was kept, how much faster than the input, and the P2P it exposes."""
        from commsched.report.units import fmt_bytes

        budget = f"{fmt_bytes(self.memory_budget_bytes)} per rank"
        if self.kept is None:
            return f"no plan fits {budget}: {len(self.tried)} tried, every one over it or refused"
        base, kept = self.baseline, self.kept
        if base.step_s:
            against = f"{self.speedup:.3f}x the input ({base.label}, {base.step_s * 1e3:.3f} ms, {base.verdict})"
        else:
            against = f"the input ({base.label}) {base.verdict}"
        return (f"kept {kept.label}: step {kept.step_s * 1e3:.3f} ms, peak {fmt_bytes(kept.peak_memory_bytes)} "
                f"within {budget}; {against}; P2P {self.p2p_wire_s * 1e3:.3f} ms on the wire (busiest rank), "
                f"{self.exposed_p2p_s * 1e3:.3f} ms exposed" + (f"; in-stage overlap {self.stage_overlap}"
                if self.stage_overlap else ""))  # fmt: skip

    def as_dict(self) -> dict[str, Any]:
        return {"memory_budget_bytes": self.memory_budget_bytes, "baseline": self.baseline.as_dict(),
                "kept": None if self.kept is None else self.kept.as_dict(), "speedup": self.speedup,
                "p2p_wire_s": self.p2p_wire_s, "exposed_p2p_s": self.exposed_p2p_s,
                "stage_overlap": self.stage_overlap,
                "tried": [t.as_dict() for t in self.tried],
                "step": None if self.step is None else self.step.as_dict()}  # fmt: skip


def candidates(
    batch: int, schedules: tuple[str, ...] = SCHEDULES, stages_per_rank: tuple[int, ...] = STAGES_PER_RANK
) -> list[tuple[str, int, int]]:
    """Every (schedule, M, V) to try for a replica's ``batch``: M divides it; V per schedule (module docstring)."""
    ms = [m for m in range(1, batch + 1) if batch % m == 0]
    out = []
    for name in schedules:
        vs = (1,) if name in SINGLE_STAGE else (2,) if name in V_SHAPED else stages_per_rank
        out += [(name, m, v) for v in vs for m in ms]
    return out


def optimize_pipeline(
    job: PipelineJob,
    hardware: Any,
    memory_budget_bytes: int | None = None,
    *,
    schedules: tuple[str, ...] = SCHEDULES,
    stages_per_rank: tuple[int, ...] = STAGES_PER_RANK,
    pair_overlap: bool = True,
    stage_overlap: bool = True,
    ac_policies: tuple[str, ...] = (),
) -> PipelinePlan:
    """The fastest (schedule, M, V) of ``job`` on ``hardware`` whose worst rank's peak fits
    ``memory_budget_bytes`` (default: the profile's HBM), with every try's verdict. The batch stays the job's
    (default: one sequence per micro-batch of the input). ``ac_policies`` (e.g. :data:`AC_POLICIES`): each
    (schedule, M, V) is also tried under each of these AC policies besides the job's own. With ``pair_overlap``
    DualPipeV's OVERLAP_F_B pairs are timed as the ``overlap`` pass orders them (:func:`with_pairs`); with
    ``stage_overlap`` the kept plan's stages are ordered by it too (:func:`with_stage_overlap`), kept if faster.
    Raises ValueError if the input job itself is malformed (before any tracing)."""
    from commsched.hardware import for_graph

    resolved = job.resolve()  # the input's own errors are the user's, not a verdict
    batch = job.microbatches if job.batch is None else job.batch
    if memory_budget_bytes is None:
        memory_budget_bytes = for_graph(hardware, world_size=job.world_size).compute.hbm_capacity_bytes
    base = (resolved.program.schedule, job.microbatches, resolved.program.stages_per_rank)
    grid = candidates(batch, schedules, stages_per_rank)
    acs = tuple(dict.fromkeys((job.ac, *ac_policies))) if ac_policies else ()
    if acs:  # the job's own policy first, so the input is still the first try
        base, grid = (*base, job.ac), [(*c, ac) for c in grid for ac in acs]

    def run(cand: tuple) -> tuple[PipelineTry, Any]:
        name, m, v, *ac = cand
        variant = dataclasses.replace(job, schedule=name, microbatches=m, stages_per_rank=v, batch=batch,
                                      ac=ac[0] if ac else job.ac)  # fmt: skip
        mine = dict(schedule=name, microbatches=m, stages_per_rank=v, ac=ac[0] if ac else "")
        try:
            resolved = variant.resolve()
        except ValueError as exc:
            return PipelineTry(**mine, refused=str(exc)), None
        step = simulate_job(resolved, hardware)
        if pair_overlap and name in PAIRED:
            step = with_pairs(step, hardware)
        return PipelineTry(**mine, step_s=step.step_s, peak_memory_bytes=step.result.peak_memory_bytes), step

    plan = search(base, grid, run, memory_budget_bytes)
    if plan.step is None:
        return plan
    step = plan.step
    if stage_overlap:
        plan = _stage_overlap(plan, hardware)
        step = plan.step
    return dataclasses.replace(plan, p2p_wire_s=p2p_wire_s(step.result),
                               exposed_p2p_s=exposed_p2p_s(step.result, step.costs, step.hardware))  # fmt: skip


def _stage_overlap(plan: PipelinePlan, hardware: Any) -> PipelinePlan:
    """The kept plan with our ``overlap`` pass inside each stage (:func:`with_stage_overlap`), kept only if the
    simulated step is faster; the plan says which."""
    trial = with_stage_overlap(plan.step, hardware)
    before, after = plan.step.step_s, trial.step_s
    if after >= before:
        return dataclasses.replace(plan, stage_overlap=f"not kept: the overlap pass inside each stage gives "
                                   f"{after * 1e3:.3f} ms, not faster than {before * 1e3:.3f} ms")  # fmt: skip
    kept = dataclasses.replace(plan.kept, step_s=after, peak_memory_bytes=trial.result.peak_memory_bytes)
    tried = tuple(kept if t is plan.kept else t for t in plan.tried)
    note = f"kept: the overlap pass inside each stage, {before * 1e3:.3f} -> {after * 1e3:.3f} ms"
    return dataclasses.replace(plan, kept=kept, step=trial, tried=tried, stage_overlap=note)


def optimize_costs(
    schedule: str,
    pp_size: int,
    microbatches: int,
    stages_per_rank: int | None,
    costs: Callable[[int, int], StageCosts],
    memory_budget_bytes: int,
    *,
    batch: int | None = None,
    hardware: Any = None,
    free_comm: bool = False,
    schedules: tuple[str, ...] = SCHEDULES,
    stages_per_rank_tried: tuple[int, ...] = STAGES_PER_RANK,
) -> PipelinePlan:
    """:func:`optimize_pipeline` for given stage costs: ``costs(v, m)`` is the :class:`StageCosts` of a rank's
    layers split over ``v`` stages, each micro-batch ``batch / m`` of the batch (default ``batch``: ``microbatches``).
    The simulated steps are :class:`PipelineResult` s (``plan.step``)."""
    from commsched.pipeline.actions import check_schedule_args
    from commsched.pipeline.simulate import simulate_pipeline

    name, v0 = check_schedule_args(schedule, pp_size, microbatches, stages_per_rank)
    batch = microbatches if batch is None else batch

    def run(cand: tuple[str, int, int]) -> tuple[PipelineTry, Any]:
        name, m, v = cand
        try:
            res = simulate_pipeline(name, pp_size, m, v, costs(v, m), hardware, free_comm=free_comm)
        except ValueError as exc:
            return PipelineTry(name, m, v, refused=str(exc)), None
        return PipelineTry(name, m, v, res.step_s, res.peak_memory_bytes), res

    return search((name, microbatches, v0), candidates(batch, schedules, stages_per_rank_tried), run,
                  memory_budget_bytes)  # fmt: skip


def with_pairs(step: Any, hardware: Any) -> Any:
    """``step`` (a PipelineStep) again with its OVERLAP_F_B pairs timed by our scheduler
    (:func:`commsched.pipeline.overlap_fb.with_overlap_f_b`): each pair costs at most F + B, so the step never grows
    (the simulator's step is monotone in every cost)."""
    from commsched.pipeline.overlap_fb import with_overlap_f_b
    from commsched.pipeline.simulate import simulate_program

    costs = with_overlap_f_b(step.job, step.costs, hardware)
    result = simulate_program(step.job.program, costs, step.hardware,
                              ranks_between_stages=step.job.ranks_between_stages)  # fmt: skip
    return dataclasses.replace(step, result=result, costs=costs)


def with_stage_overlap(step: Any, hardware: Any) -> Any:
    """``step`` (a PipelineStep) again with each stage's forward and backward ordered by the ``overlap`` pass
    (:func:`commsched.pipeline.overlap_fb.stage_savings`): F and B less what the order saves, I less the backward's
    saving (W is compute only)."""
    from commsched.pipeline.overlap_fb import stage_savings
    from commsched.pipeline.simulate import simulate_program

    job, costs = step.job, step.costs
    f, b, i = (list(np.broadcast_to(np.asarray(v, float), (len(job.stages),)))
               for v in (costs.forward_s, costs.backward_s, costs.backward_input_s))  # fmt: skip
    for s, stage in enumerate(job.stages):
        save_f, save_b = stage_savings(job.compute, stage.shape, hardware, policies=job.policies(stage),
                                       fusion=job.job.compile)  # fmt: skip
        f[s], b[s], i[s] = f[s] - save_f, b[s] - save_b, max(i[s] - save_b, 0.0)
    costs = dataclasses.replace(costs, forward_s=f, backward_s=b, backward_input_s=i)
    result = simulate_program(job.program, costs, step.hardware, ranks_between_stages=job.ranks_between_stages)
    return dataclasses.replace(step, result=result, costs=costs)


def search(base: tuple, grid: list[tuple], run: Callable, budget: int) -> PipelinePlan:
    """Run ``base`` (the input) and every other plan of ``grid`` with ``run(plan) -> (PipelineTry, step)``; keep
    the fastest within ``budget`` bytes (ties: the earlier, so the input wins a tie), judge the others."""
    if isinstance(budget, bool) or not isinstance(budget, int) or budget <= 0:
        raise ValueError(f"memory_budget_bytes={budget!r}: expected an integer > 0")
    runs = [run(c) for c in [base] + [c for c in grid if c != base]]
    fits = [i for i, (t, _) in enumerate(runs) if t.step_s is not None and t.peak_memory_bytes <= budget]
    best = min(fits, key=lambda i: (runs[i][0].step_s, i)) if fits else None
    rival = None if best is None else runs[best][0]
    tried = tuple(_judged(t, i == best, rival, budget) for i, (t, _) in enumerate(runs))
    if best is None:
        return PipelinePlan(tried[0], None, None, tried, budget)
    return PipelinePlan(tried[0], tried[best], runs[best][1], tried, budget)


def _judged(t: PipelineTry, kept: bool, best: PipelineTry | None, budget: int) -> PipelineTry:
    from commsched.report.units import fmt_bytes

    if kept:
        verdict = "kept"
    elif t.refused:
        verdict = f"refused: {t.refused}"
    elif t.peak_memory_bytes > budget:
        verdict = f"over budget by {fmt_bytes(t.peak_memory_bytes - budget)}"
    else:
        verdict = f"slower by {(t.step_s - best.step_s) * 1e3:.3f} ms"
    return dataclasses.replace(t, verdict=verdict)


def p2p_wire_s(result: PipelineResult) -> float:
    """The busiest rank's P2P time on the wire: the transfers of the SEND and RECV actions it posts."""
    p = result.program
    p2p = [int(k) for k in (ActionKind.SEND_F, ActionKind.SEND_B, ActionKind.RECV_F, ActionKind.RECV_B)]
    worst = 0
    for r in range(p.pp_size):
        mask = np.isin(p.actions[r][:, 0], p2p) & (result.end_ns[r] >= 0)
        worst = max(worst, int((result.end_ns[r][mask] - result.start_ns[r][mask]).sum()))
    return worst * 1e-9


def exposed_p2p_s(result: PipelineResult, costs: StageCosts, hardware: Any) -> float:
    """The step the P2P transfers expose: the step minus the same step with every transfer free (the simulator
    posts them on their own streams, so only a consumer that waits for one makes it longer)."""
    from commsched.pipeline.simulate import simulate_program

    free = simulate_program(result.program, costs, hardware, free_comm=True)
    return max(result.step_s - free.step_s, 0.0)

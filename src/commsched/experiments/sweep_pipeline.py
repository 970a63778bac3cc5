"""A sweep over pipeline schedules: what :func:`commsched.experiments.sweep.run_sweep` runs with ``pipeline=``.

``run_sweep("llama3-8b", parallel="fsdp+tp", world_sizes=64, hardware="h100-sxm", tp_size=8,
pipeline=PipelineSweep(pp_sizes=(4,), schedules=("1F1B", "Interleaved1F1B", "ZBVZeroBubble"), microbatches=(8, 16,
32)))`` gives one row per (parallel, world size, P, schedule, M, V, hardware): the job of
:mod:`commsched.pipeline.job` simulated by :func:`commsched.pipeline.job.simulate_job` (step, tokens/s per GPU, MFU,
bubble, the worst rank's exposed communication and peak memory). Each (parallel, world size, P, schedule, M, V) is
one task on the sweep's executor, its stages traced in that process (``trace_stage`` keeps them, so the schedules and
micro-batch counts of one stage shape on one worker trace it once). A combination torch or torchtitan refuses (M
not a multiple of what the schedule needs, V for a single-stage schedule, P not dividing the layers) is a row whose
``error`` is that one line, never a failed sweep."""

from __future__ import annotations

import dataclasses
import time
from collections.abc import Sequence
from typing import Any

from commsched.execute.base import error_text
from commsched.experiments.sweep_task import TaskSpec, error_rows, row_head
from commsched.experiments.sweep_task import warm_imports as warm_imports  # the executor warms a worker with it

TASK_FN = "commsched.experiments.sweep_pipeline:run_task"


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineSweep:
    """The pipeline dimensions of a sweep: every P x schedule x M x V (M None: P x V, as ``commsched pipeline``;
    V None: the schedule's default, 1 for GPipe / 1F1B, else 2)."""

    pp_sizes: tuple[int, ...]
    schedules: tuple[str, ...]
    microbatches: tuple[int | None, ...] = (None,)
    stages_per_rank: tuple[int | None, ...] = (None,)

    def checked(self) -> PipelineSweep:
        """The same with torch's spellings of the schedules; ValueError for a name or value wrong everywhere."""
        from commsched.pipeline.actions import parse_schedule

        for name, values in dataclasses.asdict(self).items():
            items = list(values)
            if not items or len(set(items)) != len(items):
                raise ValueError(f"{name}: expected distinct values, got {items}")
            for v in items:
                if name != "schedules" and v is not None and (isinstance(v, bool) or not isinstance(v, int) or v < 1):
                    raise ValueError(f"{name}: {v!r} is not a positive integer")
        return dataclasses.replace(self, schedules=tuple(parse_schedule(s) for s in self.schedules))

    def combinations(self) -> list[dict[str, Any]]:
        """Each (P, schedule, M, V) as a row's fields, in that nested order (M and V -1 where the default applies:
        the row says the value torch ran)."""
        return [{"pp_size": p, "pp_schedule": s, "microbatches": -1 if m is None else m,
                 "stages_per_rank": -1 if v is None else v}
                for p in self.pp_sizes for s in self.schedules for m in self.microbatches
                for v in self.stages_per_rank]  # fmt: skip


def check_parallel(parallels: Sequence[str]) -> None:
    """A parallelism a pipeline rank cannot run fails every row: ValueError naming the ones it can."""
    from commsched.pipeline.job import parse_parallel

    for p in parallels:
        parse_parallel(p)


def pipeline_tasks(preset: str, parallels: Sequence[str], world_sizes: Sequence[int], pipeline: PipelineSweep,
                   profiles: list, layers: int | None, gpus_per_node: int | None,
                   build_kw: dict[str, Any]) -> list[TaskSpec]:  # fmt: skip
    """One task per (parallel, world size, P, schedule, M, V), in that nested order."""
    tasks: list[TaskSpec] = []
    for p in parallels:
        for w in world_sizes:
            for combo in pipeline.combinations():
                tasks.append({"index": len(tasks), "preset": preset, "parallel": p, "world_size": w, "layers": layers,
                              "schedule": None, "gpus_per_node": gpus_per_node, "build_kw": dict(sorted(
                              build_kw.items())), "hardware": profiles, "optimize": [False], "cache": False,
                              "pipeline": combo})  # fmt: skip
    return tasks


def check_options(build_kw: dict[str, Any]) -> None:
    """ValueError naming the first of ``build_kw`` (the sweep's workload options) a pipeline job does not take."""
    from commsched.pipeline.job import PipelineJob

    swept = {"preset", "parallel", "world_size", "pp_size", "schedule", "microbatches", "stages_per_rank", "layers"}
    takes = {f.name for f in dataclasses.fields(PipelineJob)} - swept
    unknown = sorted(set(build_kw) - takes)
    if unknown:
        raise ValueError(f"{unknown[0]}: not an option of a pipeline job (yet); it takes {', '.join(sorted(takes))}")


def _m_and_v(spec: TaskSpec) -> tuple[int, int]:
    """The task's (M, V), defaults filled in (V: the schedule's, :func:`check_schedule_args`; M: P x V); ValueError
    naming V when the schedule does not take it."""
    from commsched.pipeline.actions import check_schedule_args

    pp = spec["pipeline"]
    given_v = None if pp["stages_per_rank"] < 0 else pp["stages_per_rank"]
    v = check_schedule_args(pp["pp_schedule"], pp["pp_size"], 1, given_v)[1]
    return (pp["microbatches"] if pp["microbatches"] > 0 else pp["pp_size"] * v), v


def _error_fields(spec: TaskSpec) -> dict[str, int]:
    """A failed task's M and V: resolved where the schedule takes its V, else as given (-1: unset)."""
    try:
        m, v = _m_and_v(spec)
    except ValueError:
        return {}
    return {"microbatches": m, "stages_per_rank": v}


def _job(spec: TaskSpec) -> Any:
    """The task's :class:`PipelineJob`; ValueError naming an option the job or the schedule does not take."""
    from commsched.pipeline.job import PipelineJob

    check_options(spec["build_kw"])
    pp = spec["pipeline"]
    m, v = _m_and_v(spec)
    return PipelineJob(preset=spec["preset"], parallel=spec["parallel"], world_size=spec["world_size"],
                       pp_size=pp["pp_size"], schedule=pp["pp_schedule"], microbatches=m, stages_per_rank=v,
                       layers=spec["layers"], **spec["build_kw"])  # fmt: skip


def run_task(spec: TaskSpec) -> list[dict[str, Any]]:
    """The rows of one pipeline task, one per hardware profile. Never raises for a bad combination: torch's or the
    job's refusal gives error rows, a profile that fails its own row."""
    t0 = time.perf_counter()
    try:
        resolved = _job(spec).resolve()
    except Exception as exc:
        wall_s = time.perf_counter() - t0
        return error_rows(spec, error_text("pipeline", exc), trace_wall_s=wall_s, **_error_fields(spec))
    resolve_wall_s = time.perf_counter() - t0
    return [_evaluate(spec, resolved, name, profile, resolve_wall_s).to_dict() for name, profile in spec["hardware"]]


def _evaluate(spec: TaskSpec, resolved: Any, name: str, profile: Any, resolve_wall_s: float) -> Any:
    """Trace (first time only, per process), cost and simulate the job on one profile; the row."""
    from commsched.experiments.sweep_row import SweepRow
    from commsched.hardware import for_graph, nodes_for_world
    from commsched.pipeline.job import simulate_job

    program, inner = resolved.program, resolved.inner
    common = {**row_head(spec, name, False), "microbatches": program.microbatches,
              "stages_per_rank": program.stages_per_rank, "layers": inner.model.n_layers,
              "tokens_per_step": resolved.batch * inner.seq_len * inner.plan.data_parallel_degree,
              "trace_wall_s": resolve_wall_s}  # fmt: skip
    t0 = time.perf_counter()
    try:
        gpn = spec["gpus_per_node"]
        hw = for_graph(profile, num_nodes=nodes_for_world(spec["world_size"], gpn or profile.gpus_per_node),
                       gpus_per_node=gpn)  # fmt: skip
        common.update(num_nodes=hw.num_nodes, gpus_per_node=hw.gpus_per_node)
        step = simulate_job(resolved, hw)
    except Exception as exc:  # one failing configuration must not sink the sweep
        return SweepRow(**common, error=error_text("simulate", exc))
    res = step.result
    worst_exposed_s = max(r.exposed_comm_s for r in res.per_rank)
    return SweepRow(**common, step_time_input_s=step.step_s, step_time_s=step.step_s,
                    exposed_comm_input_s=worst_exposed_s, exposed_comm_s=worst_exposed_s,
                    peak_memory_input_bytes=res.peak_memory_bytes, peak_memory_bytes=res.peak_memory_bytes,
                    bubble_fraction=res.bubble_fraction, tokens_per_s_per_gpu=step.tokens_per_s_per_gpu,
                    mfu=step.mfu if step.mfu is not None else float("nan"),
                    simulate_wall_s=time.perf_counter() - t0)  # fmt: skip

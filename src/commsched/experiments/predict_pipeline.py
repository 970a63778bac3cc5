"""``predict`` under pipeline parallelism: a :class:`~commsched.experiments.predict.StepConfig` with ``pp_size > 1``
as a :class:`~commsched.pipeline.job.PipelineJob`, simulated rank by rank by
:func:`commsched.pipeline.job.simulate_job`, reported with predict's numbers (step, tokens/s per GPU, MFU, peak
memory per GPU, what bounds the step) and the bubble.

:func:`job_kwargs` is the one place a StepConfig becomes PipelineJob keywords: a field PipelineJob has (same name,
or renamed in :data:`RENAMED`) is passed through, so each field PipelineJob gains is taken with no change here; a
field it lacks is accepted only when the feature is off (:data:`OFF`), and refused otherwise in one line naming the
option (or the torchtitan config key), except a feature predict turns on by default (:data:`NOT_COUNTED`), which is
accepted with a note saying the step leaves it out (refusing it would refuse every torchtitan config; PipelineJob
takes the optimizer step and clipping, so no such note is written today).
"""

from __future__ import annotations

import dataclasses
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from commsched.experiments.predict import StepConfig

if TYPE_CHECKING:
    from commsched.hardware import Hardware
    from commsched.pipeline.job import PipelineJob, PipelineStep

RENAMED = {"pp_schedule": "schedule"}
"""StepConfig field -> the PipelineJob field of the same option, where the names differ"""
OFF: dict[str, Any] = {"ac": "none", "compile": False, "float8": "none", "float8_all_gather": False,
                       "async_tp": False, "dp_replicate": 1, "optimizer": "none", "max_norm": None}  # fmt: skip
"""StepConfig field -> its value with the feature off (a PipelineJob without the field runs it so)"""
NOT_COUNTED = {"optimizer": "the optimizer step ({value})", "max_norm": "gradient clipping (max_norm {value})"}
"""features predict turns on by default that a PipelineJob without the field leaves out of the step (noted)"""
_NOT_OPTIONS = ("extra", "source", "notes", "float8_all_gather")
"""StepConfig fields that are no option of their own: float8_all_gather is the zoo's rule (tensorwise under FSDP,
which ``StepConfig.check`` enforces), and PipelineJob applies the same rule"""
_CONFIG_WORDS = {"float8": "[model] converters (float8)", "float8_all_gather": "enable_fsdp_float8_all_gather",
                 "cp_size": "[parallelism] context_parallel_degree", "ep_size": "[parallelism] expert_parallel_degree",
                 "cp_rotate": "[parallelism] context_parallel_rotate_method"}  # fmt: skip


def _where(step: StepConfig, name: str, value: Any) -> str:
    """How the user gave ``name``: the command-line flag, or the torchtitan config key."""
    if step.source == "options":
        flag = f"--{name.replace('_', '-')}"
        return (flag if value else f"--no-{flag[2:]}") if isinstance(value, bool) else f"{flag} {value}"
    from commsched.experiments.torchtitan import CONFIG_KEYS

    return f"{CONFIG_KEYS.get(name) or _CONFIG_WORDS.get(name, name)} ({value})"


def job_kwargs(step: StepConfig) -> tuple[dict[str, Any], tuple[str, ...]]:
    """(PipelineJob keywords of ``step``, notes on what the step leaves out); ValueError naming the option PipelineJob
    does not support yet (see the module docstring)."""
    from commsched.pipeline.actions import check_schedule_args
    from commsched.pipeline.job import PipelineJob

    fields = {f.name for f in dataclasses.fields(PipelineJob)}
    kwargs: dict[str, Any] = {}
    left_out: list[str] = []
    options = [(f.name, getattr(step, f.name), f.default) for f in dataclasses.fields(StepConfig)
               if f.name not in _NOT_OPTIONS]  # fmt: skip
    for name, value, default in [*options, *((k, v, None) for k, v in step.extra)]:
        target = RENAMED.get(name, name)
        if target in fields:
            kwargs[target] = value
        elif value == OFF.get(name, default):
            continue
        elif name in NOT_COUNTED and value == default:
            left_out.append(NOT_COUNTED[name].format(value=value))
        else:
            raise ValueError(f"{_where(step, name, value)}: not yet supported under pipeline parallelism "
                             f"(pp {step.pp_size})")  # fmt: skip
    # V unset: 1 for GPipe / 1F1B, else 2 (torchtitan's default); M unset: P x V (commsched pipeline's default)
    v = check_schedule_args(step.pp_schedule, step.pp_size, 1, step.stages_per_rank)[1]
    kwargs["stages_per_rank"] = v
    kwargs["microbatches"] = step.pp_size * v if step.microbatches is None else step.microbatches
    notes = (f"not counted under pipeline parallelism yet: {', '.join(left_out)}",) if left_out else ()
    return kwargs, notes


def pipeline_job(step: StepConfig) -> tuple[PipelineJob, tuple[str, ...]]:
    """``step`` as a :class:`PipelineJob` (not yet resolved) and the notes of :func:`job_kwargs`."""
    from commsched.pipeline.job import PipelineJob

    kwargs, notes = job_kwargs(step)
    return PipelineJob(**kwargs), notes


def bound_summary(step: PipelineStep) -> dict[str, str]:
    """What bounds a pipeline step, for its critical rank (the one with the most compute): its compute, its idle
    time waiting for other stages (the bubble: fill, drain, imbalance) or its waits for transfers and FSDP's
    collectives (exposed communication); the largest binds."""
    ranks = step.result.per_rank
    r = max(ranks, key=lambda x: x.busy_s)
    idle_s = r.bubble_s - r.exposed_comm_s
    terms = {"compute": r.busy_s, "pipeline bubble": idle_s, "communication": r.exposed_comm_s}
    binding = max(terms, key=lambda k: terms[k])
    total = step.step_s or 1.0
    what = (f"pipeline rank {r.rank} (the most compute): compute {r.busy_s * 1e3:.1f} ms "
            f"({100 * r.busy_s / total:.0f} % of the step), waiting for other stages {idle_s * 1e3:.1f} ms, for "
            f"transfers and FSDP collectives {r.exposed_comm_s * 1e3:.1f} ms")  # fmt: skip
    move = {"compute": "less compute per stage (more pipeline ranks or TP, fewer layers per stage)",
            "pipeline bubble": "more micro-batches (M) or an interleaved / zero-bubble schedule "
                               "(commsched pipeline compares them)",
            "communication": "faster links between pipeline ranks, or transfers overlapped with compute"}  # fmt: skip
    return {"binding": binding, "what_bounds_the_step": what, "what_would_move_it": move[binding]}


@dataclass(frozen=True)
class PipelinePrediction:
    """One predicted pipeline step: the configuration, the simulated :class:`PipelineStep`, what the step leaves out
    (``notes``) and its warnings (the worst rank's peak over HBM, an unfitted network)."""

    config: StepConfig
    step: PipelineStep
    notes: tuple[str, ...] = ()
    warnings: tuple[str, ...] = ()

    @property
    def hardware(self) -> Hardware:
        return self.step.hardware

    @property
    def step_s(self) -> float:
        return self.step.step_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.step.tokens_per_s_per_gpu

    @property
    def mfu(self) -> float | None:
        return self.step.mfu

    @property
    def peak_memory_bytes(self) -> int:
        """The worst pipeline rank's peak."""
        return self.step.result.peak_memory_bytes

    @property
    def bubble_fraction(self) -> float:
        return self.step.result.bubble_fraction

    @property
    def model_flops_per_token(self) -> float:
        inner = self.step.job.inner
        return inner.model.model_flops_per_token(inner.seq_len)

    def configuration_line(self) -> str:
        """One line: preset, mesh, schedule, layers, batch x sequence, dtype, the source."""
        job, d = self.step.job, self.step.as_dict()
        p = job.program
        mesh = " x ".join(f"{name} {size}" for name, size in d["mesh"].items())
        layers, most = d["layers"], _preset_layers(self.config.preset)
        sliced = f"all {most} layers" if layers == most else f"{layers} of {most} layers"
        line = " / ".join([self.config.preset, f"{job.job.parallel} under PP ({mesh})",
                           f"{p.schedule} M={p.microbatches} V={p.stages_per_rank}",
                           f"world {job.job.world_size}", sliced, f"batch {job.batch} x seq {job.inner.seq_len}",
                           str(job.inner.dtype).removeprefix("torch.")])  # fmt: skip
        return line if self.config.source == "options" else f"{line} (from {self.config.source})"

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` record: predict's headline numbers, the bubble, and the pipeline's own record (each rank,
        each stage: :meth:`PipelineStep.as_dict`)."""
        hw, d = self.hardware, self.step.as_dict()
        worst = max(self.step.result.per_rank, key=lambda r: r.exposed_comm_s)
        cluster = {"name": hw.name, "num_nodes": hw.num_nodes, "gpus_per_node": hw.gpus_per_node,
                   "peak_flops": dict(hw.compute.peak_flops).get(str(self.step.job.inner.dtype).removeprefix(
                       "torch.")), "hbm_capacity_bytes": hw.compute.hbm_capacity_bytes}  # fmt: skip
        layout = {"layers": d["layers"], "preset_layers": _preset_layers(self.config.preset), "mesh": d["mesh"],
                  "seq_len": d["seq_len"], "batch": d["batch"]}  # fmt: skip
        return {
            "step_s": self.step_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "mfu": self.mfu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "bubble_fraction": self.bubble_fraction,
            "exposed_comm_s": worst.exposed_comm_s,
            "tokens_per_replica": self.step.job.batch * self.step.job.inner.seq_len,
            "tp": self.step.job.inner.plan.tp,
            "pp": self.step.job.job.pp_size,
            "model_flops_per_token": self.model_flops_per_token,
            "order": f"torch.distributed.pipelining {d['schedule']} (torch's action lists, rank by rank)",
            "configuration_line": self.configuration_line(),
            "configuration": {**self.config.to_dict(), **layout},
            "hardware": cluster,
            "bound": bound_summary(self.step),
            "warnings": list(self.warnings),
            "notes": [*self.config.notes, *self.notes],
            "pipeline": d,
        }


def _preset_layers(preset: str) -> int:
    from commsched.workloads import get_preset

    return int(get_preset(preset).n_layers)


def predict_pipeline(
    config: StepConfig,
    hardware: str | Hardware = "h100-sxm",
    *,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
) -> PipelinePrediction:
    """The pipeline step of ``config`` (``pp_size > 1``) on ``hardware``: :func:`pipeline_job` resolved (every
    option checked before any tracing), its stages traced and costed, torch's schedule simulated
    (:func:`commsched.pipeline.job.simulate_job`)."""
    from commsched.hardware import for_graph
    from commsched.pipeline.job import simulate_job
    from commsched.report.capacity import step_warnings

    job, notes = pipeline_job(config)
    resolved = job.resolve()
    hw = for_graph(hardware, num_nodes=num_nodes, gpus_per_node=gpus_per_node, world_size=config.world_size)
    step = simulate_job(resolved, hw)
    warnings = step_warnings({}, step.hardware, step.result.peak_memory_bytes)
    return PipelinePrediction(config, step, notes, tuple(warnings))

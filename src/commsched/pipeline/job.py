"""A zoo model trained with pipeline parallelism: its stages traced and costed, torch's schedule simulated.

PP is the outermost mesh dimension, as torchtitan builds it (``parallel_dims.py``: ``["pp", "dp_replicate",
"fsdp", "cp", "tp"]``): the ``world_size / pp_size`` ranks of a pipeline rank run the inner plan (``parallel``:
FSDP, TP / SP, FSDP + TP), and pipeline rank r's ranks sit ``r x world_size / pp_size`` global ranks from rank 0's.
Each step takes ``batch`` sequences per data-parallel replica, as ``microbatches`` equal micro-batches.

:meth:`PipelineJob.resolve` checks every option (one-line ValueErrors naming it) before any tracing;
:func:`simulate_job` traces each distinct stage once (:mod:`commsched.pipeline.stages`), times FSDP's per-step
collectives with the collective model, and simulates torch's schedule (:mod:`commsched.pipeline.simulate`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from commsched.pipeline.actions import PipelineProgram, lower_schedule
from commsched.pipeline.cache import stage_record
from commsched.pipeline.costs import StageCosts
from commsched.pipeline.simulate import PipelineResult, simulate_program
from commsched.pipeline.split import Stage, stages_of
from commsched.pipeline.stages import param_bytes
from commsched.workloads.program import WorkloadSpec

PIPELINE_PARALLELISMS = ("none", "fsdp", "tp", "tp+sp", "fsdp+tp", "fsdp+tp+sp")
"""the inner plans a pipeline rank's ranks may run (EP, DDP, HSDP and CP under PP are not built yet)"""
ADAMW_STATES = 2
"""AdamW's states per parameter (exp_avg, exp_avg_sq; torchtitan's default optimizer), in the master dtype"""


def parse_parallel(parallel: str) -> str:
    """``parallel`` if a pipeline rank's ranks can run it, else ValueError naming the ones they can."""
    if parallel not in PIPELINE_PARALLELISMS:
        raise ValueError(f"parallel={parallel!r}: under pipeline parallelism expected one of "
                         f"{', '.join(PIPELINE_PARALLELISMS)}")  # fmt: skip
    return parallel


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineJob:
    """A training job with pipeline parallelism, as the options give it (None: the default)."""

    preset: str
    parallel: str
    world_size: int
    pp_size: int
    schedule: str
    microbatches: int
    stages_per_rank: int | None = None  # V: 1 for GPipe / 1F1B, 2 for the others
    tp_size: int | None = None
    layers: int | None = None
    seq_len: int | None = None
    batch: int | None = None  # sequences per data-parallel replica per step; default: one per micro-batch
    dtype: str = "bfloat16"

    def resolve(self) -> ResolvedJob:
        """Every option checked (ValueError naming the option and what torch / torchtitan require), and the specs
        of the stage ranks and of one micro-batch's program."""
        from commsched.workloads import resolve

        parse_parallel(self.parallel)
        program = lower_schedule(self.schedule, self.pp_size, self.microbatches, self.stages_per_rank)
        if isinstance(self.world_size, bool) or not isinstance(self.world_size, int) or self.world_size < 1:
            raise ValueError(f"world_size={self.world_size!r}: expected an integer >= 1")
        if self.world_size % self.pp_size:
            raise ValueError(f"pp_size={self.pp_size} does not divide world_size={self.world_size}")
        batch = self.microbatches if self.batch is None else self.batch
        if batch < 1 or batch % self.microbatches:
            raise ValueError(f"batch={batch}: expected a multiple of microbatches={self.microbatches} (torch splits "
                             "each replica's batch into equal micro-batches)")  # fmt: skip
        inner_world = self.world_size // self.pp_size
        options = dict(layers=self.layers, seq_len=self.seq_len, batch=batch // self.microbatches, dtype=self.dtype)
        if self.parallel == "none" and inner_world != 1:
            raise ValueError(f"parallel='none': world_size={self.world_size} / pp_size={self.pp_size} leaves "
                             f"{inner_world} ranks per pipeline rank; expected 1 (or a plan "
                             "that uses them)")  # fmt: skip
        inner = resolve(self.preset, parallel=self.parallel, world_size=inner_world, tp_size=self.tp_size, **options)
        if inner.plan.dp > 1:
            raise ValueError(f"parallel={self.parallel!r}: tp_size={inner.plan.tp} leaves {inner.plan.dp} "
                             "data-parallel replicas per pipeline rank; use fsdp+tp (DDP under PP is not "
                             "built yet)")  # fmt: skip
        stages = stages_of(program.num_stages, inner.model.n_layers)
        tp = inner.plan.tp
        compute_parallel = "none" if tp == 1 else ("tp+sp" if inner.plan.sp else "tp")
        compute = resolve(self.preset, parallel=compute_parallel, world_size=tp, tp_size=tp if tp > 1 else None,
                          **options)  # fmt: skip
        # FSDP hands the blocks unsharded compute-dtype parameters (mixed precision): trace them so
        compute = dataclasses.replace(compute, master_dtype=compute.dtype)
        return ResolvedJob(self, program, inner, compute, tuple(stages), batch)


@dataclasses.dataclass(frozen=True, eq=False)
class ResolvedJob:
    """A checked :class:`PipelineJob`: torch's lowered schedule, the stage ranks' spec (``inner``: the plan on
    ``world_size / pp_size`` ranks, batch = one micro-batch), the micro-batch program's spec (``compute``: only the
    TP part of the plan, parameters in the compute dtype) and the stages (torchtitan's split)."""

    job: PipelineJob
    program: PipelineProgram
    inner: WorkloadSpec
    compute: WorkloadSpec
    stages: tuple[Stage, ...]
    batch: int

    @property
    def ranks_between_stages(self) -> int:
        return self.job.world_size // self.job.pp_size

    def stage_layout(self, stage: Stage) -> list[Any]:
        """The parameters of ``stage`` as the inner plan stores them."""
        units = set(stage.units)
        return [p for p in self.inner.layout if p.unit in units]


@dataclasses.dataclass(frozen=True, eq=False)
class PipelineStep:
    """A simulated step of a :class:`ResolvedJob`: the pipeline result, the stage costs it ran with, the hardware."""

    job: ResolvedJob
    result: PipelineResult
    costs: StageCosts
    hardware: Any

    @property
    def step_s(self) -> float:
        return self.result.step_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """torchtitan's ``tps``: one data-parallel replica's tokens over the step, divided by TP x PP."""
        inner = self.job.inner
        tokens = self.job.batch * inner.seq_len
        return tokens / self.step_s / (inner.plan.tp * self.job.job.pp_size) if self.step_s > 0 else 0.0

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation as torchtitan logs it (``ModelConfig.model_flops_per_token``); None without the
        device's peak for the dtype."""
        inner = self.job.inner
        peak = dict(self.hardware.compute.peak_flops).get(str(inner.dtype).removeprefix("torch."))
        if not peak:
            return None
        return inner.model.model_flops_per_token(inner.seq_len) * self.tokens_per_s_per_gpu / peak

    def as_dict(self) -> dict[str, Any]:
        """The ``--json`` record: the pipeline's numbers, rates, and each stage's costs."""
        costs, job = self.costs, self.job
        stages = [{"stage": st.index, "rank": int(job.program.stage_to_rank[st.index]), "layers": list(st.layers),
                   "embedding": st.first, "output": st.last,
                   **{name: _at(getattr(costs, name), st.index) for name in _STAGE_FIELDS}}
                  for st in job.stages]  # fmt: skip
        return {**self.result.as_dict(), "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu, "mfu": self.mfu,
                "world_size": job.job.world_size, "parallel": job.job.parallel, "mesh": {"pp": job.job.pp_size,
                **job.inner.plan.to_meta()["mesh"]}, "batch": job.batch, "seq_len": job.inner.seq_len,
                "layers": job.inner.model.n_layers, "hardware": self.hardware.name, "stages": stages}  # fmt: skip


_STAGE_FIELDS = ("forward_s", "backward_s", "backward_input_s", "backward_weight_s", "send_bytes", "activation_bytes",
                 "static_bytes", "unshard_s", "reduce_grad_s")  # fmt: skip


def _at(values: Any, stage: int) -> Any:
    return values[stage] if isinstance(values, list | tuple) else values


def stage_costs(job: ResolvedJob, hardware: Any) -> StageCosts:
    """Every stage's :class:`StageCosts` fields: its traced program timed on ``hardware`` (F, B, I, W, the hidden
    state it sends, the activations it holds), its static bytes (master parameters, gradients and AdamW states of
    its shard; with FSDP also the unsharded parameters and gradients it holds all step) and FSDP's per-step
    all_gather / reduce_scatter, one per FSDP unit (block)."""
    fields: dict[str, list] = {name: [] for name in _STAGE_FIELDS}
    for stage in job.stages:
        traced = stage_record(job.compute, stage.shape, hardware)  # cached, long stages scaled: pipeline/cache.py
        secs = traced.times
        for name, value in dataclasses.asdict(secs).items():
            fields[name].append(value)
        fields["send_bytes"].append(traced.send_bytes)
        fields["activation_bytes"].append(traced.activation_bytes)
        fields["static_bytes"].append(_static_bytes(job, stage))
        unshard_s, reduce_s = _fsdp_seconds(job, stage, hardware)
        fields["unshard_s"].append(unshard_s)
        fields["reduce_grad_s"].append(reduce_s)
    return StageCosts(**fields)


def _static_bytes(job: ResolvedJob, stage: Stage) -> int:
    """Master parameters, gradients and AdamW states of the stage's shard (master dtype); under FSDP also what
    torch's pipelining holds unsharded all step: the gathered compute-dtype parameters (no reshard after forward)
    and the gradients accumulated in the reduce dtype until REDUCE_GRAD."""
    inner, layout = job.inner, job.stage_layout(stage)
    shard = param_bytes(layout, inner.master_dtype, sharded=True)
    total = shard * (2 + ADAMW_STATES)
    if inner.plan.fsdp > 1:
        unsharded = param_bytes(layout, inner.dtype, sharded=False)
        total += unsharded + param_bytes(layout, inner.reduce_dtype, sharded=False)
    return total


def _fsdp_seconds(job: ResolvedJob, stage: Stage, hardware: Any) -> tuple[float, float]:
    """(UNSHARD, REDUCE_GRAD) seconds of ``stage``: FSDP2's all_gather (compute dtype) and reduce_scatter (reduce
    dtype) of each of its units over the FSDP group, timed by the collective model on the whole cluster."""
    from commsched.cost.collectives import plan_collective
    from commsched.hardware import for_graph

    plan, inner = job.inner.plan, job.inner
    if plan.fsdp == 1:
        return 0.0, 0.0
    hw = for_graph(hardware, world_size=job.job.world_size)
    stride = plan.stride("fsdp")
    gather_s = reduce_s = 0.0
    for unit in stage.units:
        params = [p for p in inner.layout if p.unit == unit]
        gathered = param_bytes(params, inner.dtype, sharded=True) * plan.fsdp
        reduced = param_bytes(params, inner.reduce_dtype, sharded=True) * plan.fsdp
        gather_s += plan_collective("all_gather", gathered, plan.fsdp, hw, stride=stride).time_s
        reduce_s += plan_collective("reduce_scatter", reduced, plan.fsdp, hw, stride=stride).time_s
    return gather_s, reduce_s


def simulate_job(job: PipelineJob | ResolvedJob, hardware: Any) -> PipelineStep:
    """``job`` 's step on ``hardware`` (a profile name or path, or a Hardware): its stages traced once per shape
    and costed, torch's schedule simulated rank by rank (:func:`commsched.pipeline.simulate_program`)."""
    from commsched.hardware import for_graph

    resolved = job.resolve() if isinstance(job, PipelineJob) else job
    hw = for_graph(hardware, world_size=resolved.job.world_size)
    costs = stage_costs(resolved, hardware)
    result = simulate_program(resolved.program, costs, hw, ranks_between_stages=resolved.ranks_between_stages)
    return PipelineStep(resolved, result, costs, hw)

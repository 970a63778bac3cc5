"""A zoo model trained with pipeline parallelism: its stages traced and costed, torch's schedule simulated.

PP is the outermost mesh dimension, as torchtitan builds it (``parallel_dims.py``: ``["pp", "dp_replicate",
"fsdp", "cp", "tp"]``): the ``world_size / pp_size`` ranks of a pipeline rank run the inner plan (``parallel``:
FSDP, DDP, TP / SP, FSDP + TP, EP, FSDP + EP; HSDP with ``dp_replicate``, CP with ``cp_size``, as the zoo builds
them), and pipeline rank r's ranks sit ``r x world_size / pp_size`` global ranks from rank 0's. Each step takes
``batch`` sequences per data-parallel replica, as ``microbatches`` equal micro-batches. Every option of ``predict``
applies as there: AC, float8, compile, async TP, the optimizer and gradient clipping
(:mod:`commsched.pipeline.per_step`).

:meth:`PipelineJob.resolve` checks every option (one-line ValueErrors naming it) before any tracing;
:func:`simulate_job` traces each distinct stage once (:mod:`commsched.pipeline.stages`), times FSDP's per-step
collectives with the collective model, and simulates torch's schedule (:mod:`commsched.pipeline.simulate`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

from commsched.pipeline.actions import PipelineProgram, lower_schedule
from commsched.pipeline.cache import StageRecord, stage_record
from commsched.pipeline.costs import StageCosts
from commsched.pipeline.per_step import NORM_BYTES, TailSeconds, float8_gathered, sync_seconds, tail_seconds
from commsched.pipeline.simulate import PipelineResult, simulate_program
from commsched.pipeline.split import Stage, stages_of
from commsched.pipeline.stages import async_tp_stage, param_bytes, trace_stage
from commsched.sim.model import seconds_to_ns
from commsched.workloads.ac import block_policy
from commsched.workloads.program import WorkloadSpec

PIPELINE_PARALLELISMS = ("none", "fsdp", "ddp", "tp", "tp+sp", "fsdp+tp", "fsdp+tp+sp", "ep", "fsdp+ep")
"""the inner plans a pipeline rank's ranks may run (the zoo's; HSDP and CP through ``dp_replicate`` / ``cp_size``)"""
ADAMW_STATES = 2
"""AdamW's states per parameter (exp_avg, exp_avg_sq), in the master dtype"""


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
    ep_size: int | None = None  # expert parallelism (ep, fsdp+ep; MoE presets)
    ac: str = "none"  # activation checkpointing of the blocks, as the zoo takes it (commsched.workloads.ac)
    float8: str = "none"  # float8 training of the blocks' linears: tensorwise, rowwise
    compile: bool = False  # each block compiled (its kernels fused), as predict's compile
    async_tp: bool = False  # torchtitan's async TP (needs compile and TP)
    cp_size: int = 1  # context parallelism inside each pipeline rank
    cp_rotate: str = "allgather"
    dp_replicate: int = 1  # HSDP: FSDP's shards replicated over this many groups
    optimizer: str = "adamw-fused"  # predict's default: torchtitan's fused AdamW; "none": no optimizer step
    max_norm: float | None = 1.0  # gradient clipping (torchtitan's default); None: not clipped

    def options(self) -> dict[str, Any]:
        """The options beyond the pipeline's own, as the ``--json`` record echoes them."""
        names = ("ep_size", "ac", "float8", "compile", "async_tp", "cp_size", "cp_rotate", "dp_replicate",
                 "optimizer", "max_norm", "dtype")  # fmt: skip
        return {name: getattr(self, name) for name in names}

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
        if self.parallel == "none" and inner_world != 1:
            raise ValueError(f"parallel='none': world_size={self.world_size} / pp_size={self.pp_size} leaves "
                             f"{inner_world} ranks per pipeline rank; expected 1 (or a plan "
                             "that uses them)")  # fmt: skip
        self._check_compile()
        options = dict(layers=self.layers, seq_len=self.seq_len, batch=batch // self.microbatches, dtype=self.dtype,
                       ac=self.ac, float8=self.float8, cp_size=self.cp_size, cp_rotate=self.cp_rotate,
                       optimizer=self.optimizer, max_norm=self.max_norm)  # fmt: skip
        inner = resolve(self.preset, parallel=self.parallel, world_size=inner_world, tp_size=self.tp_size,
                        ep_size=self.ep_size, dp_replicate=self.dp_replicate, **options)  # fmt: skip
        if self.async_tp and inner.plan.tp < 2:
            raise ValueError(f"async_tp: needs tensor parallelism (tp > 1); parallel={self.parallel!r} has "
                             f"tp={inner.plan.tp}")  # fmt: skip
        stages = stages_of(program.num_stages, inner.model.n_layers)
        return ResolvedJob(self, program, inner, _compute_spec(self.preset, inner, options), tuple(stages), batch)

    def _check_compile(self) -> None:
        """predict's rule (``StepConfig.check``): async TP is Inductor's, so it needs compile."""
        if self.async_tp and not self.compile:
            raise ValueError("async_tp needs compile (Inductor's micro-pipelining; torchtitan refuses it without "
                             "'model' compiled): add --compile")  # fmt: skip


def _compute_spec(preset: str, inner: WorkloadSpec, options: dict[str, Any]) -> WorkloadSpec:
    """The spec a micro-batch's program is traced with: the pipeline rank's plan without its FSDP and data-parallel
    replicas (torch's pipelining syncs gradients once per step), i.e. its TP (+SP) and CP ranks, or its EP ranks
    (each with its own tokens, the all_to_alls between them); no optimizer; the parameters in the compute dtype, as
    FSDP hands them to the blocks (mixed precision)."""
    from commsched.workloads import resolve

    plan = inner.plan
    if plan.ep > 1:
        parallel, world, extra = "ep", plan.ep, {"ep_size": plan.ep}
    elif plan.tp > 1:
        parallel, world, extra = ("tp+sp" if plan.sp else "tp"), plan.tp * plan.cp, {"tp_size": plan.tp}
    else:  # the CP ranks alone (or one rank): a data dimension of cp ranks, its gradients not all-reduced here
        parallel, world, extra = ("ddp" if plan.cp > 1 else "none"), plan.cp, {}
    step = {**options, "optimizer": "none", "max_norm": None}
    compute = resolve(preset, parallel=parallel, world_size=world, **extra, **step)
    return dataclasses.replace(compute, master_dtype=compute.dtype)


@dataclasses.dataclass(frozen=True, eq=False)
class ResolvedJob:
    """A checked :class:`PipelineJob`: torch's lowered schedule, the stage ranks' spec (``inner``: the plan on
    ``world_size / pp_size`` ranks, batch = one micro-batch), the micro-batch program's spec (``compute``: the TP,
    CP or EP part of the plan, parameters in the compute dtype) and the stages (torchtitan's split)."""

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

    def policies(self, stage: Stage) -> tuple[str, ...] | None:
        """Each of the stage's blocks' AC policy under ``ac`` (its global layer's; None: none checkpointed)."""
        n = self.inner.model.n_layers
        policies = tuple(block_policy(self.inner.ac, layer, layers=n) for layer in stage.layers)
        return None if set(policies) <= {"none"} else policies

    def trace(self, stage: Stage, hardware: Any) -> Any:
        """The stage's micro-batch program (:func:`commsched.pipeline.stages.trace_stage`, shared by equal stages),
        with async TP applied when the job runs it."""
        traced = trace_stage(self.compute, *stage.shape, self.policies(stage))
        return async_tp_stage(traced, self.compute, hardware) if self.job.async_tp else traced

    def rank_units(self, rank: int) -> tuple[str, ...]:
        """The FSDP units of every stage pipeline rank ``rank`` holds."""
        mine = [s for s in self.stages if int(self.program.stage_to_rank[s.index]) == rank]
        return tuple(unit for s in mine for unit in s.units)


@dataclasses.dataclass(frozen=True, eq=False)
class PipelineStep:
    """A simulated step of a :class:`ResolvedJob`: the pipeline result (the optimizer step included), the stage
    costs it ran with, the hardware, the schedule's own result (``schedule_result``: up to the last REDUCE_GRAD) and
    each rank's optimizer step (``tails``)."""

    job: ResolvedJob
    result: PipelineResult
    costs: StageCosts
    hardware: Any
    schedule_result: PipelineResult | None = None
    tails: tuple[TailSeconds, ...] = ()

    @property
    def step_s(self) -> float:
        return self.result.step_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """torchtitan's ``tps``: one data-parallel replica's tokens over the step, divided by TP x CP x PP."""
        inner = self.job.inner
        tokens = self.job.batch * inner.seq_len
        return tokens / self.step_s / (inner.plan.tp * inner.plan.cp * self.job.job.pp_size) if self.step_s > 0 else 0.0

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
                "layers": job.inner.model.n_layers, "hardware": self.hardware.name, "options": job.job.options(),
                "optimizer_s": [t.total_s for t in self.tails], "stages": stages}  # fmt: skip


_STAGE_FIELDS = ("forward_s", "backward_s", "backward_input_s", "backward_weight_s", "send_bytes", "activation_bytes",
                 "static_bytes", "unshard_s", "reduce_grad_s", "backward_peak_bytes")  # fmt: skip


def _at(values: Any, stage: int) -> Any:
    return values[stage] if isinstance(values, list | tuple) else values


def stage_costs(job: ResolvedJob, hardware: Any) -> StageCosts:
    """Every stage's :class:`StageCosts` fields: its traced program timed on ``hardware`` (F, B, I, W, the hidden
    state it sends, the activations it holds), its static bytes (master parameters, gradients and optimizer states
    of its shard; with FSDP also the unsharded parameters and gradients it holds all step) and its once-per-step
    collectives (:func:`commsched.pipeline.per_step.sync_seconds`)."""
    from commsched.hardware import for_graph

    fields: dict[str, list] = {name: [] for name in _STAGE_FIELDS}
    whole = for_graph(hardware, world_size=job.job.world_size)
    records: dict[tuple, StageRecord] = {}  # the stages of one job share a few shapes (first, layers, last)
    for stage in job.stages:
        shape = (stage.shape, job.policies(stage))
        traced = records.get(shape)
        if traced is None:
            traced = records[shape] = _stage_record(job, stage, hardware)
        secs = traced.times
        for name, value in dataclasses.asdict(secs).items():
            fields[name].append(value)
        fields["send_bytes"].append(traced.send_bytes)
        fields["activation_bytes"].append(traced.activation_bytes)
        fields["backward_peak_bytes"].append(traced.backward_peak_bytes)
        fields["static_bytes"].append(_static_bytes(job, stage))
        unshard_s, reduce_s = sync_seconds(job.inner, stage, whole)
        fields["unshard_s"].append(unshard_s)
        fields["reduce_grad_s"].append(reduce_s)
    return StageCosts(**fields)


def _stage_record(job: ResolvedJob, stage: Stage, hardware: Any) -> StageRecord:
    """The stage's costs per micro-batch, from the stage cache (``pipeline/cache.py``: traced once per machine, a long
    stage scaled from two short traces; with async TP each trace rewritten)."""
    return stage_record(job.compute, stage.shape, hardware, policies=job.policies(stage), fusion=job.job.compile,
                        async_tp=job.job.async_tp)  # fmt: skip


def _static_bytes(job: ResolvedJob, stage: Stage) -> int:
    """Master parameters, gradients and optimizer states (AdamW's two, none without an optimizer) of the stage's
    shard (master dtype); under FSDP also what torch's pipelining holds unsharded all step: the gathered
    compute-dtype parameters (no reshard after forward; float8 weights in one byte where FSDP gathers them so) and
    the gradients accumulated in the reduce dtype until REDUCE_GRAD."""
    inner, layout = job.inner, job.stage_layout(stage)
    shard = param_bytes(layout, inner.master_dtype, sharded=True)
    total = shard * (2 + (ADAMW_STATES if inner.optimizer != "none" else 0))
    if inner.plan.fsdp > 1:
        unsharded = param_bytes(layout, inner.dtype, sharded=False, one_byte=float8_gathered(inner))
        total += unsharded + param_bytes(layout, inner.reduce_dtype, sharded=False)
    return total


def simulate_job(job: PipelineJob | ResolvedJob, hardware: Any) -> PipelineStep:
    """``job`` 's step on ``hardware`` (a profile name or path, or a Hardware): its stages traced once per shape
    and costed, torch's schedule simulated rank by rank (:func:`commsched.pipeline.simulate_program`), then each
    rank's optimizer step (:func:`with_optimizer`)."""
    from commsched.hardware import for_graph

    resolved = job.resolve() if isinstance(job, PipelineJob) else job
    hw = for_graph(hardware, world_size=resolved.job.world_size)
    costs = stage_costs(resolved, hardware)
    result = simulate_program(resolved.program, costs, hw, ranks_between_stages=resolved.ranks_between_stages)
    tails = tuple(tail_seconds(resolved.inner, resolved.rank_units(r), hw, resolved.job.compile)
                  for r in range(resolved.job.pp_size))  # fmt: skip
    full = with_optimizer(result, tails, _pp_norm_s(resolved, hw) if resolved.inner.max_norm is not None else None)
    return PipelineStep(resolved, full, costs, hw, result, tails)


def _pp_norm_s(job: ResolvedJob, hw: Any) -> float:
    """torchtitan's all_reduce of the total gradient norm over the pipeline ranks."""
    from commsched.cost.collectives import plan_collective

    return plan_collective("all_reduce", NORM_BYTES, job.job.pp_size, hw, stride=job.ranks_between_stages).time_s


def with_optimizer(result: PipelineResult, tails: tuple[TailSeconds, ...], pp_norm_s: float | None) -> PipelineResult:
    """``result`` with each rank's optimizer step after its last action (its last REDUCE_GRAD, compute or transfer).
    ``pp_norm_s`` (clipping): the gradient norm's all_reduce over the pipeline ranks, a barrier after every rank's
    own norm (``tails[r].norm_s``), before every rank's ``after_s``; the wait counts as exposed communication.
    None: each rank steps on its own."""
    ends_ns = [int(e.max(initial=0)) for e in result.end_ns]
    norms_ns = [seconds_to_ns(t.norm_s) for t in tails]
    afters_ns = [seconds_to_ns(t.after_s) for t in tails]
    if pp_norm_s is None:
        done = [end + norm + after for end, norm, after in zip(ends_ns, norms_ns, afters_ns, strict=True)]
        waits = [0] * len(tails)
    else:
        barrier = max(end + norm for end, norm in zip(ends_ns, norms_ns, strict=True)) + seconds_to_ns(pp_norm_s)
        done = [barrier + after for after in afters_ns]
        waits = [barrier - end - norm for end, norm in zip(ends_ns, norms_ns, strict=True)]
    step_ns = max([*done, seconds_to_ns(result.step_s)])
    per_rank = []
    for r, rank in enumerate(result.per_rank):
        busy = rank.busy_s + (norms_ns[r] + afters_ns[r]) * 1e-9
        per_rank.append(dataclasses.replace(rank, busy_s=busy, bubble_s=step_ns * 1e-9 - busy,
                                            exposed_comm_s=rank.exposed_comm_s + waits[r] * 1e-9))  # fmt: skip
    return dataclasses.replace(result, step_s=step_ns * 1e-9, per_rank=tuple(per_rank))

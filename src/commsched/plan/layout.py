"""A parallel layout of a training or inference job, and the request ``commsched plan`` answers
(:class:`PlanRequest`).

A :class:`Layout` names torchtitan's degrees (``parallel_dims.py``: ``pp`` outermost, then ``dp_replicate``,
``dp_shard`` (FSDP shards over ``dp_shard x cp``), ``cp``, ``tp`` innermost) and the step's options. It maps to
the zoo's step (:meth:`Layout.step_config`: the step as FSDP2 runs it, :mod:`commsched.experiments.predict`) or,
with ``pp > 1``, to a :class:`commsched.pipeline.job.PipelineJob` (:meth:`Layout.pipeline_job`).

An inference layout (``PlanRequest.mode`` prefill or decode) has no FSDP, AC, float8 or PP: ``dp_replicate``
independent replicas of one group of ``tp x cp`` ranks (TP, CP in prefill) or, for a mixture of experts, of ``ep``
ranks (EP; ``dp_replicate`` counts every rank then: each runs its own sequences). Replicas never communicate in
inference (no gradients), so a layout is judged on one group's step (:func:`step_config`).
"""

from __future__ import annotations

import dataclasses
from typing import Any

LAYOUT_FIELDS = ("dp_shard", "dp_replicate", "tp", "sp", "pp", "pp_schedule", "microbatches", "stages_per_rank",
                 "ep", "cp", "ac", "float8", "reshard_after_forward", "async_tp")  # fmt: skip
"""the ``layout`` keys of ``plan --json`` (the issue's, plus ``sp``, ``reshard_after_forward`` and ``async_tp``)"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Layout:
    """One way to run the job: every degree (their product is the world size) and the step's options."""

    dp_shard: int
    dp_replicate: int = 1
    tp: int = 1
    sp: bool = False  # sequence parallelism around TP's blocks (torchtitan's llama3 plan always has it)
    pp: int = 1
    pp_schedule: str | None = None  # a torch.distributed.pipelining schedule (pp > 1)
    microbatches: int = 1  # M (pp > 1)
    stages_per_rank: int = 1  # V (pp > 1)
    ep: int = 1
    cp: int = 1
    ac: str = "none"
    float8: str = "none"
    reshard_after_forward: bool = True  # FSDP2's; False: each block's gathered weights held to its backward
    async_tp: bool = False  # torchtitan's enable_async_tensor_parallel (TP with SP, compiled, NVLink symmetric memory)

    @property
    def world_size(self) -> int:
        return self.dp_shard * self.dp_replicate * self.tp * self.pp * self.cp

    @property
    def dp(self) -> int:
        """Data-parallel replicas of the batch (torchtitan's ``dp_replicate x dp_shard``; CP splits sequences)."""
        return self.dp_shard * self.dp_replicate

    @property
    def fsdp(self) -> int:
        """FSDP's shard group: ``dp_shard x cp`` (torchtitan's ``fsdp`` mesh dimension)."""
        return self.dp_shard * self.cp

    def parallel(self) -> str:
        """The zoo's parallelism of the ranks inside one pipeline rank (FSDP, DDP, TP, SP as the degrees say)."""
        tp = ("+tp+sp" if self.sp else "+tp") if self.tp > 1 else ""
        if self.ep > 1:
            return "fsdp+ep"
        if self.fsdp > 1:
            return "fsdp" + tp
        if self.dp_replicate > 1 and not tp:
            return "ddp"
        return tp.removeprefix("+") or "none"

    def label(self) -> str:
        """A short name: ``fsdp 32 x tp 8 (sp) / ac full / float8 tensorwise``."""
        dims = [f"{name} {getattr(self, name)}" for name in ("pp", "dp_replicate", "dp_shard", "cp", "ep", "tp")
                if getattr(self, name) > 1]  # fmt: skip
        parts = [" x ".join(dims) or "1 GPU"]
        if self.tp > 1 and self.sp:
            parts[0] += " (sp)"
        if self.pp > 1:
            parts.append(f"{self.pp_schedule} M={self.microbatches} V={self.stages_per_rank}")
        parts.append(f"ac {self.ac}")
        if self.float8 != "none":
            parts.append(f"float8 {self.float8}")
        if not self.reshard_after_forward:
            parts.append("no reshard")
        if self.async_tp:
            parts.append("async tp")
        return " / ".join(parts)

    def to_dict(self) -> dict[str, Any]:
        return {name: getattr(self, name) for name in LAYOUT_FIELDS}

    @classmethod
    def from_dict(cls, data: dict[str, Any]) -> Layout:
        return cls(**{k: v for k, v in data.items() if k in LAYOUT_FIELDS})


INFERENCE_CHOICES = {"ac_policies": ("none",), "float8_recipes": ("none",), "max_pp": 1,
                     "reshard_after_forward": (True,), "async_tp": (False,)}  # fmt: skip
"""the training choices of an inference request, as ``plan --mode prefill|decode`` echoes them (none applies)"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PlanRequest:
    """What ``commsched plan`` is asked: a preset on ``gpus`` GPUs of ``hardware`` (None: the profile's HBM and
    GPUs per node), sequences of ``seq_len`` tokens, ``global_batch`` sequences per step (None: one per GPU), the AC
    policies, float8 recipes, pipeline schedules, FSDP reshard-after-forward and async TP values to try,
    torch.compile on or off. ``mode`` prefill or decode plans inference (the zoo's modes): ``global_batch`` is then
    the concurrent sequences, ``seq_len`` the prompt (prefill) or the positions each new token attends (decode),
    ``kv_len`` the KV cache's capacity (None: ``seq_len``); the training choices (AC, float8, PP, FSDP reshard,
    async TP) do not apply and are not enumerated."""

    preset: str
    gpus: int
    hardware: str = "h100-sxm"
    gpus_per_node: int | None = None
    hbm_gib: float | None = None
    seq_len: int | None = None
    global_batch: int | None = None
    ac_policies: tuple[str, ...] = ("none", "selective-op", "full")
    float8_recipes: tuple[str, ...] = ("none", "tensorwise")
    pp_schedules: tuple[str, ...] = ("1F1B", "Interleaved1F1B", "ZBVZeroBubble")
    max_pp: int | None = None  # the largest pipeline degree tried (None: any that divides)
    layers: int | None = None  # the model's depth (None: the preset's; fewer for quick checks)
    compile: bool = True
    reshard_after_forward: tuple[bool, ...] = (True, False)  # FSDP2's reshard_after_forward values tried (FSDP / HSDP)
    async_tp: tuple[bool, ...] = (False, True)  # async TP tried on TP + SP layouts where the hardware runs it
    layers_scale: int = 2  # trace K and 2K layers and extrapolate (0: every layer)
    dtype: str = "bfloat16"
    mode: str = "train"  # "train", "prefill" or "decode" (commsched.workloads.mesh.MODES)
    kv_len: int | None = None  # KV-cache positions per sequence (inference; None: seq_len)

    def check(self) -> None:
        """One-line ValueErrors naming the field for a request no layout can answer."""
        from commsched.pipeline.actions import parse_schedule
        from commsched.workloads.ac import parse_ac
        from commsched.workloads.float8 import parse_float8

        for name in ("gpus", "layers_scale"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < (1 if name == "gpus" else 0):
                raise ValueError(f"{name}={value!r}: expected an integer >= {1 if name == 'gpus' else 0}")
        for name in ("gpus_per_node", "seq_len", "global_batch", "max_pp", "layers", "kv_len"):
            value = getattr(self, name)
            if value is not None and (isinstance(value, bool) or not isinstance(value, int) or value < 1):
                raise ValueError(f"{name}={value!r}: expected an integer >= 1 (or None)")
        if self.hbm_gib is not None and not self.hbm_gib > 0:
            raise ValueError(f"hbm_gib={self.hbm_gib!r}: expected a number > 0")
        for name, parse in (("ac_policies", parse_ac), ("float8_recipes", parse_float8),
                            ("pp_schedules", parse_schedule)):  # fmt: skip
            values = getattr(self, name)
            if not values:
                raise ValueError(f"{name}: expected at least one")
            for value in values:
                if parse(value) != value:
                    raise ValueError(f"{name}: {value!r}: expected the canonical spelling {parse(value)!r}")
        for name in ("reshard_after_forward", "async_tp"):
            values = getattr(self, name)
            if not values or not all(isinstance(v, bool) for v in values):
                raise ValueError(f"{name}={values!r}: expected at least one of true, false")
        self._check_mode()
        self.model().validate()

    def _check_mode(self) -> None:
        from commsched.workloads.mesh import MODES

        if self.mode not in MODES:
            raise ValueError(f"mode={self.mode!r}: expected one of {', '.join(MODES)}")
        if self.kv_len is not None and not self.inference:
            raise ValueError(f"kv_len={self.kv_len}: a KV cache is for mode prefill or decode, not {self.mode!r}")
        if self.kv_len is not None and self.kv_len < self.seq:
            raise ValueError(f"kv_len={self.kv_len}: expected >= seq_len={self.seq} (the cache holds the sequence)")

    def model(self) -> Any:
        from commsched.workloads import get_preset

        model = get_preset(self.preset)
        return model if self.layers is None else dataclasses.replace(model, n_layers=self.layers)

    @property
    def seq(self) -> int:
        return self.seq_len or self.model().seq_len

    @property
    def batch(self) -> int:
        return self.global_batch or self.gpus

    @property
    def inference(self) -> bool:
        return self.mode != "train"

    @property
    def kv(self) -> int:
        """KV-cache positions per sequence (inference)."""
        return self.kv_len or self.seq

    @property
    def tokens_per_step(self) -> int:
        """Tokens a step yields over every GPU: the batch's (train, prefill: the prompts) or one new token per
        sequence (decode)."""
        return self.batch * (1 if self.mode == "decode" else self.seq)

    def flops_per_token(self) -> float:
        """Model FLOPs per token of :attr:`tokens_per_step` (MFU's numerator): torchtitan's training count, or its
        forward third for inference (2 x the parameters a token uses + 4 x layers x heads x head_dim x seq_len:
        decode attends ``seq_len`` positions; a prefill's causality not discounted, as torchtitan counts)."""
        flops = self.model().model_flops_per_token(self.seq)
        return flops / 3 if self.inference else flops


def local_batch(req: PlanRequest, layout: Layout) -> int:
    """Sequences per data-parallel replica per step (torchtitan's ``local_batch_size``)."""
    return req.batch // layout.dp


def step_config(req: PlanRequest, layout: Layout, layers: int | None) -> Any:
    """The zoo's :class:`~commsched.experiments.predict.StepConfig` of a layout without PP, at ``layers`` (None: the
    request's depth). DDP's replicas are its world (the zoo's ``dp_replicate`` is HSDP's)."""
    from commsched.experiments.predict import StepConfig

    if req.inference:
        return _inference_step_config(req, layout, layers)
    if layout.pp > 1:
        raise ValueError(f"layout {layout.label()}: pp={layout.pp} is a pipeline job, not a StepConfig")
    fsdp = "fsdp" in layout.parallel().split("+")
    extra: list[tuple[str, Any]] = []
    if layout.cp > 1:  # torchtitan's default rotation (context_parallel_rotate_method), as its configs read
        extra += [("cp_rotate", "allgather"), ("cp_size", layout.cp)]
    if layout.ep > 1:
        extra.append(("ep_size", layout.ep))
    layers = layers or req.layers
    return StepConfig(preset=req.preset, parallel=layout.parallel(), world_size=layout.world_size, layers=layers,
                      seq_len=req.seq, batch=local_batch(req, layout), dtype=req.dtype,
                      tp_size=layout.tp if layout.tp > 1 else None, ac=layout.ac, compile=req.compile,
                      float8=layout.float8, float8_all_gather=layout.float8 == "tensorwise" and fsdp,
                      dp_replicate=layout.dp_replicate if fsdp else 1, extra=tuple(extra),
                      reshard_after_forward=layout.reshard_after_forward, async_tp=layout.async_tp,
                      source="plan")  # fmt: skip


def inference_parallel(layout: Layout) -> str:
    """The zoo's inference parallelism of one replica group (one of
    :data:`commsched.workloads.mesh.INFERENCE_PARALLELISMS`)."""
    if layout.ep > 1:
        return "ep"
    if layout.tp > 1:
        return "tp+sp" if layout.sp else "tp"
    return "none"


def _inference_step_config(req: PlanRequest, layout: Layout, layers: int | None) -> Any:
    """The zoo's prefill / decode step of one replica group (``tp x cp`` ranks, or ``ep``) at ``layers``: the other
    replicas run the same step on their own sequences and never communicate with it."""
    from commsched.experiments.predict import StepConfig

    if layout.dp_shard > 1 or layout.pp > 1 or layout.ac != "none" or layout.float8 != "none" or layout.async_tp:
        raise ValueError(f"layout {layout.label()}: mode={req.mode!r} runs TP, CP (prefill), EP and replicas only")
    extra: list[tuple[str, Any]] = [("mode", req.mode), ("kv_len", req.kv)]
    if layout.cp > 1:
        extra += [("cp_rotate", "allgather"), ("cp_size", layout.cp)]
    if layout.ep > 1:
        extra.append(("ep_size", layout.ep))
    world = layout.tp * layout.cp * layout.ep  # EP: each of the group's ranks is a replica with its own sequences
    return StepConfig(preset=req.preset, parallel=inference_parallel(layout), world_size=world,
                      layers=layers or req.layers, seq_len=req.seq, batch=local_batch(req, layout), dtype=req.dtype,
                      tp_size=layout.tp if layout.tp > 1 else None, compile=req.compile, optimizer="none",
                      max_norm=None, extra=tuple(extra), source="plan")  # fmt: skip


def pipeline_job(req: PlanRequest, layout: Layout, layers: int | None) -> Any:
    """The :class:`~commsched.pipeline.job.PipelineJob` of a layout with PP, at ``layers`` (options PipelineJob
    does not have yet are refused by :func:`commsched.plan.enumerate.pipeline_options`, never dropped here)."""
    from commsched.pipeline.job import PipelineJob

    layers = layers or req.layers
    options: dict[str, Any] = {"compile": req.compile}
    if layout.ac != "none":
        options["ac"] = layout.ac
    if layout.float8 != "none":
        options["float8"] = layout.float8
    if layout.cp > 1:
        options["cp_size"] = layout.cp
    if layout.dp_replicate > 1 and layout.fsdp > 1:
        options["dp_replicate"] = layout.dp_replicate
    if layout.async_tp:
        options["async_tp"] = True
    if not layout.reshard_after_forward:  # the pipeline's stages already keep their gathered weights (torchtitan)
        raise ValueError(f"layout {layout.label()}: reshard_after_forward=False is a choice without PP only")
    return PipelineJob(preset=req.preset, parallel=layout.parallel(), world_size=layout.world_size, pp_size=layout.pp,
                       schedule=str(layout.pp_schedule), microbatches=layout.microbatches,
                       stages_per_rank=layout.stages_per_rank, tp_size=layout.tp if layout.tp > 1 else None,
                       layers=layers, seq_len=req.seq, batch=local_batch(req, layout), dtype=req.dtype,
                       **options)  # fmt: skip

"""One step of a zoo workload as a function of flat tensors, for tracing on fake tensors or running for real.

:func:`resolve` checks a request (preset, parallelism, world size, shapes) and returns a :class:`WorkloadSpec`;
every impossible dimension is a ``ValueError`` here, before any tracing. :class:`StepProgram` binds a spec to one
rank's process groups and gives the step function plus factories for its inputs (fake or real).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from collections.abc import Callable, Mapping
from typing import Any

import torch

from commsched.workloads import model
from commsched.workloads.ac import Checkpoint, block_checkpoint, parse_ac
from commsched.workloads.collectives import Comm, DDPBuckets, Group, all_reduce, ddp_buckets
from commsched.workloads.context_parallel import ROTATE_METHODS, head_tail_positions
from commsched.workloads.float8 import RECIPES, converts, parse_float8
from commsched.workloads.mesh import INFERENCE_PARALLELISMS, MODES, ParallelPlan, make_plan, with_cp
from commsched.workloads.optimizer import (
    clip_grad_norm_,
    norm_sets,
    optimizer_step,
    parse_max_norm,
    parse_optimizer,
    state_shapes,
    state_tensors,
)
from commsched.workloads.params import ParamInfo, init_full_params, param_layout, shard_for_rank
from commsched.workloads.presets import ModelConfig, get_preset
from commsched.workloads.sources import FSDPSource, ParamSource, reshard_policy

_DTYPES = {"bfloat16": torch.bfloat16, "float16": torch.float16, "float32": torch.float32}
DDP_BUCKET_CAP_BYTES = 25 * 1024 * 1024  # torch DDP bucket_cap_mb=25
DDP_FIRST_BUCKET_BYTES = 1024 * 1024  # torch.distributed._DEFAULT_FIRST_BUCKET_BYTES


def dtype_of(d: str | torch.dtype) -> torch.dtype:
    if isinstance(d, torch.dtype):
        if d not in _DTYPES.values():
            raise ValueError(f"dtype {d} is not supported: expected one of {', '.join(_DTYPES)}")
        return d
    try:
        return _DTYPES[str(d).removeprefix("torch.")]
    except KeyError:
        raise ValueError(f"dtype {d!r} is not supported: expected one of {', '.join(_DTYPES)}") from None


def dtype_name(d: torch.dtype) -> str:
    return str(d).removeprefix("torch.")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class WorkloadSpec:
    """A resolved request: everything the step needs except the process groups."""

    model: ModelConfig  # n_layers already overridden
    plan: ParallelPlan
    mode: str
    seq_len: int  # train: sequence length; prefill: prompt length; decode: positions attended (cache incl. new)
    batch: int  # sequences per data-parallel replica (per TP group)
    kv_len: int  # KV-cache capacity (inference)
    dtype: torch.dtype  # compute / parameter dtype
    master_dtype: torch.dtype  # stored parameters in training (fp32 master weights)
    reduce_dtype: torch.dtype  # gradient reductions
    fsdp_bucket: str  # "param": one all_gather / reduce_scatter per parameter; "block": one per FSDP unit
    attention: str  # "flash" or "sdpa"
    capacity_factor: float  # MoE
    layout: tuple[ParamInfo, ...]
    ac: str = "none"  # activation checkpointing of the blocks (commsched.workloads.ac): none, full, selective-...
    float8: str = "none"  # float8 training of the blocks' linears (commsched.workloads.float8): tensorwise, rowwise
    cp_rotate: str = "allgather"  # context parallelism (plan.cp > 1): K/V rotation, allgather | alltoall
    optimizer: str = "none"  # the optimizer step ending a training step (commsched.workloads.optimizer): adamw, ...
    max_norm: float | None = None  # gradients clipped to this total norm before the update (None: not clipped)
    reshard_after_forward: bool = True  # FSDP2's option: False holds each block's gathered parameters until backward

    @property
    def float8_params(self) -> frozenset[int]:
        """Indices (in ``layout``) of the weights of the float8 linears (empty with ``float8="none"``)."""
        if self.float8 == "none":
            return frozenset()
        return frozenset(pid for pid, p in enumerate(self.layout) if converts(p.key, p.full_shape))

    @property
    def float8_all_gather(self) -> bool:
        """Whether FSDP gathers the float8 linears' weights in float8 (tensorwise under FSDP, as torchtitan's
        ``enable_fsdp_float8_all_gather`` config runs it)."""
        return self.float8 == "tensorwise" and self.plan.fsdp > 1 and bool(self.float8_params)

    @property
    def float8_tp(self) -> bool:
        """Whether tensor parallelism runs torchao's float8 TP styles (tensorwise under TP, as torchtitan's
        ``enable_float8_tensorwise_tp``): the activations gathered in float8 (:mod:`commsched.workloads.float8`)."""
        return self.float8 != "none" and RECIPES[self.float8].float8_tp and self.plan.tp > 1

    @property
    def train(self) -> bool:
        return self.mode == "train"

    @property
    def new_tokens(self) -> int:
        """Tokens each TP group (each TP x CP group under context parallelism) processes in the step."""
        return self.batch * (1 if self.mode == "decode" else self.seq_len)

    def step_options(self) -> dict[str, Any]:
        """The :func:`resolve` options that shape the step itself rather than its parallelism (to resolve the same
        step under another plan)."""
        return {name: getattr(self, name) for name in _STEP_OPTIONS}


# WorkloadSpec fields that are also resolve options and do not depend on the parallel plan
_STEP_OPTIONS = (
    "seq_len",
    "batch",
    "dtype",
    "mode",
    "kv_len",
    "reduce_dtype",
    "attention",
    "capacity_factor",
    "ac",
    "float8",
    "optimizer",
    "max_norm",
)


def resolve(
    preset: str | ModelConfig,
    *,
    parallel: str,
    world_size: int,
    layers: int | None = None,
    seq_len: int | None = None,
    batch: int | None = None,
    dtype: str | torch.dtype = "bfloat16",
    mode: str = "train",
    kv_len: int | None = None,
    tp_size: int | None = None,
    ep_size: int | None = None,
    fsdp_bucket: str = "param",
    reduce_dtype: str | torch.dtype = "float32",
    attention: str = "flash",
    capacity_factor: float = 1.0,
    ac: str = "none",
    float8: str = "none",
    cp_size: int = 1,
    cp_rotate: str = "allgather",
    dp_replicate: int = 1,
    optimizer: str = "none",
    max_norm: float | None = None,
    reshard_after_forward: bool = True,
) -> WorkloadSpec:
    """Validate a request; every impossible dimension raises ValueError naming it. ``ac``: activation checkpointing of
    the transformer blocks (training only): ``"none"``, ``"full"``, ``"selective-op"`` or ``"selective-layer:N"``
    (:mod:`commsched.workloads.ac`). ``float8``: float8 training of the blocks' linears (training only; under tensor
    parallelism tensorwise runs torchao's float8 TP styles): ``"none"``, ``"tensorwise"`` or ``"rowwise"``
    (:mod:`commsched.workloads.float8`). ``cp_size``: context parallelism over consecutive ranks of the data dimension,
    torch's ring attention with K/V rotated by ``cp_rotate`` (``"allgather"``, torchtitan's default, or ``"alltoall"``;
    :mod:`commsched.workloads.context_parallel`). ``dp_replicate``: HSDP, the FSDP shards replicated over this many
    groups (fsdp, fsdp+tp, fsdp+tp+sp). ``optimizer``: the AdamW step ending a training step, ``"none"``, ``"adamw"``
    (foreach) or ``"adamw-fused"`` (:mod:`commsched.workloads.optimizer`). ``max_norm``: the gradients clipped to this
    total norm first, as torchtitan's ``training.max_norm`` (None: not clipped). ``reshard_after_forward``: FSDP2's
    option (FSDP plans only); False keeps every unit's gathered parameters from its forward to its backward, which
    then gathers nothing (torchtitan's ``fsdp_reshard_after_forward = "never"``)."""
    cfg = get_preset(preset) if isinstance(preset, str) else preset
    if layers is not None:
        if layers < 1:
            raise ValueError(f"layers={layers}: expected >= 1")
        cfg = dataclasses.replace(cfg, n_layers=layers)
    cfg.validate()
    if mode not in MODES:
        raise ValueError(f"unknown mode {mode!r}: expected one of {', '.join(MODES)}")
    if mode != "train" and parallel not in INFERENCE_PARALLELISMS:
        raise ValueError(
            f"mode={mode!r} is supported for parallel in {INFERENCE_PARALLELISMS}, not {parallel!r} "
            "(FSDP and DDP are training parallelisms)"
        )
    if attention not in ("flash", "sdpa"):
        raise ValueError(f"attention={attention!r}: expected 'flash' or 'sdpa'")
    if fsdp_bucket not in ("param", "block"):
        raise ValueError(f"fsdp_bucket={fsdp_bucket!r}: expected 'param' or 'block'")
    if not capacity_factor > 0:
        raise ValueError(f"capacity_factor={capacity_factor}: expected > 0")
    ac = parse_ac(ac, layers=cfg.n_layers)  # a per-layer value gives one policy per block
    if ac != "none" and mode != "train":
        raise ValueError(f"ac={ac!r} is for mode='train' (activation checkpointing recomputes the forward in the "
                         f"backward), not mode={mode!r}; use ac='none'")  # fmt: skip
    float8 = parse_float8(float8)
    if float8 != "none" and mode != "train":
        raise ValueError(f"float8={float8!r} is for mode='train' (torchao's float8 training of the linears), not "
                         f"mode={mode!r}; use float8='none'")  # fmt: skip
    optimizer = parse_optimizer(optimizer)
    if optimizer != "none" and mode != "train":
        raise ValueError(f"optimizer={optimizer!r} is for mode='train', not mode={mode!r}; use optimizer='none'")
    max_norm = parse_max_norm(max_norm)
    if max_norm is not None and mode != "train":
        raise ValueError(f"max_norm={max_norm} clips a training step's gradients, not mode={mode!r}; use max_norm=None")
    plan = make_plan(
        parallel,
        world_size,
        tp_size=tp_size,
        ep_size=ep_size,
        n_experts=cfg.n_experts,
        tp_divides=math.gcd(cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim),
        dp_replicate=dp_replicate,
    )
    plan = _with_cp(plan, cp_size, cp_rotate, mode, cfg.seq_len if seq_len is None else seq_len, kv_len)
    if not isinstance(reshard_after_forward, bool) or not (reshard_after_forward or plan.fsdp > 1):
        raise ValueError(f"reshard_after_forward={reshard_after_forward!r}: expected True, or False under FSDP "
                         f"(parallel={parallel!r} shards no parameters)")  # fmt: skip
    seq_len = cfg.seq_len if seq_len is None else seq_len
    batch = (8 if mode == "decode" else 1) if batch is None else batch
    if seq_len < 1 or batch < 1:
        raise ValueError(f"seq_len={seq_len}, batch={batch}: expected both >= 1")
    kv_len = seq_len if kv_len is None else kv_len
    if mode != "train" and kv_len < seq_len:
        raise ValueError(f"kv_len={kv_len} is smaller than seq_len={seq_len}: the KV cache cannot hold the sequence")
    _check_tp(cfg, plan)
    spec_tokens = batch * (1 if mode == "decode" else seq_len) // plan.cp
    if plan.sp and spec_tokens % plan.tp:
        raise ValueError(
            f"sequence parallelism splits the {spec_tokens} tokens of a step (batch={batch} x "
            f"{'1' if mode == 'decode' else f'seq_len={seq_len}'}) over tp={plan.tp} ranks: they must divide evenly"
        )
    cdt = dtype_of(dtype)
    layout = param_layout(cfg, plan)
    if float8 != "none" and RECIPES[float8].float8_tp and plan.tp > 1:  # WorkloadSpec.float8_tp
        _check_float8_tp(layout, cfg, float8)
    return WorkloadSpec(
        model=cfg,
        plan=plan,
        mode=mode,
        seq_len=seq_len,
        batch=batch,
        kv_len=kv_len,
        dtype=cdt,
        master_dtype=torch.float32 if mode == "train" else cdt,
        reduce_dtype=dtype_of(reduce_dtype),
        fsdp_bucket=fsdp_bucket,
        attention=attention,
        capacity_factor=capacity_factor,
        layout=tuple(layout),
        ac=ac,
        float8=float8,
        cp_rotate=cp_rotate,
        optimizer=optimizer,
        max_norm=max_norm,
        reshard_after_forward=reshard_after_forward,
    )


def _with_cp(plan: ParallelPlan, cp: int, rotate: str, mode: str, seq_len: int, kv_len: int | None) -> ParallelPlan:
    """The plan with context parallelism (``with_cp``); one-line ValueErrors naming the field."""
    if rotate not in ROTATE_METHODS:
        raise ValueError(f"cp_rotate={rotate!r}: expected one of {', '.join(ROTATE_METHODS)}")
    if cp == 1:
        return plan
    if cp < 1:
        raise ValueError(f"cp_size={cp}: expected >= 1")
    if mode == "decode":
        raise ValueError(f"cp_size={cp} is for mode='train' or 'prefill' (the sequence is split), not mode='decode'")
    if seq_len % (2 * cp):
        raise ValueError(f"cp_size={cp} does not split seq_len={seq_len} head-tail: seq_len must be a multiple of "
                         f"2 x cp_size = {2 * cp} (torch's load-balanced causal sharding)")  # fmt: skip
    if mode == "prefill" and (kv_len if kv_len is not None else seq_len) % cp:
        raise ValueError(f"cp_size={cp} does not divide kv_len={kv_len}: each CP rank caches 1/cp of it")
    return with_cp(plan, cp)


def _check_float8_tp(layout: list[ParamInfo], cfg: ModelConfig, float8: str) -> None:
    """torchao's float8 TP styles take Float8Linears only (``Float8ColwiseParallel._apply`` raises otherwise):
    under TP with such a recipe every dense block linear must convert."""
    keys = {"wq", "wk", "wv", "wo"} if cfg.is_moe else {"wq", "wk", "wv", "wo", "w1", "w2", "w3"}
    kept = sorted({p.key for p in layout if p.key in keys and not converts(p.key, p.full_shape)})
    if kept:
        raise ValueError(f"float8={float8!r} under tensor parallelism: {cfg.name}'s linears {', '.join(kept)} do "
                         "not convert to float8 (both dimensions must be multiples of 16), and torchao's "
                         "Float8ColwiseParallel / Float8RowwiseParallel take float8 linears only")  # fmt: skip


def _check_tp(cfg: ModelConfig, plan: ParallelPlan) -> None:
    tp = plan.tp
    if tp == 1:
        return
    for field, value in (("n_heads", cfg.n_heads), ("n_kv_heads", cfg.n_kv_heads), ("ffn_dim", cfg.ffn_dim)):
        if value % tp:
            more = " (more TP ranks than heads)" if field != "ffn_dim" and tp > value else ""
            raise ValueError(
                f"tp={tp} does not divide {cfg.name} {field}={value}{more}; choose a tp_size that divides it "
                "(ranks beyond it become data-parallel replicas)"
            )


class StepProgram:
    """The step of ``spec`` on ``rank``: ``step(*inputs)`` and the names and factories of its inputs.

    Inputs, in order: the stored parameters (``spec.layout`` order), then ``tokens``, (``labels``), ``rope_cos``,
    ``rope_sin``, and for inference the KV caches ``cache_k.<i>``, ``cache_v.<i>``; with an optimizer its states
    (:func:`commsched.workloads.optimizer.state_shapes`), updated in place after the gradients. Train returns
    ``[loss, *gradients]`` (one per parameter, the optimizer's view); inference returns ``[logits]``.
    """

    def __init__(self, spec: WorkloadSpec, groups: Mapping[str, Any], rank: int = 0) -> None:
        self.spec, self.rank = spec, rank
        plan, cfg = spec.plan, spec.model
        self.coords = plan.coords(rank)
        self.groups = {name: Group.of(pg, rank) for name, pg in groups.items()}
        self.comm = Comm(
            tp=self.groups.get("tp") if plan.tp > 1 else None,
            sp=plan.sp,
            ep=self.groups.get("ep") if plan.ep > 1 else None,
            cp=self.groups.get("cp") if plan.cp > 1 else None,
            cp_rotate=spec.cp_rotate,
        )
        n_tokens = spec.new_tokens // plan.cp
        vocab_rows = next(p for p in spec.layout if p.key == "tok_embeddings").local_shape[0]
        self.shapes = model.Shapes(
            batch=spec.batch,
            seq=1 if spec.mode == "decode" else spec.seq_len // plan.cp,
            past=spec.seq_len - 1 if spec.mode == "decode" else 0,
            heads=cfg.n_heads // plan.tp,
            kv_heads=cfg.n_kv_heads // plan.tp,
            vocab_start=self.coords.get("tp", 0) * vocab_rows,
            attention=spec.attention,
            capacity=model.moe_capacity(n_tokens, cfg, spec.capacity_factor) if cfg.is_moe else 0,
        )
        self.n_params = len(spec.layout)
        self.on_layer: Callable[[int], None] | None = None  # called as the forward reaches each block
        # a prefill or a training step: each sequence run as this many chunks, layer by layer
        # (rewrites/split_sequence.py); each chunk's work is traced inside chunk_scope(chunk)
        self.seq_chunks = 1
        self.chunk_scope: Callable[[int], contextlib.AbstractContextManager] = lambda c: contextlib.nullcontext()

    # -------------------------------------------------------------- inputs
    @property
    def input_names(self) -> list[str]:
        names = [p.name for p in self.spec.layout] + ["tokens"]
        if self.spec.train:
            names.append("labels")
        names += ["rope_cos", "rope_sin"]
        if not self.spec.train:
            for i in range(self.spec.model.n_layers):
                names += [f"cache_k.{i}", f"cache_v.{i}"]
        return names + [name for name, _, _ in self._optimizer_shapes()]

    def _optimizer_shapes(self) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        spec = self.spec
        return state_shapes(spec.layout, spec.master_dtype) if spec.optimizer != "none" else []

    def _data_shapes(self) -> list[tuple[str, tuple[int, ...], torch.dtype]]:
        spec, s, cfg = self.spec, self.shapes, self.spec.model
        out = [("tokens", (s.batch, s.seq), torch.int64)]
        if spec.train:
            out.append(("labels", (s.batch, s.seq), torch.int64))
        out += [("rope_cos", (s.seq, 1, cfg.head_dim), spec.dtype), ("rope_sin", (s.seq, 1, cfg.head_dim), spec.dtype)]
        if not spec.train:
            cache = (s.batch, s.kv_heads, spec.kv_len // spec.plan.cp, cfg.head_dim)
            for i in range(cfg.n_layers):
                out += [(f"cache_k.{i}", cache, spec.dtype), (f"cache_v.{i}", cache, spec.dtype)]
        return out

    def empty_inputs(self) -> list[torch.Tensor]:
        """Uninitialised inputs of the right shapes; call under FakeTensorMode to allocate nothing."""
        spec = self.spec
        params = [torch.empty(p.shard_shape, dtype=spec.master_dtype, requires_grad=spec.train) for p in spec.layout]
        return params + [torch.empty(shape, dtype=dt) for _, shape, dt in self._data_shapes()] + self._states()

    def _states(self) -> list[torch.Tensor]:
        """Fresh optimizer states (none without an optimizer): zeros, step counters at 0."""
        spec = self.spec
        return state_tensors(spec.optimizer, spec.layout, spec.master_dtype) if spec.optimizer != "none" else []

    def real_inputs(
        self,
        *,
        seed: int = 0,
        full_params: Mapping[str, torch.Tensor] | None = None,
        replica: int | None = None,
    ) -> list[torch.Tensor]:
        """Real inputs of this rank: its shards of deterministic parameters (``init_full_params``), then random
        tokens and KV caches drawn per data-parallel ``replica`` (default: this rank's; TP ranks share theirs),
        the caches' heads split over TP, and the RoPE tables."""
        spec, s, cfg = self.spec, self.shapes, self.spec.model
        full = init_full_params(cfg, seed=seed) if full_params is None else full_params
        params = []
        for p in spec.layout:
            t = shard_for_rank(p, full[p.name], spec.plan, self.rank).to(spec.master_dtype)
            params.append(t.requires_grad_(spec.train))
        if replica is None:  # TP (and CP) ranks share their batch; every other rank has its own
            replica = self.rank // (spec.plan.tp * spec.plan.cp)
        gen = torch.Generator().manual_seed(seed * 1_000_003 + replica)
        full_seq = s.seq * spec.plan.cp
        # context parallelism: this rank's head-tail positions of each sequence (torchtitan's cp_shard)
        mine = head_tail_positions(full_seq, spec.plan.cp, self.coords["cp"]) if spec.plan.cp > 1 else slice(None)
        tokens = torch.randint(0, cfg.vocab_size, (s.batch, full_seq), generator=gen)
        out = [*params, tokens[:, mine]]
        if spec.train:
            out.append(torch.randint(0, cfg.vocab_size, (s.batch, full_seq), generator=gen)[:, mine])
        positions = torch.arange(s.past, s.past + full_seq)[mine]
        out += list(model.rope_tables(cfg, positions, spec.dtype))
        if not spec.train:
            full_cache = (s.batch, cfg.n_kv_heads, spec.kv_len // spec.plan.cp, cfg.head_dim)
            tp_rank = self.coords.get("tp", 0)
            for _ in range(2 * cfg.n_layers):
                cache = torch.randn(full_cache, generator=gen) * 0.5
                out.append(cache.chunk(spec.plan.tp, dim=1)[tp_rank].contiguous().to(spec.dtype))
        return out + self._states()

    # -------------------------------------------------------------- the step
    def _source(self, params: list[torch.Tensor]) -> ParamSource:
        spec, plan = self.spec, self.spec.plan
        sp_group = self.comm.tp if (plan.sp and spec.train) else None
        common = dict(compute_dtype=spec.dtype, reduce_dtype=spec.reduce_dtype)
        if spec.float8 != "none":
            common.update(float8=RECIPES[spec.float8], float8_pids=spec.float8_params)
        if plan.fsdp > 1:
            expert = {}
            if plan.expert_fsdp:  # fsdp+ep: experts on their own FSDP group (none: one replica of each expert)
                expert_group = self.groups.get(plan.fsdp_dim(True)) if plan.expert_fsdp > 1 else None
                expert = dict(expert_group=expert_group, expert_grad_scale=1.0 / plan.ep)
            return FSDPSource(
                spec.layout,
                params,
                group=self.groups[plan.fsdp_dim(False)],
                replicate_group=self.groups.get("dp_replicate") if plan.replicate > 1 else None,
                bucket=spec.fsdp_bucket,
                reshard=reshard_policy(spec.reshard_after_forward),
                hold_gathered=not spec.reshard_after_forward,
                sp_group=sp_group,
                float8_all_gather=spec.float8_all_gather,
                tp_group=self.comm.tp,
                **expert,
                **common,
            )
        buckets = [
            DDPBuckets(
                self.groups[group],
                order,
                {pid: spec.layout[pid].shard_shape for pid in order},
                assignment,
                spec.reduce_dtype,
            )
            for group, order, assignment in self._bucket_plan()
        ]
        return ParamSource(
            spec.layout,
            params,
            train=spec.train,
            buckets=buckets,
            sp_group=sp_group,
            expert_grad_scale=1.0 / plan.ep,
            **common,
        )

    def _bucket_plan(self) -> list[tuple[str, list[int], list[list[int]]]]:
        """(group, parameter ids in gradient-ready order, bucket assignment) of each DDP gradient group."""
        spec, plan = self.spec, self.spec.plan
        if not spec.train or plan.fsdp > 1:
            return []
        if plan.ep > 1:
            members = [("world", lambda p: not p.expert)]
            if plan.dims["edp"] > 1:
                members.append(("edp", lambda p: p.expert))
        elif plan.dp > 1:
            members = [("dp", lambda p: True)]
        else:
            return []
        out = []
        for group, member in members:
            order = [pid for pid in reversed(range(self.n_params)) if member(spec.layout[pid])]
            sizes = [math.prod(spec.layout[pid].shard_shape) * spec.reduce_dtype.itemsize for pid in order]
            buckets = ddp_buckets(sizes, cap_bytes=DDP_BUCKET_CAP_BYTES, first_cap_bytes=DDP_FIRST_BUCKET_BYTES)
            out.append((group, order, buckets))
        return out

    def ddp_bucket_names(self) -> dict[str, list[list[str]]]:
        """Parameter names of each DDP bucket in launch order, per mesh group (empty without DDP)."""
        layout = self.spec.layout
        return {
            group: [[layout[order[j]].name for j in bucket] for bucket in buckets]
            for group, order, buckets in self._bucket_plan()
        }

    def step(self, *inputs: torch.Tensor) -> list[torch.Tensor]:
        spec, cfg, s, comm = self.spec, self.spec.model, self.shapes, self.comm
        params = list(inputs[: self.n_params])
        data = iter(inputs[self.n_params :])
        tokens = next(data)
        labels = next(data) if spec.train else None
        rope = (next(data), next(data))
        caches = [(next(data), next(data)) for _ in range(cfg.n_layers)] if not spec.train else None
        states = list(data)  # the optimizer's (none without one)
        src = self._source(params)
        src.start_step()
        if self.seq_chunks > 1:
            out = self._chunked(src, tokens, labels, rope, caches)
        else:
            h = src.run("embed", lambda p: model.embed(p, tokens, s, comm))
            for i in range(cfg.n_layers):
                if self.on_layer is not None:
                    self.on_layer(i)
                cache = caches[i] if caches is not None else None
                checkpoint = self.block_checkpoint(i)
                h = src.run(f"layers.{i}", lambda p, h, c=cache: model.block(p, h, cfg, s, comm, rope, c), h,
                            checkpoint=checkpoint)  # fmt: skip
            if spec.train:
                out = src.run("final", lambda p: model.head_loss(p, h, labels, cfg, s, comm))
            else:
                out = src.run("final", lambda p: model.head_logits(p, h, cfg, s, comm))
        if not spec.train:
            return [out]
        grads = src.finalize(list(torch.autograd.grad(out, params)))
        if spec.max_norm is not None:  # torchtitan's clipping, on the gradients as the optimizer reads them
            grads = [g if g.dtype == p.dtype else g.to(p.dtype) for p, g in zip(params, grads, strict=True)]
            clip_grad_norm_(grads, spec.max_norm, norm_sets(spec.layout, spec.plan),
                            lambda t, dim: all_reduce(t, self.groups[dim]),
                            {dim: self.groups[dim].size for dim in self.groups})  # fmt: skip
        if spec.optimizer != "none":  # the step's last work: params and states updated in place
            optimizer_step(spec.optimizer, params, grads, states)
        return [out, *grads]

    def block_checkpoint(self, layer: int) -> Checkpoint | None:
        """The activation checkpoint block ``layer`` runs under (``spec.ac``; None: none)."""
        cfg = self.spec.model
        return block_checkpoint(self.spec.ac, layer, moe_router_shape=(cfg.dim, cfg.n_experts) if cfg.is_moe else None)

    def chunk_shapes(self, chunks: int) -> list[model.Shapes]:
        """The shapes of each of ``chunks`` equal pieces of every sequence (a training step's or a prefill's
        prompt): chunk ``c`` holds positions ``[c L, (c + 1) L)`` (``past = c L``), a MoE's expert capacity is per
        chunk. Raises ValueError for a decode or where the pieces would not be equal (or, under sequence
        parallelism, would not divide over the TP ranks)."""
        spec, s = self.spec, self.shapes
        if spec.plan.cp > 1:
            raise ValueError(f"cp={spec.plan.cp}: a context-parallel step is not split into sequence chunks")
        if spec.mode == "decode" or chunks < 2 or s.seq % chunks:
            raise ValueError(f"{spec.mode} of {s.seq} positions: chunks={chunks} needs a sequence that divides into "
                             ">= 2 equal chunks (train or prefill)")  # fmt: skip
        length = s.seq // chunks
        if spec.plan.sp and s.batch * length % spec.plan.tp:
            raise ValueError(f"sequence parallelism: a chunk's {s.batch * length} tokens do not divide over "
                             f"tp={spec.plan.tp}")  # fmt: skip
        cfg = spec.model
        capacity = model.moe_capacity(s.batch * length, cfg, spec.capacity_factor) if cfg.is_moe else 0
        return [dataclasses.replace(s, seq=length, past=c * length, capacity=capacity) for c in range(chunks)]

    def _chunked(self, src: ParamSource, tokens: torch.Tensor, labels: torch.Tensor | None, rope: tuple,
                 caches: list | None) -> torch.Tensor:  # fmt: skip
        """The step's sequences as :meth:`chunk_shapes` pieces, layer by layer, each unit's parameters taken once
        for all chunks (one gather, one gradient per parameter): layer ``i`` of chunk ``c`` attends to every
        position before its own end (causal, bottom-right), reading layer ``i``'s keys and values of chunks
        ``0 .. c`` (a prefill from the KV cache it writes; training from the earlier chunks' tensors), so it runs
        after layer ``i`` of chunk ``c - 1``. Returns the loss (the mean of the chunks' mean losses: the whole
        step's) or the logits (each sequence's last position: the last chunk's). The step's function, but for a
        MoE's per-chunk expert capacity."""
        cfg, comm = self.spec.model, self.comm
        shapes = self.chunk_shapes(self.seq_chunks)
        spans = [slice(s.past, s.past + s.seq) for s in shapes]

        def each(fn: Callable[[int, model.Shapes, slice], Any]) -> list[Any]:
            out = []
            for c, (s, span) in enumerate(zip(shapes, spans, strict=True)):
                with self.chunk_scope(c):
                    out.append(fn(c, s, span))
            return out

        hs = src.run("embed", lambda p: each(lambda c, s, span: model.embed(p, tokens[:, span], s, comm)))
        for i in range(cfg.n_layers):
            if self.on_layer is not None:
                self.on_layer(i)
            kv = caches[i] if caches is not None else None

            def layer(p, *hs, kv=kv):
                prefix = None if kv is not None else []  # a fresh list each call: a checkpoint's recompute too
                return each(lambda c, s, span: model.block(p, hs[c], cfg, s, comm, (rope[0][span], rope[1][span]),
                                                           kv, prefix))  # fmt: skip

            hs = src.run(f"layers.{i}", layer, *hs, checkpoint=self.block_checkpoint(i))
        if labels is None:
            with self.chunk_scope(len(shapes) - 1):
                return src.run("final", lambda p: model.head_logits(p, hs[-1], cfg, shapes[-1], comm))
        losses = src.run("final", lambda p: each(lambda c, s, span: model.head_loss(p, hs[c], labels[:, span], cfg,
                                                                                    s, comm)))  # fmt: skip
        return torch.stack(losses).mean()

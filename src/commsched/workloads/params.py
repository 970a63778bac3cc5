"""Parameters of a zoo model: names, unsharded shapes, and each rank's local shard under a parallel plan.

Sharding follows the systems the plans imitate: Megatron / torchtitan tensor parallelism (column-parallel weights
split on the output dimension, row-parallel on the input dimension, the vocabulary split for the embedding and
the output layer, padded to a multiple of the TP degree); expert parallelism splits the expert dimension; FSDP2
splits dim 0 of the (TP-local) tensor into ``ceil(rows / fsdp)`` rows per rank, padding the tail with zeros. Under
``fsdp+ep`` expert weights are FSDP-sharded over their own group (world / ep ranks), on dim 1 when their local dim 0
(experts per rank) has fewer rows than that group has ranks, as torchtitan's ``shard_placement_fn`` does.
"""

from __future__ import annotations

import dataclasses
import math

import torch

from commsched.workloads.mesh import ParallelPlan
from commsched.workloads.presets import ModelConfig


@dataclasses.dataclass(frozen=True, slots=True)
class ParamInfo:
    name: str  # full name, e.g. "layers.3.attention.wq.weight"
    unit: str  # FSDP unit (module wrapped by fully_shard): "embed", "layers.<i>" or "final"
    key: str  # short name inside the unit, e.g. "wq"
    full_shape: tuple[int, ...]  # unsharded, unpadded
    tp_dim: int | None  # dimension split over tensor-parallel ranks (None: replicated)
    expert: bool  # split over expert-parallel ranks on dim 0; gradients sync over the expert-data-parallel group
    local_shape: tuple[int, ...]  # after vocab padding and TP / EP splits (the shape the model computes with)
    shard_shape: tuple[int, ...]  # what the rank stores: local_shape split over FSDP (== local_shape without FSDP)
    fsdp_pad_rows: int  # rows of zeros appended to dim 0 of local_shape before the FSDP split
    vocab_pad_rows: int  # rows appended to the vocabulary so that it divides the TP degree
    sp_partial: bool  # replicated under TP, but sequence parallelism leaves a partial gradient on each TP rank
    fsdp_shard_dim: int = 0  # the dimension FSDP splits (1 for expert weights with fewer experts than FSDP ranks)

    @property
    def numel(self) -> int:
        return math.prod(self.full_shape)


def _block_params(cfg: ModelConfig) -> list[tuple[str, tuple[int, ...], int | None, bool]]:
    """(key, full shape, tp dim, expert) of one block in forward-use order."""
    hd, d = cfg.head_dim, cfg.dim
    out: list[tuple[str, tuple[int, ...], int | None, bool]] = [
        ("attention_norm", (d,), None, False),
        ("wq", (cfg.n_heads * hd, d), 0, False),
        ("wk", (cfg.n_kv_heads * hd, d), 0, False),
        ("wv", (cfg.n_kv_heads * hd, d), 0, False),
        ("wo", (d, cfg.n_heads * hd), 1, False),
        ("ffn_norm", (d,), None, False),
    ]
    if cfg.is_moe:
        e, f = cfg.n_experts, cfg.ffn_dim
        out += [
            ("gate", (e, d), None, False),
            ("w1", (e, f, d), 1, True),
            ("w3", (e, f, d), 1, True),
            ("w2", (e, d, f), 2, True),
        ]
    else:
        f = cfg.ffn_dim
        out += [("w1", (f, d), 0, False), ("w3", (f, d), 0, False), ("w2", (d, f), 1, False)]
    return out


_FULL_NAMES = {
    "attention_norm": "attention_norm.weight",
    "ffn_norm": "ffn_norm.weight",
    "wq": "attention.wq.weight",
    "wk": "attention.wk.weight",
    "wv": "attention.wv.weight",
    "wo": "attention.wo.weight",
    "gate": "feed_forward.router.gate.weight",
}


def _full_name(unit: str, key: str, moe: bool) -> str:
    if unit == "embed":
        return "tok_embeddings.weight"
    if unit == "final":
        return f"{key}.weight"
    if key in _FULL_NAMES:
        return f"{unit}.{_FULL_NAMES[key]}"
    return f"{unit}.feed_forward.{'experts.' if moe else ''}{key}{'' if moe else '.weight'}"


def param_layout(cfg: ModelConfig, plan: ParallelPlan) -> list[ParamInfo]:
    """Every parameter in model order (embedding, blocks, final norm, output) with its local shard shape."""
    entries: list[tuple[str, str, tuple[int, ...], int | None, bool]] = [
        ("embed", "tok_embeddings", (cfg.vocab_size, cfg.dim), 0, False)
    ]
    for i in range(cfg.n_layers):
        entries += [(f"layers.{i}", key, shape, tp_dim, exp) for key, shape, tp_dim, exp in _block_params(cfg)]
    entries += [("final", "norm", (cfg.dim,), None, False), ("final", "output", (cfg.vocab_size, cfg.dim), 0, False)]
    out = []
    for unit, key, full, tp_dim, expert in entries:
        local = list(full)
        vocab_pad = 0
        if key in ("tok_embeddings", "output") and plan.tp > 1:
            vocab_pad = -full[0] % plan.tp
            local[0] = full[0] + vocab_pad
        if tp_dim is not None and plan.tp > 1:
            local[tp_dim] //= plan.tp  # divisibility was checked when the spec was resolved
        if expert and plan.ep > 1:
            local[0] //= plan.ep
        shard, pad_rows, shard_dim = _fsdp_shard(local, plan.fsdp_degree(expert), expert and plan.expert_fsdp > 0)
        out.append(
            ParamInfo(
                name=_full_name(unit, key, cfg.is_moe),
                unit=unit,
                key=key,
                full_shape=tuple(full),
                tp_dim=tp_dim,
                expert=expert,
                local_shape=tuple(local),
                shard_shape=tuple(shard),
                fsdp_pad_rows=pad_rows,
                vocab_pad_rows=vocab_pad,
                sp_partial=plan.sp and key in ("attention_norm", "ffn_norm", "norm"),
                fsdp_shard_dim=shard_dim,
            )
        )
    return out


def _fsdp_shard(local: list[int], degree: int, own_group: bool) -> tuple[list[int], int, int]:
    """(shard shape, padding rows, shard dim) of a local tensor FSDP-sharded over ``degree`` ranks; an expert weight
    on its own FSDP group (``fsdp+ep``) with fewer rows than ranks is split on dim 1 when that divides evenly."""
    shard = list(local)
    if degree <= 1:
        return shard, 0, 0
    if own_group and local[0] < degree and len(local) > 1 and local[1] % degree == 0:
        shard[1] = local[1] // degree
        return shard, 0, 1
    rows = -(-local[0] // degree)
    shard[0] = rows
    return shard, rows * degree - local[0], 0


def init_full_params(cfg: ModelConfig, *, seed: int = 0, std: float = 0.02) -> dict[str, torch.Tensor]:
    """Deterministic unsharded fp32 parameters for real runs: norms are ones, everything else N(0, std)."""
    gen = torch.Generator().manual_seed(seed)
    plan = ParallelPlan(parallel="none", world_size=1, mesh=(("dp", 1),))
    out = {}
    for p in param_layout(cfg, plan):
        if p.key.endswith("norm"):
            out[p.name] = torch.ones(p.full_shape)
        else:
            out[p.name] = torch.randn(p.full_shape, generator=gen) * std
    return out


def shard_for_rank(p: ParamInfo, full: torch.Tensor, plan: ParallelPlan, rank: int) -> torch.Tensor:
    """The slice of an unsharded parameter that ``rank`` stores under ``plan`` (a new contiguous tensor)."""
    if tuple(full.shape) != p.full_shape:
        raise ValueError(f"parameter {p.name}: got shape {tuple(full.shape)}, expected {p.full_shape}")
    coords = plan.coords(rank)
    t = full
    if p.vocab_pad_rows:
        t = torch.cat([t, t.new_zeros(p.vocab_pad_rows, *t.shape[1:])])
    if p.tp_dim is not None and plan.tp > 1:
        t = t.chunk(plan.tp, dim=p.tp_dim)[coords["tp"]]
    if p.expert and plan.ep > 1:
        t = t.chunk(plan.ep, dim=0)[coords["ep"]]
    if plan.fsdp_degree(p.expert) > 1:
        if p.fsdp_pad_rows:
            t = torch.cat([t, t.new_zeros(p.fsdp_pad_rows, *t.shape[1:])])
        d, index = p.fsdp_shard_dim, plan.fsdp_index(rank, p.expert)
        rows = p.shard_shape[d]
        t = t.narrow(d, index * rows, rows)
    return t.contiguous().clone()

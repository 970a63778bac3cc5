"""The zoo's models in plain torch: a Llama-style decoder and its Mixtral-style mixture-of-experts variant.

Hidden states are ``[tokens, dim]`` (batch and sequence flattened; with sequence parallelism each TP rank holds a
contiguous ``1/tp`` of the tokens). Weights are ``[out, in]`` like ``nn.Linear``. Parameters arrive per unit from a
:class:`~commsched.workloads.sources.ParamSource`; collectives come from a
:class:`~commsched.workloads.collectives.Comm`, so the same functions run unsharded, under any plan, on fake or real
tensors. A block's linears go through :func:`~commsched.workloads.float8.linear`: ``F.linear``, or a float8 matmul
where the source hands a :class:`~commsched.workloads.float8.Float8Weight` (``float8`` training); under tensor
parallelism with a recipe that runs torchao's float8 TP styles (tensorwise), a region's input enters through
:func:`~commsched.workloads.float8.enter_tp` and its row-parallel linear is
:func:`~commsched.workloads.float8.row_parallel_linear` (:func:`enter_region`, :func:`row_linear`).
"""

from __future__ import annotations

import dataclasses
import math

import torch
import torch.nn.functional as F

from commsched.workloads.collectives import Comm, all_gather, vocab_parallel_cross_entropy
from commsched.workloads.context_parallel import ring_attention
from commsched.workloads.float8 import Float8Input, Float8Weight, enter_tp, row_parallel_linear
from commsched.workloads.float8 import linear as any_linear
from commsched.workloads.presets import ModelConfig
from commsched.workloads.tags import FLOAT8, float8_linear, tagged


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class Shapes:
    """Per-rank shapes of one step."""

    batch: int  # sequences this rank (its TP group) processes
    seq: int  # new tokens per sequence on this rank (1 for decode; seq_len / cp under context parallelism)
    past: int = 0  # cached positions before the new tokens (decode)
    heads: int  # query heads on this rank
    kv_heads: int  # key/value heads on this rank
    vocab_start: int = 0  # first vocabulary row of this rank's embedding / output shard
    attention: str = "flash"  # "flash": aten._scaled_dot_product_flash_attention (CUDA op, meta kernel); "sdpa"
    capacity: int = 0  # MoE: token slots per expert

    @property
    def tokens(self) -> int:
        return self.batch * self.seq


def rms_norm(x: torch.Tensor, w: torch.Tensor, eps: float) -> torch.Tensor:
    xf = x.float()
    return (xf * torch.rsqrt(xf.pow(2).mean(-1, keepdim=True) + eps)).type_as(x) * w


def rope_tables(cfg: ModelConfig, positions: torch.Tensor, dtype: torch.dtype) -> tuple[torch.Tensor, torch.Tensor]:
    """cos / sin tables ``[len(positions), 1, head_dim]`` (a model buffer, like torchtitan's freqs_cis)."""
    half = cfg.head_dim // 2
    inv = 1.0 / (cfg.rope_theta ** (torch.arange(half, dtype=torch.float32) / half))
    ang = positions.float()[:, None] * inv[None, :]
    ang = torch.cat([ang, ang], dim=-1)[:, None, :]
    return ang.cos().to(dtype), ang.sin().to(dtype)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate ``x [batch, seq, heads, head_dim]`` by position (the rotate-half formulation)."""
    half = x.shape[-1] // 2
    rotated = torch.cat([-x[..., half:], x[..., :half]], dim=-1)
    return x * cos + rotated * sin


def attend(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, impl: str) -> torch.Tensor:
    """``[batch, heads, seq, head_dim]`` attention with grouped KV heads, as flash attention computes it. A causal
    mask is aligned bottom-right, as flash attention aligns it (Dao-AILab/flash-attention#1778): with fewer queries
    than keys (a prompt's later chunk), query ``i`` sees keys ``0 .. kv_len - q_len + i``."""
    if impl == "flash":
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)[0]
    mask = None
    q_len, kv_len = q.shape[2], k.shape[2]
    if causal and q_len != kv_len:  # SDPA's is_causal aligns top-left: say bottom-right with a mask
        mask = torch.ones(q_len, kv_len, dtype=torch.bool, device=q.device).tril(kv_len - q_len)
        causal = False
    return F.scaled_dot_product_attention(
        q, k, v, attn_mask=mask, is_causal=causal, enable_gqa=q.shape[1] != k.shape[1]
    )


def _float8_tp(comm: Comm | None, *weights: object) -> bool:
    """Whether linears of ``weights`` run torchao's float8 TP styles: under TP, every one a float8 linear whose
    recipe has them (torchtitan's ``enable_float8_tensorwise_tp``)."""
    return (comm is not None and comm.tp is not None
            and all(isinstance(w, Float8Weight) and w.recipe.float8_tp for w in weights))  # fmt: skip


def enter_region(comm: Comm, x: torch.Tensor, *weights: object) -> torch.Tensor | Float8Input:
    """Enter a column-parallel region whose linears take ``x`` with ``weights``: ``comm.tp_in`` (high
    precision), or ``PrepareFloat8ModuleInput`` (cast once, gathered in float8) under float8 TP."""
    if _float8_tp(comm, *weights):
        with tagged(FLOAT8):  # the cast and its amax (info's float8 share)
            return enter_tp(x, weights[0].recipe, comm.tp, comm.sp)
    return comm.tp_in(x)


def row_linear(comm: Comm | None, x: torch.Tensor, w: object) -> torch.Tensor:
    """A row-parallel linear and the collective that leaves its region: ``comm.tp_out(linear(x, w))``, or
    ``Float8RowwiseParallel`` under float8 TP (the collective inside: its backward gathers in float8)."""
    if _float8_tp(comm, w):
        return float8_linear(lambda x, w: row_parallel_linear(x, w, comm.tp, comm.sp), x, w)
    out = linear(x, w)
    return out if comm is None else comm.tp_out(out)


def attention(
    p: dict[str, torch.Tensor],
    x: torch.Tensor | Float8Input,
    cfg: ModelConfig,
    s: Shapes,
    rope: tuple[torch.Tensor, torch.Tensor],
    cache: tuple[torch.Tensor, torch.Tensor] | None,
    prefix: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
    comm: Comm | None = None,
) -> torch.Tensor:
    """Self-attention of the (TP-local) heads. ``cache``: this layer's ``[batch, kv_heads, kv_len, head_dim]``
    key/value buffers, written in place at positions ``past .. past + seq``. ``prefix`` (training a sequence in
    chunks): this layer's keys and values of the sequence's earlier chunks, attended to and appended to. Under
    context parallelism (``comm.cp``) the tokens are this rank's head-tail slice and the attention is torch's ring
    (:func:`commsched.workloads.context_parallel.ring_attention`). Returns the output projection after the
    collective that leaves the TP region (:func:`row_linear`)."""
    hd = cfg.head_dim
    q = linear(x, p["wq"]).view(s.batch, s.seq, s.heads, hd)
    k = linear(x, p["wk"]).view(s.batch, s.seq, s.kv_heads, hd)
    v = linear(x, p["wv"]).view(s.batch, s.seq, s.kv_heads, hd)
    q, k = apply_rope(q, *rope), apply_rope(k, *rope)
    q, k, v = q.transpose(1, 2), k.transpose(1, 2), v.transpose(1, 2)
    if cache is not None:
        end = s.past + s.seq
        cache[0][:, :, s.past : end].copy_(k)
        cache[1][:, :, s.past : end].copy_(v)
        k, v = cache[0][:, :, :end], cache[1][:, :, :end]
    if prefix is not None:
        prefix.append((k, v))
        if len(prefix) > 1:
            k, v = torch.cat([kv[0] for kv in prefix], dim=2), torch.cat([kv[1] for kv in prefix], dim=2)
    if comm is not None and comm.cp is not None:
        o = ring_attention(q, k, v, comm.cp, comm.cp_rotate, s.attention)
    else:  # a single new token attends to every cached position; a prompt attends causally
        o = attend(q, k, v, causal=s.seq > 1, impl=s.attention)
    return row_linear(comm, o.transpose(1, 2).reshape(s.tokens, s.heads * hd), p["wo"])


Weight = torch.Tensor | Float8Weight
"""a linear's weight as a parameter source hands it: a tensor, or a float8 linear's (commsched.workloads.float8)"""


def linear(x: torch.Tensor | Float8Input, w: Weight) -> torch.Tensor:
    """:func:`commsched.workloads.float8.linear`; a float8 one's kernels tagged ``float8`` in a traced step."""
    if isinstance(w, Float8Weight):
        return float8_linear(any_linear, x, w)
    return any_linear(x, w)


def swiglu(x: torch.Tensor | Float8Input, w1: Weight, w3: Weight, w2: Weight, comm: Comm | None = None) -> torch.Tensor:
    """The dense feed-forward, after the collective that leaves the TP region (:func:`row_linear`)."""
    return row_linear(comm, F.silu(linear(x, w1)) * linear(x, w3), w2)


def moe(p: dict[str, torch.Tensor], x: torch.Tensor, cfg: ModelConfig, s: Shapes, comm: Comm) -> torch.Tensor:
    """Top-k mixture of SwiGLU experts with a fixed capacity per expert (tokens past it are dropped), so every
    shape is static. Under expert parallelism the slot buffer goes to the experts' ranks by all_to_all and back."""
    tokens, dim = x.shape
    n_exp, k, cap = cfg.n_experts, cfg.top_k, s.capacity
    probs = F.linear(x, p["gate"]).float().softmax(dim=-1)
    top_p, top_e = probs.topk(k, dim=-1)
    top_p = (top_p / top_p.sum(dim=-1, keepdim=True)).to(x.dtype)
    expert = top_e.reshape(-1)  # [tokens * k], token-major
    onehot = (expert[:, None] == torch.arange(n_exp, device=x.device)[None, :]).to(torch.int32)
    position = (onehot.cumsum(dim=0) * onehot).sum(dim=-1) - 1  # arrival order within the expert
    slot = torch.where(position < cap, expert * cap + position, n_exp * cap)  # dropped tokens go to a spare row
    routed = x.unsqueeze(1).expand(tokens, k, dim).reshape(tokens * k, dim)
    buf = x.new_zeros(n_exp * cap + 1, dim).index_copy(0, slot, routed)[: n_exp * cap]
    ep = comm.ep.size if comm.ep is not None else 1
    local = n_exp // ep
    if ep > 1:
        # rows are grouped by expert, experts by owning rank: chunk r of the buffer goes to rank r
        buf = comm.all_to_all(buf).view(ep, local, cap, dim).transpose(0, 1).reshape(local, ep * cap, dim)
    else:
        buf = buf.view(local, cap, dim)
    h = F.silu(torch.bmm(buf, p["w1"].transpose(1, 2))) * torch.bmm(buf, p["w3"].transpose(1, 2))
    out = torch.bmm(h, p["w2"].transpose(1, 2))
    if ep > 1:
        out = comm.all_to_all(out.view(local, ep, cap, dim).transpose(0, 1).reshape(n_exp * cap, dim))
    else:
        out = out.reshape(n_exp * cap, dim)
    out = torch.cat([out, out.new_zeros(1, dim)])[slot]
    return (out.view(tokens, k, dim) * top_p.unsqueeze(-1)).sum(dim=1)


def block(
    p: dict[str, torch.Tensor],
    h: torch.Tensor,
    cfg: ModelConfig,
    s: Shapes,
    comm: Comm,
    rope: tuple[torch.Tensor, torch.Tensor],
    cache: tuple[torch.Tensor, torch.Tensor] | None,
    prefix: list[tuple[torch.Tensor, torch.Tensor]] | None = None,
) -> torch.Tensor:
    x = enter_region(comm, rms_norm(h, p["attention_norm"], cfg.norm_eps), p["wq"], p["wk"], p["wv"])
    h = h + attention(p, x, cfg, s, rope, cache, prefix, comm)
    x = rms_norm(h, p["ffn_norm"], cfg.norm_eps)
    if cfg.is_moe:  # the router and the experts stay in high precision (torchtitan converts neither)
        return h + comm.tp_out(moe(p, comm.tp_in(x), cfg, s, comm))
    return h + swiglu(enter_region(comm, x, p["w1"], p["w3"]), p["w1"], p["w3"], p["w2"], comm)


def embed(p: dict[str, torch.Tensor], tokens: torch.Tensor, s: Shapes, comm: Comm) -> torch.Tensor:
    """Vocabulary-parallel embedding (Megatron): look up the local rows, zero the others, sum over TP ranks."""
    ids = tokens.reshape(-1)
    w = p["tok_embeddings"]
    if comm.tp is None:
        return F.embedding(ids, w)
    local = ids - s.vocab_start
    outside = (local < 0) | (local >= w.shape[0])
    h = F.embedding(local.masked_fill(outside, 0), w).masked_fill(outside.unsqueeze(-1), 0.0)
    return comm.tp_out(h)


def head_loss(
    p: dict[str, torch.Tensor], h: torch.Tensor, labels: torch.Tensor, cfg: ModelConfig, s: Shapes, comm: Comm
) -> torch.Tensor:
    """Final norm, output projection and mean cross-entropy (vocabulary-parallel under TP), in fp32."""
    x = comm.tp_in(rms_norm(h, p["norm"], cfg.norm_eps))
    logits = F.linear(x, p["output"]).float()
    if comm.tp is None:
        return F.cross_entropy(logits, labels.reshape(-1))
    return vocab_parallel_cross_entropy(logits, labels.reshape(-1), comm.tp, s.vocab_start, cfg.vocab_size)


def head_logits(p: dict[str, torch.Tensor], h: torch.Tensor, cfg: ModelConfig, s: Shapes, comm: Comm) -> torch.Tensor:
    """Logits of each sequence's last position (what sampling needs); under TP gathered from the vocabulary shards
    as ``[tp * batch, vocab / tp]`` (rank-major)."""
    x = comm.gather_seq(rms_norm(h, p["norm"], cfg.norm_eps))
    last = x.view(s.batch, s.seq, -1)[:, -1]
    logits = F.linear(last, p["output"])
    return logits if comm.tp is None else all_gather(logits, comm.tp)


def moe_capacity(tokens: int, cfg: ModelConfig, capacity_factor: float) -> int:
    """Token slots per expert: ``ceil(capacity_factor * tokens * top_k / n_experts)``."""
    return max(1, math.ceil(capacity_factor * tokens * cfg.top_k / cfg.n_experts))

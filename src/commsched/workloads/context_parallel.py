"""Context parallelism (CP) as torch's ``context_parallel`` runs causal SDPA: ring attention over the CP group.

Everything here follows torch 2.13's ``torch/distributed/tensor/experimental/_context_parallel/_attention.py``
(``_templated_ring_attention``, ``_templated_ring_attention_backward``, ``_AllGatherRotater``, ``_AllToAllRotater``,
``_SDPAMerger``) and ``_load_balancer.py`` (``_HeadTailLoadBalancer``), as torchtitan applies them
(``torchtitan/distributed/context_parallel.py`` at 4a950ea: ``apply_cp_to_attention_module`` routes each attention
module's SDPA to the ring, ``prepare_context_parallel_input`` shards tokens, labels and positions head-tail):

* **sharding** (:func:`head_tail_positions`): the sequence is cut into ``2 cp`` chunks and CP rank ``r`` holds chunks
  ``r`` and ``2 cp - 1 - r`` (torch's default load balancer for causal attention, ``_create_default_load_balancer``,
  which sets ``_cp_options.enable_load_balance``), so every rank does the same causal work;
* **forward** (:class:`_RingAttention`): ``cp`` attention blocks of the local queries against each rank's K/V, in the
  ring's order (step ``i`` uses the K/V of CP rank ``r - i``): step 0 causal on the local chunks, a step from a lower
  rank non-causal against that rank's head chunk, one from a higher rank non-causal for the local tail chunk only;
  the blocks' outputs merged by their log-sum-exp (``_SDPAMerger``, in float32). K and V travel as one flat buffer
  (``cat([k.flatten(), v.flatten()])``): ``"allgather"`` gathers it once before the first block
  (``ft_c.all_gather_single``: ``_c10d_functional.all_gather_into_tensor``) and waits before the second;
  ``"alltoall"`` passes it to the next rank before each block but the last (``ft_c.permute_tensor``:
  ``_c10d_functional.all_to_all_single`` with one non-empty split each way), waited for at the next block;
* **backward**: the same ring of K/V (one more all_gather, or ``cp - 1`` permutes), and the float32 dK/dV buffer
  accumulated as it travels with its K/V: always a permute (torch's backward builds its dK/dV rotater with
  ``_RotateMethod.ALL_TO_ALL``), ``cp`` of them: one after each block, the last waited for at the end.

Each wait sits where torch's eager code first uses the buffer (``next_buffer``), so the blocks in between overlap the
transfer. The block kernel is ``aten._scaled_dot_product_flash_attention`` (``"flash"``) or, for real CPU runs,
``aten._scaled_dot_product_flash_attention_for_cpu`` (``"sdpa"``); both take grouped K/V heads, which is what
torchtitan's llama3 passes (``enable_gqa``), so the ring carries ``n_kv_heads`` heads.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from torch.autograd import Function

from commsched.workloads.chunk_item import chunk_item
from commsched.workloads.collectives import Group

c10d = torch.ops._c10d_functional
aten = torch.ops.aten

ROTATE_METHODS = ("allgather", "alltoall")
"""torch's ``set_rotate_method`` names; torchtitan's ``context_parallel_rotate_method`` defaults to ``"allgather"``"""


def head_tail_positions(seq: int, cp: int, rank: int) -> torch.Tensor:
    """Positions CP rank ``rank`` holds of a ``seq``-long sequence: chunks ``rank`` and ``2 cp - 1 - rank`` of
    ``2 cp`` (``_HeadTailLoadBalancer._generate_indices``). ``seq`` must divide by ``2 cp``."""
    if cp < 1 or seq % (2 * cp) or not 0 <= rank < cp:
        raise ValueError(f"head-tail sharding of {seq} positions over cp={cp} (rank {rank}): seq must divide by 2 cp")
    k = seq // (2 * cp)
    tail = 2 * cp - 1 - rank
    return torch.cat([torch.arange(rank * k, (rank + 1) * k), torch.arange(tail * k, (tail + 1) * k)])


class _Rotater:
    """K/V (or dK/dV) buffers passed around the CP ring: ``exchange`` issues the collective, ``next`` waits for it
    and returns the buffer of the rank ``i`` steps back (``_AllGatherRotater`` / ``_AllToAllRotater``)."""

    def __init__(self, group: Group, method: str) -> None:
        self.group, self.method = group, method
        self.buffer: torch.Tensor | None = None
        self.waited = False
        self.steps = 0

    def exchange(self, buf: torch.Tensor) -> None:
        g = self.group
        if self.method == "allgather":
            self.steps += 1
            if self.buffer is None:  # gathered once, on the first exchange
                self.buffer = c10d.all_gather_into_tensor(buf.contiguous(), g.size, g.name)
            return
        # permute_tensor(buf, [1, 2, ..., size - 1, 0]): send to the next rank, receive from the previous one
        n = buf.numel()
        send, recv = [0] * g.size, [0] * g.size
        send[(g.rank + 1) % g.size], recv[(g.rank - 1) % g.size] = n, n
        self.buffer = c10d.all_to_all_single(buf.contiguous(), recv, send, g.name)
        self.waited = False

    def next(self) -> torch.Tensor:
        assert self.buffer is not None
        if not self.waited:
            self.buffer, self.waited = c10d.wait_tensor(self.buffer), self.method == "allgather"
        if self.method == "allgather":
            return chunk_item(self.buffer, self.group.size, self.group.rank - self.steps)
        return self.buffer


def _block(q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool, impl: str) -> tuple:
    """One attention block: (output, logsumexp, the op's outputs the backward takes)."""
    if impl == "flash":
        r = aten._scaled_dot_product_flash_attention(q, k, v, 0.0, causal)
        return r[0], r[1], (r[2], r[3], r[6], r[7])
    out, lse = aten._scaled_dot_product_flash_attention_for_cpu(q, k, v, 0.0, causal)
    return out, lse, ()


def _block_backward(dout, q, k, v, out, lse, causal: bool, impl: str, rest: tuple) -> tuple:
    if impl == "flash":
        cum_q, cum_k, seed, offset = rest
        return aten._scaled_dot_product_flash_attention_backward(
            dout, q, k, v, out, lse, cum_q, cum_k, q.shape[2], k.shape[2], 0.0, causal, seed, offset
        )
    return aten._scaled_dot_product_flash_attention_for_cpu_backward(dout, q, k, v, out, lse, 0.0, causal)


def _unpack(buf: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
    return buf[: k.numel()].reshape(k.shape), buf[k.numel() :].reshape(v.shape)


def _half(x: torch.Tensor, which: int) -> torch.Tensor:
    """The head (0) or tail (1) chunk of a rank's load-balanced sequence (dim 2)."""
    return chunk_item(x, 2, which, dim=2)


def _step_operands(i: int, rank: int, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor) -> tuple:
    """(q, k, v, causal, partial) of ring step ``i`` under head-tail load balancing (``_templated_ring_attention``'s
    ``if / elif / else``): the local block causal; a lower rank's head chunk for every query; every key of a higher
    rank for the tail chunk's queries only (``partial``)."""
    if i == 0:
        return q, k, v, True, False
    if i <= rank:
        return q, _half(k, 0), _half(v, 0), False, False
    return _half(q, 1), k, v, False, True


def _merge(acc: tuple | None, out: torch.Tensor, lse: torch.Tensor, partial: bool) -> tuple:
    """``_SDPAMerger._merge_one`` (``convert_to_f32``): fold a block's float32 output and log-sum-exp into the running
    ones, on the tail half of the sequence only when ``partial``."""
    out, lse = out.float(), lse.float().unsqueeze(-1)
    if acc is None:
        return out, lse
    acc_out, acc_lse = acc
    old_out, old_lse = (_half(acc_out, 1), _half(acc_lse, 1)) if partial else (acc_out, acc_lse)
    new_out = old_out - F.sigmoid(lse - old_lse) * (old_out - out)
    new_lse = old_lse - F.logsigmoid(old_lse - lse)
    if partial:
        return torch.cat([_half(acc_out, 0), new_out], dim=2), torch.cat([_half(acc_lse, 0), new_lse], dim=2)
    return new_out, new_lse


class _RingAttention(Function):
    """Causal attention of a CP rank's head-tail sequence slice against the whole sequence (see the module doc)."""

    @staticmethod
    def forward(ctx, query, key, value, group: Group, method: str, impl: str):
        rank, size = group.rank, group.size
        key, value = key.contiguous(), value.contiguous()
        k, v = key, value
        rotater = _Rotater(group, method)
        acc, rests = None, []
        for i in range(size):
            if i > 0:
                k, v = _unpack(rotater.next(), key, value)
            if i < size - 1:
                rotater.exchange(torch.cat([k.flatten(), v.flatten()]))
            q_, k_, v_, causal, partial = _step_operands(i, rank, query, k, v)
            out, lse, rest = _block(q_, k_, v_, causal, impl)
            rests.append(rest)
            acc = _merge(acc, out, lse, partial)
        assert acc is not None
        out, lse = acc[0].to(query.dtype), acc[1].squeeze(-1)
        ctx.group, ctx.method, ctx.impl, ctx.rest = group, method, impl, rests
        ctx.save_for_backward(query, key, value, out, lse)
        return out

    @staticmethod
    def backward(ctx, grad_out):
        query, key, value, out, lse = ctx.saved_tensors
        group, impl = ctx.group, ctx.impl
        rank, size = group.rank, group.size
        kv_rotater, dkv_rotater = _Rotater(group, ctx.method), _Rotater(group, "alltoall")
        grad_out = grad_out.contiguous()
        grad_q = grad_k = grad_v = None
        k, v = key, value
        for i in range(size):
            if i > 0:
                k, v = _unpack(kv_rotater.next(), key, value)
            if i != size - 1:
                kv_rotater.exchange(torch.cat([k.flatten(), v.flatten()]))
            q_, k_, v_, causal, partial = _step_operands(i, rank, query, k, v)
            if partial:
                out_, dout, lse_ = _half(out, 1), _half(grad_out, 1), _half(lse, 1).contiguous()
            else:
                out_, dout, lse_ = out, grad_out, lse
            dq, dk, dv = _block_backward(dout, q_, k_, v_, out_, lse_, causal, impl, ctx.rest[i])
            if i == 0:
                grad_k, grad_v = dk.float(), dv.float()
            else:
                grad_k, grad_v = _unpack(dkv_rotater.next(), key, value)
                if i <= rank:  # the block used the head chunk of the travelling K/V
                    grad_k = torch.cat([_half(grad_k, 0) + dk, _half(grad_k, 1)], dim=2)
                    grad_v = torch.cat([_half(grad_v, 0) + dv, _half(grad_v, 1)], dim=2)
                else:
                    grad_k, grad_v = grad_k + dk, grad_v + dv
            dkv_rotater.exchange(torch.cat([grad_k.flatten(), grad_v.flatten()]))
            if i == 0 or not partial:
                grad_q = dq.float() if grad_q is None else grad_q + dq
            else:
                assert grad_q is not None
                grad_q = torch.cat([_half(grad_q, 0), _half(grad_q, 1) + dq], dim=2)
        assert grad_q is not None
        grad_k, grad_v = _unpack(dkv_rotater.next().to(key.dtype), key, value)
        return grad_q.to(query.dtype), grad_k, grad_v, None, None, None


def parse_rotate(method: str) -> str:
    """``method`` if it is one of torch's K/V rotate methods (:data:`ROTATE_METHODS`), else a one-line ValueError."""
    if method not in ROTATE_METHODS:
        raise ValueError(f"cp rotate method {method!r}: expected one of {', '.join(ROTATE_METHODS)}")
    return method


def ring_attention(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, group: Group, method: str = "allgather", impl: str = "flash"
) -> torch.Tensor:
    """Causal attention ``[batch, heads, local seq, head_dim]`` of this CP rank's head-tail slice (queries, keys and
    values at :func:`head_tail_positions`) against the whole sequence, K/V rotated by ``method``
    (``"allgather"`` | ``"alltoall"``) as torch's ring attention rotates them."""
    parse_rotate(method)
    if q.shape[2] % 2:
        raise ValueError(f"ring attention with head-tail sharding needs an even local sequence, got {q.shape[2]}")
    return _RingAttention.apply(q, k, v, group, method, impl)

"""Prefill and decode graphs (forward with a KV cache) for tp, tp+sp and ep at world sizes 8 and 1024."""

from __future__ import annotations

import pytest
from zoo_helpers import BF16, check_ir, colls, traced

from commsched.ir import CollType, OpKind

AG, RS, AR, A2A = CollType.ALL_GATHER, CollType.REDUCE_SCATTER, CollType.ALL_REDUCE, CollType.ALL_TO_ALL
LAYERS = 2
SEQ = 1024


def _tokens(mode: str, batch: int) -> int:
    return batch * (1 if mode == "decode" else SEQ)


def _check_cache_writes(w) -> None:
    """Every layer's K and V cache inputs are written in place (a copy into the cache's storage)."""
    g = w.graph
    cache_inputs = [i for i, n in enumerate(g.names) if n.startswith("cache_")]
    assert len(cache_inputs) == 2 * LAYERS
    written = set()
    for i in range(len(g)):
        if g.targets[i] == "aten.copy_.default" and g.kinds[i] == OpKind.OTHER:
            written.add(int(g.buf_storage[g.buf_ptr[i]]))
    assert {int(g.buf_storage[g.buf_ptr[c]]) for c in cache_inputs} <= written
    kv = next(p for p in g.buffers(cache_inputs[0]))
    spec = w.spec
    assert kv.shape == (spec.batch, spec.model.n_kv_heads // spec.plan.tp, spec.kv_len, spec.model.head_dim)


@pytest.mark.parametrize("world", [8, 1024])
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_tp_inference(mode, world):
    w = traced("llama3-8b", "tp", world, LAYERS, mode=mode, seq_len=SEQ, tp_size=8)
    check_ir(w)
    cfg, batch = w.spec.model, w.spec.batch
    ar = colls(w, AR, "tp")
    assert len(ar) == 2 * LAYERS + 1  # embedding + attention and MLP outputs, no backward
    assert {int(w.graph.coll_in_bytes[c]) for c in ar} == {_tokens(mode, batch) * cfg.dim * BF16}
    (logits,) = colls(w, AG, "tp")
    assert w.graph.coll_out_bytes[logits] == batch * cfg.vocab_size * BF16  # last position, whole vocabulary
    assert len(w.graph.collectives) == len(ar) + 1  # replicas (world 1024) do not talk in inference
    assert w.meta["tokens_per_step"] == _tokens(mode, batch) * world // 8
    _check_cache_writes(w)


@pytest.mark.parametrize("world", [8, 1024])
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_tp_sp_inference(mode, world):
    w = traced("llama3-8b", "tp+sp", world, LAYERS, mode=mode, seq_len=SEQ, tp_size=8)
    check_ir(w)
    cfg, batch = w.spec.model, w.spec.batch
    act = _tokens(mode, batch) * cfg.dim * BF16
    ag, rs = colls(w, AG, "tp"), colls(w, RS, "tp")
    assert len(rs) == 2 * LAYERS + 1 and {int(w.graph.coll_in_bytes[c]) for c in rs} == {act}
    assert len(ag) == 2 * LAYERS + 2  # before each block half, before the output layer, and the logits
    assert sorted(int(w.graph.coll_out_bytes[c]) for c in ag) == sorted(
        [act] * (2 * LAYERS + 1) + [batch * cfg.vocab_size * BF16]
    )
    assert not colls(w, AR)
    _check_cache_writes(w)


@pytest.mark.parametrize("world", [8, 1024])
@pytest.mark.parametrize("mode", ["prefill", "decode"])
def test_ep_inference(mode, world):
    w = traced("mixtral-8x7b", "ep", world, LAYERS, mode=mode, seq_len=SEQ)
    check_ir(w)
    cfg = w.spec.model
    a2a = colls(w, A2A, "ep")
    assert len(a2a) == 2 * LAYERS  # dispatch and combine per MoE layer
    cap = -(-_tokens(mode, w.spec.batch) * cfg.top_k // cfg.n_experts)
    assert {int(w.graph.coll_in_bytes[c]) for c in a2a} == {cfg.n_experts * cap * cfg.dim * BF16}
    assert len(w.graph.collectives) == len(a2a)
    assert w.graph.flops.sum() > 0
    _check_cache_writes(w)


def test_decode_attends_the_whole_cache():
    w = traced("llama3-8b", "tp", 8, LAYERS, mode="decode", seq_len=SEQ, kv_len=2 * SEQ)
    g = w.graph
    attn = [i for i, t in enumerate(g.targets) if "flash_attention" in t]
    assert len(attn) == LAYERS
    q, k = (g.buffers(int(j))[0] for j in g.inputs(attn[0])[:2])
    assert q.shape[2] == 1 and k.shape[2] == SEQ  # one new token against seq_len cached positions
    assert w.meta["kv_len"] == 2 * SEQ

"""Training graphs of every parallelism at world sizes 8 and 1024: collective counts, groups and byte sizes
follow from the model's shapes; flops of one layer match 6 x params x tokens."""

from __future__ import annotations

import numpy as np
import pytest
from zoo_helpers import BF16, FP32, check_ir, colls, loss_node, numel, traced

from commsched.ir import CollType
from commsched.workloads.collectives import ddp_buckets
from commsched.workloads.program import DDP_BUCKET_CAP_BYTES, DDP_FIRST_BUCKET_BYTES

AG, RS, AR, A2A = CollType.ALL_GATHER, CollType.REDUCE_SCATTER, CollType.ALL_REDUCE, CollType.ALL_TO_ALL
LAYERS = 2


def _in_bytes(w, ids):
    return [int(w.graph.coll_in_bytes[c]) for c in ids]


def _out_bytes(w, ids):
    return [int(w.graph.coll_out_bytes[c]) for c in ids]


def _size_stride(w, c):
    pg = w.graph.groups[w.graph.coll_group[c]]
    return pg.size, pg.stride


def _check_fsdp(w, fsdp: int, role: str = "fsdp") -> None:
    """FSDP2: each parameter all-gathered in forward (bf16), again in backward unless in the final unit, and its
    gradient reduce-scattered (fp32) once; shards padded on dim 0 to a multiple of the FSDP degree."""
    g, layout = w.graph, w.spec.layout
    loss = loss_node(g)
    ag, rs = colls(w, AG, role), colls(w, RS, role)
    fwd, bwd = [c for c in ag if c < loss], [c for c in ag if c > loss]
    reshard = [p for p in layout if p.unit != "final"]
    assert len(fwd) == len(layout) and len(bwd) == len(reshard) and len(rs) == len(layout)
    assert all(c > loss for c in rs)
    assert sorted(_in_bytes(w, fwd)) == sorted(numel(p.shard_shape) * BF16 for p in layout)
    assert sorted(_in_bytes(w, bwd)) == sorted(numel(p.shard_shape) * BF16 for p in reshard)
    assert _out_bytes(w, ag) == [fsdp * b for b in _in_bytes(w, ag)]
    assert sorted(_in_bytes(w, rs)) == sorted(fsdp * numel(p.shard_shape) * FP32 for p in layout)
    assert _out_bytes(w, rs) == [b // fsdp for b in _in_bytes(w, rs)]
    for p in layout:
        assert p.shard_shape[0] * fsdp - p.local_shape[0] == p.fsdp_pad_rows < fsdp
    # reshard after forward: nothing after the loss reads a forward-gathered parameter of a resharded unit
    ptr, idx = g.storage_users
    final_params = sum(1 for p in layout if p.unit == "final")
    readers_after = []
    for c in fwd:
        s = int(g.buf_storage[g.buf_ptr[c]])
        readers_after.append(int((idx[ptr[s] : ptr[s + 1]] > loss).sum()))
    assert sum(r > 0 for r in readers_after) == final_params


def _ddp_bucket_bytes(w, group: str) -> list[int]:
    sizes = {p.name: numel(p.shard_shape) * FP32 for p in w.spec.layout}
    return [sum(sizes[n] for n in bucket) for bucket in w.meta["ddp_buckets"][group]]


def _check_ddp(w, group: str, members) -> None:
    """DDP: buckets over parameters in gradient-ready order, 1 MiB then 25 MiB, one fp32 all_reduce each,
    launched during the backward."""
    buckets = w.meta["ddp_buckets"][group]
    names = [p.name for p in reversed(w.spec.layout) if members(p)]
    assert [n for b in buckets for n in b] == names
    sizes = {p.name: numel(p.shard_shape) * FP32 for p in w.spec.layout}
    for k, b in enumerate(buckets[:-1]):
        cap = DDP_FIRST_BUCKET_BYTES if k == 0 else DDP_BUCKET_CAP_BYTES
        total = sum(sizes[n] for n in b)
        assert total >= cap and total - sizes[b[-1]] < cap  # closed by the tensor that filled it
    ar = colls(w, AR, group)
    assert _in_bytes(w, ar) == _ddp_bucket_bytes(w, group)
    g = w.graph
    last_matmul = max(i for i, t in enumerate(g.targets) if t == "aten.mm.default")
    assert ar[0] < last_matmul  # the first bucket overlaps the rest of the backward


@pytest.mark.parametrize("world", [8, 1024])
def test_fsdp(world):
    w = traced("llama3-8b", "fsdp", world, LAYERS)
    check_ir(w)
    _check_fsdp(w, world)
    assert {(p.size, p.stride) for p in w.graph.groups} == {(world, 1)}
    emb = next(p for p in w.meta["padding"]["params"] if p["param"] == "tok_embeddings.weight") if world > 8 else None
    if world == 1024:  # 128256 rows over 1024 ranks: 126 rows each, 768 rows of padding (as FSDP2 pads)
        assert emb["fsdp_pad_rows"] == 126 * 1024 - 128256


def test_fsdp_block_buckets():
    w = traced("llama3-8b", "fsdp", 8, LAYERS, fsdp_bucket="block")
    check_ir(w)
    layout, loss = w.spec.layout, loss_node(w.graph)
    units = list(dict.fromkeys(p.unit for p in layout))
    unit_bytes = {u: sum(numel(p.shard_shape) for p in layout if p.unit == u) for u in units}
    ag, rs = colls(w, AG), colls(w, RS)
    assert _in_bytes(w, [c for c in ag if c < loss]) == [unit_bytes[u] * BF16 for u in units]
    assert sorted(_in_bytes(w, [c for c in ag if c > loss])) == sorted(
        unit_bytes[u] * BF16 for u in units if u != "final"
    )
    assert sorted(_in_bytes(w, rs)) == sorted(8 * unit_bytes[u] * FP32 for u in units)
    assert w.meta["fsdp_bucket"] == "block"


@pytest.mark.parametrize("world", [8, 1024])
def test_ddp(world):
    w = traced("llama3-8b", "ddp", world, LAYERS)
    check_ir(w)
    _check_ddp(w, "dp", lambda p: True)
    assert len(colls(w, AR)) == len(w.meta["ddp_buckets"]["dp"]) and len(w.graph.collectives) == len(colls(w, AR))
    assert {(p.size, p.stride) for p in w.graph.groups} == {(world, 1)}


def _tp_activation_bytes(w) -> int:
    return w.spec.new_tokens * w.spec.model.dim * BF16


@pytest.mark.parametrize("world", [8, 1024])
def test_tp(world):
    tp = 8
    w = traced("llama3-8b", "tp", world, LAYERS, tp_size=tp)
    check_ir(w)
    ar = colls(w, AR, "tp")
    # forward: embedding + two per block (g); backward: two per block + output layer (f); loss: max, target, sum
    act = [c for c in ar if w.graph.coll_in_bytes[c] == _tp_activation_bytes(w)]
    loss_ars = [c for c in ar if w.graph.coll_in_bytes[c] == w.spec.new_tokens * FP32]
    assert len(act) == 4 * LAYERS + 2 and len(loss_ars) == 3 and len(ar) == len(act) + 3
    assert [w.graph.coll_reduce_op[c] for c in loss_ars] == ["max", "sum", "sum"]
    assert {_size_stride(w, c) for c in ar} == {(tp, 1)}
    if world == 1024:  # 128 replicas of the TP group: DDP buckets over the outer dimension (stride 8)
        _check_ddp(w, "dp", lambda p: True)
        assert w.meta["groups"]["dp"] == {"name": w.meta["groups"]["dp"]["name"], "size": 128, "stride": 8}
    else:
        assert "ddp_buckets" not in w.meta and len(w.graph.collectives) == len(ar)
    wq = next(p for p in w.spec.layout if p.key == "wq")
    assert wq.local_shape == (4096 // tp, 4096)


@pytest.mark.parametrize("world", [8, 1024])
def test_tp_sp(world):
    tp = 8
    w = traced("llama3-8b", "tp+sp", world, LAYERS, tp_size=tp)
    check_ir(w)
    act = _tp_activation_bytes(w)
    ag, rs = colls(w, AG, "tp"), colls(w, RS, "tp")
    # two gathers + two scatters per block and one each around embedding / output, mirrored by the backward
    assert len(ag) == len(rs) == 2 * (2 * LAYERS + 1)
    assert set(_out_bytes(w, ag)) == {act} and set(_in_bytes(w, rs)) == {act}
    ar = colls(w, AR, "tp")
    norms = [p for p in w.spec.layout if p.sp_partial]
    assert len(norms) == 2 * LAYERS + 1
    assert sorted(_in_bytes(w, ar)) == sorted([w.spec.new_tokens * FP32] * 3 + [len(norms) * 4096 * FP32])


@pytest.mark.parametrize(("world", "tp"), [(8, 4), (1024, 8)])
def test_fsdp_tp_two_groups(world, tp):
    w = traced("llama3-8b", "fsdp+tp", world, LAYERS)
    check_ir(w)
    fsdp = world // tp
    assert w.meta["mesh"] == {"fsdp": fsdp, "tp": tp}
    strides = {(p.size, p.stride) for p in w.graph.groups}
    assert strides == {(tp, 1), (fsdp, tp)}  # TP inner (consecutive ranks), FSDP across TP groups
    _check_fsdp(w, fsdp)
    assert len(colls(w, AR, "tp")) == 4 * LAYERS + 5
    wq = next(p for p in w.spec.layout if p.key == "wq")
    assert wq.local_shape == (4096 // tp, 4096) and wq.shard_shape == (-(-4096 // tp // fsdp), 4096)


@pytest.mark.parametrize(("world", "edp"), [(8, 1), (1024, 128)])
def test_ep(world, edp):
    w = traced("mixtral-8x7b", "ep", world, LAYERS)
    check_ir(w)
    cfg, ep = w.spec.model, 8
    assert w.meta["mesh"] == {"edp": edp, "ep": ep}
    a2a = colls(w, A2A, "ep")
    assert len(a2a) == 4 * LAYERS  # dispatch + combine per MoE layer, in forward and again in backward
    loss = loss_node(w.graph)
    assert sum(c < loss for c in a2a) == 2 * LAYERS
    cap = -(-w.spec.new_tokens * cfg.top_k // cfg.n_experts)
    assert w.meta["moe"]["capacity_per_expert"] == cap
    assert set(_in_bytes(w, a2a)) == {cfg.n_experts * cap * cfg.dim * BF16}
    assert {_size_stride(w, c) for c in a2a} == {(ep, 1)}
    _check_ddp(w, "world", lambda p: not p.expert)
    if edp > 1:
        _check_ddp(w, "edp", lambda p: p.expert)
        assert w.meta["groups"]["edp"]["stride"] == ep
    else:
        assert "edp" not in w.meta["ddp_buckets"]
    w1 = next(p for p in w.spec.layout if p.key == "w1")
    assert w1.local_shape == (cfg.n_experts // ep, cfg.ffn_dim, cfg.dim)


@pytest.mark.parametrize(("world", "efsdp"), [(8, 1), (1024, 128)])
def test_fsdp_ep(world, efsdp):
    """torchtitan's MoE mesh: dense parameters FSDP over every rank, experts split over 8 EP ranks and FSDP over the
    other world / 8 (on dim 1: one expert a rank is fewer rows than FSDP ranks), tokens by all_to_all."""
    w = traced("mixtral-8x7b", "fsdp+ep", world, LAYERS)
    check_ir(w)
    assert w.meta["mesh"] == {"efsdp": efsdp, "ep": 8}
    layout, loss = w.spec.layout, loss_node(w.graph)
    dense, experts = [p for p in layout if not p.expert], [p for p in layout if p.expert]
    ag, rs = colls(w, AG, "world"), colls(w, RS, "world")
    assert len([c for c in ag if c < loss]) == len(dense) and len(rs) == len(dense)
    assert sorted(_in_bytes(w, rs)) == sorted(world * numel(p.shard_shape) * FP32 for p in dense)
    assert len(colls(w, A2A, "ep")) == 4 * LAYERS
    if efsdp == 1:  # one replica of each expert: nothing to gather or reduce
        assert "efsdp" not in w.meta["groups"] and all(p.shard_shape == p.local_shape for p in experts)
        return
    assert w.meta["groups"]["efsdp"] == {**w.meta["groups"]["efsdp"], "size": efsdp, "stride": 8}
    eag, ers = colls(w, AG, "efsdp"), colls(w, RS, "efsdp")
    assert len(eag) == 2 * len(experts) and len(ers) == len(experts)  # gathered again in backward
    assert sorted(_in_bytes(w, ers)) == sorted(efsdp * numel(p.shard_shape) * FP32 for p in experts)
    for p in experts:  # dim 1 split evenly: no padding (plain FSDP at 1024 pads the 8 experts to 1024 rows)
        assert p.fsdp_shard_dim == 1 and p.shard_shape[1] * efsdp == p.local_shape[1] and p.fsdp_pad_rows == 0
    assert not any("experts" in row["param"] for row in w.meta["padding"]["params"])


def _layer_flops(preset, parallel, mode, **kw):
    """Flops of one block (2 layers minus 1 layer), split into matmuls and attention."""
    ws = [traced(preset, parallel, 8, layers, mode=mode, **kw) for layers in (1, 2)]
    out = []
    for w in ws:
        g = w.graph
        mm = sum(float(g.flops[i]) for i in np.flatnonzero(g.flops) if g.targets[i] == "aten.mm.default")
        attn = sum(float(g.flops[i]) for i in np.flatnonzero(g.flops) if "flash_attention" in g.targets[i])
        out.append((float(g.flops.sum()), mm, attn))
    return [b - a for a, b in zip(out[0], out[1], strict=True)], ws[1]


def test_train_flops_of_one_layer():
    (total, mm, attn), w = _layer_flops("llama3-8b", "fsdp", "train", seq_len=512)
    cfg, tokens = w.spec.model, w.spec.new_tokens
    params = cfg.block_params()
    assert abs(total / (6 * params * tokens) - 1) < 0.05
    assert mm == 6 * (params - 2 * cfg.dim) * tokens  # every weight matmul: forward 2x, backward 4x
    s, b = w.spec.seq_len, w.spec.batch
    assert attn == 14 * b * s * s * cfg.n_heads * cfg.head_dim  # flash forward 4 b s^2 h d, backward 2.5x that


def test_prefill_flops_of_one_layer():
    (total, mm, attn), w = _layer_flops("llama3-8b", "tp", "prefill", seq_len=512)
    cfg, tokens, tp = w.spec.model, w.spec.new_tokens, w.spec.plan.tp
    params = cfg.block_params() / tp
    assert abs(total / (2 * params * tokens) - 1) < 0.05
    assert mm == 2 * (cfg.block_params() - 2 * cfg.dim) // tp * tokens
    assert attn == 4 * w.spec.batch * 512 * 512 * cfg.n_heads // tp * cfg.head_dim


def test_world_16384_and_ddp_bucket_rule():
    w = traced("llama3-8b", "fsdp", 16384, 1)
    check_ir(w)
    _check_fsdp(w, 16384)
    assert ddp_buckets([5, 5, 5], cap_bytes=10, first_cap_bytes=4) == [[0], [1, 2]]
    assert ddp_buckets([30, 1, 1], cap_bytes=10, first_cap_bytes=4) == [[0], [1, 2]]

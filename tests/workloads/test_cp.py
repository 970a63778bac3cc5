"""Context parallelism as torch's ``context_parallel`` runs it (commsched.workloads.context_parallel): on real gloo
ranks the CP step computes the loss and gradients of the model without CP; the traced graph holds the collectives
torch's ring attention issues per layer; each rank processes seq / cp tokens; bad requests fail in one line; and
``cp_size=1`` leaves every zoo graph as it was."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from zoo_helpers import BF16, FP32, check_ir, colls, loss_node, traced

from commsched.cost import estimate_costs
from commsched.ir import CAUSAL_META, PERMUTE_META, CollType
from commsched.workloads import build, resolve
from commsched.workloads.context_parallel import head_tail_positions
from commsched.workloads.real import expected_rank_outputs, reference_outputs, run_on_gloo

AG, A2A = CollType.ALL_GATHER, CollType.ALL_TO_ALL
SEQ, LAYERS = 64, 2


def test_head_tail_sharding_is_torchs():
    """_HeadTailLoadBalancer: rank r holds chunks r and 2 cp - 1 - r of 2 cp; together the ranks hold each position
    once."""
    assert head_tail_positions(8, 2, 0).tolist() == [0, 1, 6, 7]
    assert head_tail_positions(8, 2, 1).tolist() == [2, 3, 4, 5]
    assert sorted(torch.cat([head_tail_positions(16, 4, r) for r in range(4)]).tolist()) == list(range(16))


CASES = [
    dict(parallel="fsdp", cp_size=2),  # FSDP over dp_shard 2 x cp 2
    dict(parallel="ddp", cp_size=2),  # without FSDP: gradients all-reduced over the data dimension, CP ranks in it
    dict(parallel="fsdp+tp+sp", tp_size=2, cp_size=2),
    dict(parallel="fsdp", cp_size=4, cp_rotate="alltoall"),  # every branch of the ring: lower and higher ranks
    dict(parallel="fsdp", cp_size=4),
    dict(parallel="tp", tp_size=2, cp_size=2, mode="prefill"),
]


@pytest.mark.slow
def test_cp_step_computes_the_loss_and_gradients_without_cp_on_gloo():
    """Issue #38's acceptance: llama-tiny in fp32 on 4 gloo ranks; each CP group's mean loss is the unsharded
    replica's loss, each rank's loss that of its own tokens and every gradient shard the unsharded gradient's, to
    1e-5 (a prefill: CP rank 0's logits, the sequence's last position)."""
    specs = [resolve("llama-tiny", world_size=4, seq_len=16, batch=2, dtype="float32", attention="sdpa", **kw)
             for kw in CASES]  # fmt: skip
    for kw, spec, per_rank in zip(CASES, specs, run_on_gloo(specs, seed=3), strict=True):
        reference = reference_outputs(spec, seed=3)
        for rank, outputs in enumerate(per_rank):
            expected = expected_rank_outputs(spec, rank, reference)
            if spec.train:
                group = spec.plan.group_ranks("cp", rank)
                mean = sum(per_rank[r][0] for r in group) / len(group)
                replica = rank // (spec.plan.tp * spec.plan.cp)
                assert abs(mean.item() - reference["losses"][replica].item()) < 1e-5, (kw, rank)
                pairs = list(zip(outputs, expected, strict=True))  # its own tokens' loss, its gradient shards
            else:
                pairs = list(zip(outputs, expected, strict=True)) if spec.plan.coords(rank)["cp"] == 0 else []
            for got, want in pairs:
                err = (got - want).abs().max().item() / want.abs().max().item()
                assert err < 1e-5, f"{kw} rank {rank}: relative error {err:.2e}"


def _cp_workload(rotate: str, cp: int = 2, **kw):
    return traced("llama-tiny", "fsdp", 8, LAYERS, seq_len=SEQ, cp_size=cp, cp_rotate=rotate, **kw)


def _kv_bytes(w, cp: int, itemsize: int) -> int:
    """One rank's K and V as one flat buffer: 2 x batch x kv_heads x seq / cp x head_dim."""
    cfg = w.spec.model
    return 2 * w.spec.batch * cfg.n_kv_heads * (SEQ // cp) * cfg.head_dim * itemsize


@pytest.mark.parametrize("cp", [2, 4])
@pytest.mark.parametrize("rotate", ["allgather", "alltoall"])
def test_traced_cp_collectives_per_layer_are_torchs(rotate, cp):
    """Per layer, on the CP group: allgather, one all_gather of the stacked K/V in the forward and one in the
    backward; alltoall, cp - 1 permutes of it each way; and in the backward cp permutes of the float32 dK/dV
    (torch's backward always rotates dK/dV by all-to-all). Permutes are charged as point-to-point transfers."""
    w = _cp_workload(rotate, cp)
    check_ir(w)
    g, loss = w.graph, loss_node(w.graph)
    ag, a2a = colls(w, AG, "cp"), colls(w, A2A, "cp")
    kv, dkv = _kv_bytes(w, cp, BF16), _kv_bytes(w, cp, FP32)
    fwd_kv = [c for c in ag + a2a if c < loss]
    bwd = [c for c in ag + a2a if c > loss]
    bwd_kv = [c for c in bwd if g.coll_in_bytes[c] == kv]
    bwd_dkv = [c for c in bwd if g.coll_in_bytes[c] == dkv]
    rotations = 1 if rotate == "allgather" else cp - 1
    assert len(fwd_kv) == len(bwd_kv) == LAYERS * rotations and len(bwd_dkv) == LAYERS * cp
    assert len(bwd) == len(bwd_kv) + len(bwd_dkv)
    assert all(int(g.coll_in_bytes[c]) == kv for c in fwd_kv)
    if rotate == "allgather":
        assert set(ag) == set(fwd_kv) | set(bwd_kv) and all(int(g.coll_out_bytes[c]) == cp * kv for c in ag)
    else:
        assert not ag
    assert set(g.meta[PERMUTE_META]) == {g.names[c] for c in a2a}
    costs = estimate_costs(g, "h100-sxm")
    assert all(costs.meta["collective_algorithms"][c].startswith("p2p") for c in a2a)


def test_attention_runs_as_cp_blocks_on_each_rank_s_tokens():
    """Each rank's tokens are seq / cp; attention is cp blocks per layer each way, causal only on the local block;
    CP rank 0 (the traced rank) meets only higher ranks' K/V, for its tail chunk's queries (half the rows)."""
    cp = 4
    w = _cp_workload("allgather", cp)
    gm, local = w.graph_module, SEQ // cp
    tokens = next(n for n in gm.graph.nodes if n.name == "tokens")
    assert tuple(tokens.meta["val"].shape) == (w.spec.batch, local)
    assert w.meta["context_parallel"] == {"cp": cp, "rotate_method": "allgather", "load_balancer": "headtail",
                                          "tokens_per_rank": w.spec.batch * local}  # fmt: skip
    assert w.meta["tokens_per_step"] == w.spec.batch * SEQ * 8 // cp
    fwd = [n for n in gm.graph.nodes if str(n.target) == "aten._scaled_dot_product_flash_attention.default"]
    bwd = [n for n in gm.graph.nodes if str(n.target) == "aten._scaled_dot_product_flash_attention_backward.default"]
    assert len(fwd) == len(bwd) == LAYERS * cp
    q_rows = [n.args[0].meta["val"].shape[2] for n in fwd]
    kv_rows = [n.args[1].meta["val"].shape[2] for n in fwd]
    assert q_rows == [local, *[local // 2] * (cp - 1)] * LAYERS and kv_rows == [local] * (LAYERS * cp)
    causal = set(w.graph.meta[CAUSAL_META])
    assert causal == {n.name for n in fwd[::cp] + bwd[::cp]}


def test_cp_halves_the_attention_a_rank_is_charged():
    """Head-tail sharding balances the causal work: a CP-2 rank's attention kernels cost about half those of the
    same sequence without CP."""

    def attention_s(w):
        costs = estimate_costs(w.graph, "h100-sxm")
        idx = [i for i, t in enumerate(w.graph.targets) if "flash_attention" in t]
        return float(np.sum(costs.node_s[idx]))

    seq = 8192
    full = build("llama3-8b", parallel="fsdp", world_size=8, layers=1, seq_len=seq)
    half = build("llama3-8b", parallel="fsdp", world_size=8, layers=1, seq_len=seq, cp_size=2)
    assert 0.4 < attention_s(half) / attention_s(full) < 0.65


@pytest.mark.parametrize(
    ("kw", "field"),
    [
        (dict(seq_len=66, cp_size=2), "cp_size=2 does not split seq_len=66"),
        (dict(seq_len=96, cp_size=3), "cp_size=3 does not divide the fsdp dimension"),
        (dict(cp_size=2, cp_rotate="ring"), "cp_rotate='ring'"),
        (dict(cp_size=0), "cp_size=0"),
        (dict(parallel="tp+sp", mode="decode", cp_size=2), "cp_size=2 is for mode='train' or 'prefill'"),
        (dict(parallel="fsdp+ep", preset="mixtral-tiny", cp_size=2), "cp_size=2: context parallelism composes"),
    ],
)
def test_bad_cp_requests_fail_in_one_line_naming_the_field(kw, field):
    kw = {"parallel": "fsdp", "seq_len": SEQ, **kw}
    with pytest.raises(ValueError) as err:
        resolve(kw.pop("preset", "llama-tiny"), world_size=8, tp_size=2 if kw["parallel"] == "tp+sp" else None, **kw)
    assert field in str(err.value) and "\n" not in str(err.value)


@pytest.mark.parametrize(
    "kw",
    [dict(parallel="fsdp+tp+sp", tp_size=2, ac="full"), dict(parallel="tp", mode="prefill")],
)
def test_cp_size_1_leaves_the_graph_node_for_node_unchanged(kw):
    def nodes(w):
        return [(n.name, str(n.target), str(n.args), tuple(getattr(n.meta.get("val"), "shape", ())))
                for n in w.graph_module.graph.nodes]  # fmt: skip

    default = traced("llama-tiny", world=8, seq_len=SEQ, **kw)
    explicit = traced("llama-tiny", world=8, seq_len=SEQ, cp_size=1, cp_rotate="alltoall", **kw)
    assert nodes(explicit) == nodes(default) and explicit.meta == default.meta
    assert "cp" not in default.meta["groups"] and PERMUTE_META not in default.graph.meta

"""Float8 tensorwise under tensor parallelism, as torchtitan runs torchao's float8 TP styles
(``Float8ColwiseParallel``, ``Float8RowwiseParallel``, ``PrepareFloat8ModuleInput``; commsched.workloads.float8):
the sequence all_gathers of the activations in float8 (one byte per element) after one cast per region, the amax
all_reduces (max) over the TP group, the gradients' reduce_scatters in bfloat16, the row-parallel output gradients
gathered in float8; hand counts for one layer. On real gloo ranks the TP step computes the unsharded float8 step:
``test_float8.py`` (TP+SP, with FSDP's float8 cases) and ``test_real.py`` (FSDP+TP+SP, with every plan)."""

from __future__ import annotations

import dataclasses
import math
from collections import Counter

import pytest
from zoo_helpers import check_ir, colls, traced

from commsched.ir import CollType, OpKind
from commsched.workloads import PRESETS, resolve

SEQ = 2048


def _source_dtype(g, i: int) -> str:
    """The dtype a node reads through views (a collective's data before its ``view(uint8)``)."""
    while g.kinds[i] == OpKind.VIEW and len(g.inputs(i)):
        i = int(g.inputs(i)[0])
    return g.buf_dtype[g.buf_ptr[i]]


def _by_dtype(w, ctype: CollType) -> Counter:
    """(dtype of the data sent, bytes) of each collective of a type on the TP group."""
    g = w.graph
    return Counter((_source_dtype(g, int(g.inputs(c)[0])), int(g.comm_bytes[c])) for c in colls(w, ctype, "tp"))


def _max_reduces(w) -> list[int]:
    """The all_reduces (max) of one value: the amaxes."""
    g = w.graph
    ops = {n.name: n for n in w.graph_module.graph.nodes}
    return [c for c in colls(w, CollType.ALL_REDUCE) if ops[g.names[c]].args[1] == "max"]


def test_one_layer_has_the_hand_counted_float8_gathers_and_amax_reduces():
    """llama3-8b, TP+SP over 8 ranks, one layer of T = 2048 tokens, D = 4096: per region (attention, feed-forward)
    the input is gathered in float8 (T D bytes, half of bf16's 2 T D) and the row-parallel output gradient in
    float8 e5m2 (T D); the reduce_scatters stay bf16 (2 T D: the embedding, the two row-parallel outputs, the
    head's and the two regions' input gradients); the final norm's gather and the embedding's gradient gather stay
    bf16. Amaxes all-reduced over TP, 2 bytes each: forward 2 region inputs + 2 row-parallel inputs + 7 weights,
    backward 7 output gradients + 7 weights (re-cast for grad_input)."""
    w = traced("llama3-8b", "tp+sp", 8, layers=1, seq_len=SEQ, float8="tensorwise")
    bf16 = traced("llama3-8b", "tp+sp", 8, layers=1, seq_len=SEQ)
    check_ir(w)
    t, d = SEQ, w.spec.model.dim
    assert w.meta["float8_tp"] and not bf16.meta.get("float8_tp")
    assert _by_dtype(w, CollType.ALL_GATHER) == Counter(
        {("float8_e4m3fn", t * d): 2, ("float8_e5m2", t * d): 2, ("bfloat16", 2 * t * d): 2}
    )
    assert _by_dtype(bf16, CollType.ALL_GATHER) == Counter({("bfloat16", 2 * t * d): 6})
    assert _by_dtype(w, CollType.REDUCE_SCATTER) == _by_dtype(bf16, CollType.REDUCE_SCATTER)
    assert _by_dtype(w, CollType.REDUCE_SCATTER) == Counter({("bfloat16", 2 * t * d): 6})
    g = w.graph
    tp = w.meta["groups"]["tp"]["name"]
    # the vocabulary-parallel cross-entropy's max: one float32 per token, not an amax
    amax = [c for c in _max_reduces(w) if int(g.comm_bytes[c]) != 4 * t]
    assert len(amax) == (2 + 2 + 7) + (7 + 7) and len(_max_reduces(bf16)) == 1
    assert all(g.groups[g.coll_group[c]].name == tp and int(g.comm_bytes[c]) == 2 for c in amax)
    saved = sum(int(bf16.graph.comm_bytes[c]) for c in bf16.graph.collectives.tolist()) - sum(
        int(g.comm_bytes[c]) for c in g.collectives.tolist()
    )
    assert saved == 4 * t * d - 2 * 25  # four gathers at half the bytes, less the 25 amaxes


def test_fsdp_tp_gathers_weights_in_float8_and_reduces_their_scales_over_both_groups():
    """FSDP+TP+SP (llama-tiny, fsdp 2 x tp 2): the weights come float8 from FSDP's all_gather with scales
    precomputed by one all_reduce (max) over the FSDP group and one over the TP group, so no weight amax is
    reduced per cast: 4 forward (2 region inputs, 2 row-parallel inputs) and 7 backward amaxes per layer."""
    w = traced("llama-tiny", "fsdp+tp+sp", 4, layers=1, tp_size=2, seq_len=64, float8="tensorwise")
    check_ir(w)
    g = w.graph
    amax = _max_reduces(w)
    role = {g.groups[g.coll_group[c]].name: r for r, info in w.meta["groups"].items() for c in amax
            if info["name"] == g.groups[g.coll_group[c]].name}  # fmt: skip
    per_role = Counter(role[g.groups[g.coll_group[c]].name] for c in amax if int(g.comm_bytes[c]) == 4 * 7)
    assert per_role == Counter({"fsdp": 1, "tp": 1})  # the precompute: 7 float32 amaxes, over each mesh dim
    assert len([c for c in amax if int(g.comm_bytes[c]) == 2]) == 4 + 7  # bfloat16 scalars
    # each weight's TP shard gathered in float8, in the forward and again in the backward: one byte per element
    f8 = [c for c in colls(w, CollType.ALL_GATHER, "fsdp") if _source_dtype(g, int(g.inputs(c)[0])) != "bfloat16"]
    local = [math.prod(w.spec.layout[pid].local_shape) for pid in w.spec.float8_params]
    assert Counter(int(g.comm_bytes[c]) for c in f8) == Counter(local * 2) and len(local) == 7
    assert {_source_dtype(g, int(g.inputs(c)[0])) for c in f8} == {"float8_e4m3fn"}


def test_linears_that_do_not_convert_are_refused_under_float8_tp():
    """torchao's float8 TP styles take Float8Linears only: a feed-forward of 200 (not a multiple of 16) is a
    one-line error naming its linears; rowwise (TP in high precision) takes it."""
    odd = dataclasses.replace(PRESETS["llama-tiny"], ffn_dim=200, name="llama-tiny-ffn200")
    with pytest.raises(ValueError) as exc:
        resolve(odd, parallel="tp+sp", world_size=2, float8="tensorwise")
    msg = str(exc.value)
    assert "\n" not in msg and "w1, w2, w3" in msg and "multiples of 16" in msg, msg
    assert not resolve(odd, parallel="tp+sp", world_size=2, float8="rowwise").float8_tp

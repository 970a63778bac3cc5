"""Presets, plans and parameter layouts: public parameter counts, impossible dimensions as clear errors before any
tracing, FSDP2 padding at every world size, and the metadata a workload carries."""

from __future__ import annotations

import dataclasses
import json

import pytest
from hypothesis import given
from hypothesis import strategies as st
from zoo_helpers import numel, traced

from commsched.frontends.json_io import load_graph, save_graph
from commsched.workloads import PRESETS, build, make_plan, param_layout, resolve


@pytest.mark.parametrize(
    ("preset", "billions", "active"),
    # public totals: Llama 3 8.03B / 70.6B / 405.9B (model cards, Llama 3 paper), Mixtral 46.7B with 12.9B active,
    # Llama 2 6.74B / 13.02B / 68.98B (the safetensors totals of the Hugging Face checkpoints)
    [
        ("llama3-8b", 8.03, None),
        ("llama3-70b", 70.55, None),
        ("llama3-405b", 405.85, None),
        ("mixtral-8x7b", 46.70, 12.9),
        ("llama2-7b", 6.74, None),
        ("llama2-13b", 13.02, None),
        ("llama2-70b", 68.98, None),
    ],
)
def test_preset_parameter_counts(preset, billions, active):
    cfg = PRESETS[preset]
    assert cfg.total_params() / 1e9 == pytest.approx(billions, abs=0.01)
    plan = make_plan("none", 1)
    assert sum(p.numel for p in param_layout(cfg, plan)) == cfg.total_params()
    if active is not None:
        embed = 2 * cfg.vocab_size * cfg.dim
        assert (cfg.n_layers * cfg.block_active_params() + embed) / 1e9 == pytest.approx(active, abs=0.05)


@pytest.mark.parametrize(
    ("kw", "message"),
    [
        (dict(preset="llama3-8b", parallel="tp", world_size=1024), "more TP ranks than heads"),
        (dict(preset="llama3-8b", parallel="tp", world_size=16, tp_size=16), "n_kv_heads=8"),
        (dict(preset="llama3-8b", parallel="ep", world_size=8), "mixture-of-experts"),
        (dict(preset="mixtral-8x7b", parallel="ep", world_size=16, ep_size=16), "n_experts=8"),
        (dict(preset="llama3-8b", parallel="fsdp", world_size=8, mode="decode"), "training parallelisms"),
        (dict(preset="llama3-8b", parallel="tp+sp", world_size=8, mode="decode", batch=3), "divide evenly"),
        (dict(preset="llama3-8b", parallel="fsdp+tp", world_size=2), "FSDP dimension >= 2"),
        (dict(preset="llama3-8b", parallel="fsdp+tp", world_size=7), "no tensor-parallel degree in 2..8"),
        (dict(preset="llama3-8b", parallel="fsdp+tp", world_size=8, tp_size=8), "FSDP dimension >= 2"),
        (dict(preset="llama3-8b", parallel="fsdp", world_size=1), "world_size >= 2"),
        (dict(preset="llama3-9b", parallel="fsdp", world_size=8), "unknown preset 'llama3-9b'"),
        (dict(preset="llama3-8b", parallel="zero3", world_size=8), "unknown parallelism 'zero3'"),
        (dict(preset="llama3-8b", parallel="fsdp", world_size=8, mode="serve"), "unknown mode 'serve'"),
        (dict(preset="llama3-8b", parallel="fsdp", world_size=8, dtype="int8"), "dtype 'int8'"),
        (dict(preset="llama3-8b", parallel="fsdp", world_size=8, layers=0), "layers=0"),
        (dict(preset="llama3-8b", parallel="tp", world_size=8, mode="decode", kv_len=10, seq_len=20), "kv_len=10"),
    ],
)
def test_impossible_configurations_fail_before_tracing(kw, message, monkeypatch):
    import commsched.workloads.trace as trace_mod

    def no_trace(*a, **k):
        raise AssertionError("traced an impossible configuration")

    monkeypatch.setattr(trace_mod, "trace_spec", no_trace)
    with pytest.raises(ValueError, match=message):
        build(kw.pop("preset"), **kw)


@given(
    preset=st.sampled_from(["llama3-8b", "llama3-70b", "llama3-405b", "mixtral-8x7b"]),
    world=st.integers(2, 16384),
)
def test_fsdp_pads_at_any_world_size(preset, world):
    spec = resolve(preset, parallel="fsdp", world_size=world, layers=1)
    for p in spec.layout:
        rows = p.local_shape[0]
        assert p.shard_shape[0] == -(-rows // world)  # FSDP2: ceil(rows / world) rows per rank
        assert p.shard_shape[1:] == p.local_shape[1:]
        assert p.fsdp_pad_rows == p.shard_shape[0] * world - rows < world


@given(world=st.sampled_from([16, 64, 512, 4096]), tp=st.sampled_from([2, 4, 8]))
def test_tp_layouts_split_heads_and_vocabulary(world, tp):
    spec = resolve("llama3-8b", parallel="fsdp+tp", world_size=world, tp_size=tp, layers=1)
    by_key = {p.key: p for p in spec.layout}
    assert by_key["wq"].local_shape == (4096 // tp, 4096) and by_key["wo"].local_shape == (4096, 4096 // tp)
    assert by_key["w2"].local_shape == (4096, 14336 // tp)
    assert by_key["output"].local_shape[0] * tp == 128256 + by_key["output"].vocab_pad_rows
    assert by_key["attention_norm"].local_shape == (4096,)


@pytest.mark.parametrize(("world", "mesh"), [(6, {"fsdp": 3, "tp": 2}), (1000, {"fsdp": 125, "tp": 8})])
def test_default_tp_degree_fits_world_and_model(world, mesh):
    assert resolve("llama3-8b", parallel="fsdp+tp", world_size=world).plan.dims == mesh


def test_vocabulary_padding_over_tp():
    odd = dataclasses.replace(PRESETS["llama-tiny"], vocab_size=1001, name="odd")
    spec = resolve(odd, parallel="tp", world_size=4, layers=1)
    emb = next(p for p in spec.layout if p.key == "tok_embeddings")
    assert emb.vocab_pad_rows == 3 and emb.local_shape == (251, 256)


def test_meta_and_json_roundtrip(tmp_path):
    w = traced("llama3-8b", "fsdp", 8, 2)
    m = w.meta
    assert m["preset"] == "llama3-8b" and m["parallel"] == "fsdp" and m["mode"] == "train"
    assert m["world_size"] == 8 and m["mesh"] == {"fsdp": 8} and m["layers"] == 2
    assert m["seq_len"] == 8192 and m["batch"] == 1 and m["tokens_per_step"] == 8 * 8192
    assert m["dtype"] == "bfloat16" and m["master_dtype"] == "float32" and m["reduce_dtype"] == "float32"
    assert m["intended_device"] == "cuda" and m["traced_device"] == "cpu"
    assert m["params_per_layer"] == 218_112_000
    assert m["params_total"] == PRESETS["llama3-8b"].total_params(2)
    assert m["fsdp_reshard_after_forward"] == ["embed", "layers.0", "layers.1"]
    assert m["inputs"][:2] == ["tok_embeddings.weight", "layers.0.attention_norm.weight"]
    json.dumps(m)
    assert w.graph.meta["preset"] == "llama3-8b"
    save_graph(w.graph, tmp_path / "g.json")
    g2 = load_graph(tmp_path / "g.json")
    assert len(g2) == len(w.graph) and g2.meta["mesh"] == {"fsdp": 8}
    assert (g2.comm_bytes == w.graph.comm_bytes).all() and (g2.flops == w.graph.flops).all()
    shards = [numel(p.shard_shape) for p in w.spec.layout]
    assert [numel(b.shape) for i in range(len(shards)) for b in w.graph.buffers(i)] == shards

"""Split-sequence overlap (a step's sequences as chunks): the chunked program computes the same function as the
step (a prefill's logits and KV caches, a training step's loss and gradients) for random shapes, chunk counts and
parallelisms (every rank in one process, float32); a traced zoo prefill splits into annotated chunks with the
step's inputs; where it does not apply the error says why; on real gloo ranks the outputs agree."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.frontends.fake_pg import fake_process_group
from commsched.frontends.fx import from_fx
from commsched.ir import GraphError
from commsched.rewrites.split_batch import interleave_micro_batches, micro_batch_of, traced_spec
from commsched.rewrites.split_sequence import split_zoo_sequence, why_not_split_sequence
from commsched.rewrites.spmd import run_spmd
from commsched.workloads import build
from commsched.workloads.mesh import create_groups
from commsched.workloads.program import StepProgram


def _with_caches(gm: torch.fx.GraphModule) -> torch.fx.GraphModule:
    """``gm`` returning its KV-cache inputs too (written in place by the step), so that run_spmd shows them."""
    caches = [n for n in gm.graph.nodes if n.op == "placeholder" and n.name.startswith("cache_")]
    out = gm.graph.output_node()
    out.args = (list(out.args[0]) + caches,)
    gm.recompile()
    return gm


def _rank_inputs(spec, world: int, seed: int) -> list[list[torch.Tensor]]:
    inputs = []
    for r in range(world):
        with fake_process_group(world, rank=r):
            inputs.append(StepProgram(spec, create_groups(spec.plan, r), r).real_inputs(seed=seed))
    return inputs


@settings(max_examples=8, deadline=None)
@given(
    case=st.sampled_from([("llama-tiny", "tp"), ("llama-tiny", "tp+sp"), ("mixtral-tiny", "ep")]),
    mode=st.sampled_from(["prefill", "train"]),
    layers=st.integers(1, 2),
    length=st.sampled_from([2, 4, 6]),
    chunks=st.sampled_from([2, 3, 4]),
    batch=st.integers(1, 2),
    extra_kv=st.integers(0, 3),
    seed=st.integers(0, 2**16),
)
def test_the_chunked_step_computes_the_same_function(case, mode, layers, length, chunks, batch, extra_kv, seed):
    """A prefill's logits and KV caches, a training step's loss and gradients."""
    preset, parallel = case
    seq = length * chunks  # a chunk of `length` positions: 2 ranks divide its tokens (sequence parallelism)
    kv = dict(kv_len=seq + extra_kv) if mode == "prefill" else {}
    w = build(preset, parallel=parallel, world_size=2, layers=layers, mode=mode, seq_len=seq, batch=batch,
              attention="sdpa", dtype="float32", capacity_factor=8.0, **kv)  # fmt: skip
    res = split_zoo_sequence(w.spec, chunks)
    g = from_fx(res.gm, group_sizes=w.graph.group_sizes(), meta=w.graph.meta)
    g.validate()
    if mode == "prefill":  # every collective once per chunk, but the logits' all_gather (and the sequence's)
        head = {"tp": 1, "tp+sp": 2, "ep": 0}[parallel]
        assert len(g.collectives) == chunks * (len(w.graph.collectives) - head) + head
    else:
        assert len(g.collectives) > len(w.graph.collectives)
    inputs = _rank_inputs(w.spec, 2, seed)
    before = run_spmd(_with_caches(w.graph_module), inputs)
    for program in (res.gm, interleave_micro_batches(res.gm, g)):
        after = run_spmd(_with_caches(program), inputs)
        for r in range(2):
            assert len(before[r]) == len(after[r]) == (1 + 2 * layers if mode == "prefill" else 1 + len(w.spec.layout))
            for a, b in zip(before[r], after[r], strict=True):
                assert a.shape == b.shape and a.dtype == b.dtype
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-5)
    assert any(t.abs().sum() > 0 for t in before[0])


def test_a_traced_prefill_splits_into_annotated_chunks_with_the_steps_inputs():
    w = build("llama-tiny", parallel="tp+sp", world_size=2, layers=2, mode="prefill", seq_len=16)
    spec = traced_spec(w.graph_module)
    res = split_zoo_sequence(spec, 4)
    assert [r["positions"] for r in res.rows] == [[0, 4], [4, 8], [8, 12], [12, 16]]
    assert all(r["nodes"] > 0 for r in res.rows)
    names = [n.name for n in res.gm.graph.nodes if n.op == "placeholder"]
    assert names == [n.name for n in w.graph_module.graph.nodes if n.op == "placeholder"]
    # layer by layer as traced: chunk 1 of a layer comes before chunk 0 of the next one
    chunks = [micro_batch_of(n) for n in res.gm.graph.nodes if micro_batch_of(n) is not None]
    assert chunks != sorted(chunks) and set(chunks) == {0, 1, 2, 3}
    # each chunk's attention reads the KV cache up to its own end, causally aligned bottom-right
    attn = [n for n in res.gm.graph.nodes if "flash_attention" in str(n.target)]
    assert [n.args[1].meta["val"].shape[2] for n in attn[:4]] == [4, 8, 12, 16]
    assert all(n.args[0].meta["val"].shape[2] == 4 and n.args[4] is True for n in attn)


def test_where_it_does_not_apply_is_said():
    fsdp = build("llama-tiny", parallel="fsdp", world_size=2, layers=1, seq_len=16)
    assert why_not_split_sequence(fsdp.spec).startswith("a training step without TP or EP: its collectives are per")
    decode = build("llama-tiny", parallel="tp", world_size=2, layers=1, seq_len=16, mode="decode")
    assert why_not_split_sequence(decode.spec, 2) == "mode 'decode': one new position per sequence, nothing to split"
    odd = build("llama-tiny", parallel="tp", world_size=2, layers=1, seq_len=15, mode="prefill")
    assert why_not_split_sequence(odd.spec) is None  # some chunk count may divide it
    with pytest.raises(GraphError, match=r"split sequence: a sequence of 15 positions does not divide into 2 equal"):
        split_zoo_sequence(odd.spec, 2)
    sp = build("llama-tiny", parallel="tp+sp", world_size=2, layers=1, seq_len=6, mode="prefill")
    with pytest.raises(GraphError, match=r"a chunk's 3 tokens do not divide over tp=2"):
        split_zoo_sequence(sp.spec, 2)
    with pytest.raises(GraphError, match=r"into 1 equal chunks"):
        split_zoo_sequence(sp.spec, 1)


@pytest.mark.slow
def test_split_steps_match_on_gloo():
    """Real gloo ranks, each tracing its own step: the step and its sequences in two chunks agree on the logits, or
    the loss and gradients (float32 tolerance: smaller matmuls may round otherwise). Mixtral's capacity factor 8
    drops no token in a chunk, where the split is the same function."""
    from gloo_helpers import assert_outputs_match, compare_on_gloo

    tiny = dict(dtype="float32", seq_len=16, attention="sdpa", layers=2)
    cases = [("llama-tiny", dict(parallel="tp+sp", mode="prefill", **tiny), "split_sequence", "h100-sxm"),
             ("mixtral-tiny", dict(parallel="ep", mode="prefill", capacity_factor=8.0, **tiny), "split_sequence",
              "h100-sxm"),
             ("llama-tiny", dict(parallel="tp", **tiny), "split_sequence", "h100-sxm")]  # fmt: skip
    results = compare_on_gloo(cases, world_size=2, seed=7)
    assert_outputs_match([f"{p} {o['parallel']}" for p, o, _, _ in cases], results)

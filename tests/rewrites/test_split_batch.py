"""Split-batch overlap: the micro-batched program computes the same function (random programs over a batch with
TP / EP-style collectives, every rank in one process, float64), weight-only work is shared across micro-batches,
a traced zoo step splits into two annotated micro-batches, and where it does not apply the error says why."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from commsched.frontends.fake_pg import fake_process_group
from commsched.frontends.fx import from_fx
from commsched.ir import GraphError
from commsched.rewrites.split_batch import (
    interleave_micro_batches,
    merged_step,
    micro_batch_of,
    micro_batch_sizes,
    split_zoo_step,
    trace_merged,
    traced_spec,
)
from commsched.rewrites.spmd import run_spmd

c10d = torch.ops._c10d_functional
WEIGHTS = 2


def _program(ops: tuple[str, ...], world: int):
    """A step over rows ``[batch * rows_per_sequence, d]``: each op is row-separable, as a model's layers are
    along the batch (TP all_gather -> compute -> reduce_scatter, all_reduce, MoE-style all_to_all there and back
    around row-wise compute, GEMMs with weights prepared from the shared inputs, an in-place update of a
    weight-derived tensor). Returns ``[rows, mean]`` (a per-row output and a mean, like a loss)."""

    def step(x, *ws):
        h = x
        for k, op in enumerate(ops):
            w = ws[k % WEIGHTS]
            if op == "mm":
                h = h @ (w * 2.0).t()  # weight-only work: shared by the micro-batches
            elif op == "sin":
                h = torch.sin(h) + 0.5
            elif op == "all_reduce":
                h = c10d.wait_tensor(c10d.all_reduce(h, "sum", "0")) * 0.25
            elif op == "ag_rs":
                g = torch.tanh(c10d.wait_tensor(c10d.all_gather_into_tensor(h.contiguous(), world, "0")))
                h = c10d.wait_tensor(c10d.reduce_scatter_tensor(g, "sum", world, "0"))
            elif op == "all_to_all":
                split = [h.shape[0] // world] * world
                there = c10d.wait_tensor(c10d.all_to_all_single(h.contiguous(), split, split, "0"))
                h = c10d.wait_tensor(c10d.all_to_all_single(torch.cos(there), split, split, "0"))
            elif op == "inplace":  # written in place: sharing it would add 1 once per micro-batch
                h = h @ (w * 3.0).add_(1.0)
        return [h * 1.0, h.mean()]

    return step


def _merge(outs, sizes):
    total = sum(sizes)
    return [torch.cat([o[0] for o in outs]), sum(o[1] * (b / total) for o, b in zip(outs, sizes, strict=True))]


@settings(max_examples=25, deadline=None)
@given(
    world=st.sampled_from([2, 4]),
    batch=st.integers(2, 5),
    parts=st.integers(2, 3),
    rows_per_world=st.integers(1, 2),
    d=st.integers(1, 4),
    ops=st.lists(st.sampled_from(["mm", "sin", "all_reduce", "ag_rs", "all_to_all", "inplace"]), min_size=1,
                 max_size=6),
    seed=st.integers(0, 2**16),
)  # fmt: skip
def test_micro_batched_program_computes_the_same_function(world, batch, parts, rows_per_world, d, ops, seed):
    parts = min(parts, batch)
    rows = rows_per_world * world  # rows per sequence: a micro-batch's rows divide over the ranks (all_to_all)
    step = _program(tuple(ops), world)
    sizes = micro_batch_sizes(batch, parts)
    shapes = [(batch * rows, d)] + [(d, d)] * WEIGHTS
    with fake_process_group(world), FakeTensorMode():
        fakes = [torch.empty(s, dtype=torch.float64) for s in shapes]
        gm = make_fx(step)(*fakes)
        split = trace_merged(merged_step([step] * parts, sizes, (0, None, None), _merge), fakes)
    g = from_fx(split, group_sizes={"0": world})
    g.validate()
    collectives = sum(2 if op in ("ag_rs", "all_to_all") else op == "all_reduce" for op in ops)
    assert len(g.collectives) == parts * collectives  # each micro-batch has its own
    assert {micro_batch_of(n) for n in split.graph.nodes if n.op == "call_function"} >= set(range(parts))
    # the weights are scaled once per op, not once per micro-batch
    scale = [n for n in split.graph.nodes if n.target is torch.ops.aten.mul.Tensor and n.args[1] == 2.0]
    assert len(scale) == sum(op == "mm" for op in ops)
    gen = torch.Generator().manual_seed(seed)
    inputs = [[torch.randn(*s, generator=gen, dtype=torch.float64) for s in shapes] for _ in range(world)]
    interleaved = interleave_micro_batches(split, g)  # the order optimize schedules from
    mbs = [micro_batch_of(n) for n in interleaved.graph.nodes if micro_batch_of(n) is not None]
    assert mbs != sorted(mbs)  # micro-batch 1 starts before micro-batch 0 ends
    before = run_spmd(gm, inputs)
    for program in (split, interleaved):
        after = run_spmd(program, inputs)
        for r in range(world):
            for a, b in zip(before[r], after[r], strict=True):
                assert a.shape == b.shape
                torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


def test_a_traced_zoo_step_splits_into_two_annotated_micro_batches():
    from commsched.workloads import build

    w = build("llama-tiny", parallel="tp+sp", world_size=2, layers=1, mode="prefill", seq_len=16, batch=2)
    spec = traced_spec(w.graph_module)
    assert spec is not None and spec.batch == 2
    res = split_zoo_step(spec)
    g2 = from_fx(res.gm, group_sizes=w.graph.group_sizes(), meta=w.graph.meta)
    g2.validate()
    # every collective of the step runs once per micro-batch (none of a TP prefill's depends on weights alone)
    assert len(g2.collectives) == 2 * len(w.graph.collectives)
    assert [r["sequences"] for r in res.rows] == [1, 1] and all(r["nodes"] > 0 for r in res.rows)
    # the same inputs as the step: tokens and the KV caches are narrowed along dim 0, the rest is shared
    names = [n.name for n in res.gm.graph.nodes if n.op == "placeholder"]
    assert names == [n.name for n in w.graph_module.graph.nodes if n.op == "placeholder"]
    dims = dict(zip(names, res.extra["split"].batch_dims, strict=True))
    assert dims["tokens"] == 0 and dims["cache_k_0"] == 0 and dims["rope_cos"] is None


def test_where_it_does_not_apply_is_said():
    from commsched.rewrites.fxutil import copy_graph_module
    from commsched.workloads import build

    w = build("llama-tiny", parallel="tp+sp", world_size=2, layers=1, mode="prefill", seq_len=16)
    with pytest.raises(GraphError, match=r"batch 1: a split along the batch needs >= 2 sequences \(a prefill"):
        split_zoo_step(traced_spec(w.graph_module))
    w3 = build("llama-tiny", parallel="tp+sp", world_size=2, layers=1, mode="prefill", seq_len=3, batch=2)
    with pytest.raises(GraphError, match=r"3 tokens do not divide over tp=2"):
        split_zoo_step(traced_spec(w3.graph_module))
    changed = copy_graph_module(w.graph_module)
    out = changed.graph.output_node()
    with changed.graph.inserting_before(out):
        changed.graph.call_function(torch.ops.aten.clone.default, (next(iter(changed.graph.nodes)),))
    assert traced_spec(changed) is None  # a module changed since the zoo traced it is not retraced
    with pytest.raises(ValueError, match=r"batch=1, parts=2"):
        micro_batch_sizes(1)


@pytest.mark.slow
def test_split_zoo_steps_match_on_gloo():
    """Real gloo ranks: the traced step and its two micro-batches agree on every output (a mean over two halves
    may round otherwise than over the whole, so to a float32 tolerance). Mixtral's capacity factor 4 (= experts /
    top_k) drops no token, where the split is the same function."""
    from gloo_helpers import assert_outputs_match, compare_on_gloo

    results = compare_on_gloo(GLOO_CASES, world_size=2, seed=5)
    labels = [f"{preset} {opts['parallel']} {opts.get('mode', 'train')}" for preset, opts, _, _ in GLOO_CASES]
    assert_outputs_match(labels, results)


_TINY = dict(dtype="float32", seq_len=16, batch=2, attention="sdpa", layers=1)
GLOO_CASES = [  # (preset, build options, rewrite, hardware)
    ("mixtral-tiny", dict(parallel="ep", capacity_factor=4.0, **_TINY), "split_batch", "h100-sxm"),
    ("mixtral-tiny", dict(parallel="ep", mode="prefill", capacity_factor=4.0, **_TINY), "split_batch", "h100-sxm"),
    ("llama-tiny", dict(parallel="tp+sp", mode="prefill", **_TINY), "split_batch", "h100-sxm"),
]  # fmt: skip

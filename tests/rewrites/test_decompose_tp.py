"""Decomposed TP collectives: the rewritten program computes the same function (random shapes, every rank in one
process), the sites are found on traced zoo TP / TP+SP / FSDP+TP steps, and bad splits are one-line errors."""

from __future__ import annotations

import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from random_programs import trace

from commsched.frontends.fx import from_fx
from commsched.ir import GraphError, OpKind
from commsched.rewrites.decompose_tp import TPSplit, decompose_tp, find_tp_sites
from commsched.rewrites.spmd import run_spmd

c10d = torch.ops._c10d_functional


def _tp_layer(world: int, sp: bool, side_reader: bool, backward_sum: bool, extra_wait: bool = False):
    """A TP(+SP) block the way the zoo traces it: (all_gather ->) column-parallel mms -> row-parallel mm(s) ->
    reduce_scatter (SP) or all_reduce (TP). ``extra_wait``: a user program's explicit second ``wait_tensor`` on
    each collective's waited result (issue #36 item 12)."""

    def wait(t):
        t = c10d.wait_tensor(t)
        return c10d.wait_tensor(t) if extra_wait else t

    def fn(x, w1, w2, w3):
        h = wait(c10d.all_gather_into_tensor(x, world, "0")) if sp else x
        a, b = torch.mm(h, w1), torch.mm(h, w2)  # two readers, like q / k / v
        y = torch.mm(torch.relu(a) * b, w3)
        if backward_sum:  # an input gradient: a sum of products
            y = y + torch.mm(b, w3)
        out = wait(c10d.reduce_scatter_tensor(y, "sum", world, "0") if sp else c10d.all_reduce(y, "sum", "0"))
        extra = [h.t() * 1] if side_reader else []  # a weight gradient's read of the gathered input
        return [out * 1, *extra]

    return fn


@settings(max_examples=30, deadline=None)
@given(
    world=st.sampled_from([2, 4]),
    rows_per_chunk=st.integers(1, 3),
    chunks=st.sampled_from([2, 4]),
    k_dim=st.integers(1, 6),
    hidden=st.integers(1, 5),
    sp=st.booleans(),
    side_reader=st.booleans(),
    backward_sum=st.booleans(),
    extra_wait=st.booleans(),
    dim=st.sampled_from(["m", "n"]),
    seed=st.integers(0, 2**16),
)
def test_decomposed_program_computes_the_same_function(
    world, rows_per_chunk, chunks, k_dim, hidden, sp, side_reader, backward_sum, extra_wait, dim, seed
):
    s = rows_per_chunk * chunks  # rows per rank (SP) or of the whole tensor (TP)
    rows = s if sp else s * world
    n_out = chunks * k_dim  # so that an "n" split divides the columns
    shapes = [(rows, n_out), (n_out, hidden * chunks), (n_out, hidden * chunks), (hidden * chunks, n_out)]
    gm, g = trace(_tp_layer(world, sp, side_reader, backward_sum, extra_wait), world, shapes)
    sites = find_tp_sites(gm)
    assert [x.pattern for x in sites] == (["ag_mm", "mm_rs"] if sp else ["mm_ar"])
    splits = [TPSplit(x.collective, "m" if x.pattern == "ag_mm" else dim, chunks) for x in sites]
    res = decompose_tp(gm, splits, graph=g)
    g2 = from_fx(res.gm, group_sizes=g.group_sizes())
    g2.validate()
    assert len(g2.collectives) == chunks * len(sites)
    assert int((g2.wait_of >= 0).sum()) == len(g2.collectives)  # an extra wait on a split site's result is folded away
    # no matmul of the original size remains: every one was split
    assert sum(1 for k in g2.kinds if k == OpKind.COMPUTE) > sum(1 for k in g.kinds if k == OpKind.COMPUTE)
    gen = torch.Generator().manual_seed(seed)
    inputs = [[torch.randn(*sh, generator=gen, dtype=torch.float64) for sh in shapes] for _ in range(world)]
    before, after = run_spmd(gm, inputs), run_spmd(res.gm, inputs)
    for r in range(world):
        assert len(before[r]) == len(after[r])
        for a, b in zip(before[r], after[r], strict=True):
            assert a.shape == b.shape
            torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)


@pytest.mark.parametrize(
    ("parallel", "mode", "patterns"),
    [
        ("tp", "train", {"mm_ar"}),
        ("tp+sp", "train", {"ag_mm", "mm_rs"}),
        ("tp+sp", "prefill", {"ag_mm", "mm_rs"}),
        ("fsdp+tp", "train", {"mm_ar"}),
    ],
)
def test_sites_are_found_on_traced_zoo_steps(parallel, mode, patterns):
    from commsched.workloads import build

    w = build("llama-tiny", parallel=parallel, world_size=4, layers=1, mode=mode, seq_len=16, batch=2)
    sites = find_tp_sites(w.graph_module)
    assert {x.pattern for x in sites} == patterns
    # every TP-group site: the row-parallel output projections of attention and the MLP at least (forward)
    tp_groups = {x.group for x in sites}
    assert len(tp_groups) == 1
    res = decompose_tp(w.graph_module, [TPSplit(x.collective, "m", 2) for x in sites], graph=w.graph)
    g2 = from_fx(res.gm, group_sizes=w.graph.group_sizes(), meta=w.graph.meta)
    g2.validate()
    assert len(g2.collectives) == len(w.graph.collectives) + len(sites)
    assert len(res.rows) == len(sites)

    def unread(gm):  # computed and read by nothing (a gathered tensor reassembled for no reader was one)
        return sorted(str(n.target) for n in gm.graph.nodes if n.op == "call_function" and not n.users)

    assert unread(res.gm) == unread(w.graph_module)


def test_bad_splits_are_one_line_errors():
    gm, g = trace(_tp_layer(2, True, False, False), 2, [(4, 4), (4, 6), (4, 6), (6, 4)])
    sites = find_tp_sites(gm)
    with pytest.raises(GraphError, match=r"not a decomposable TP site"):
        decompose_tp(gm, [TPSplit("nope", "m", 2)], graph=g)
    with pytest.raises(GraphError, match=r"cannot split 3 ways along 'm'"):
        decompose_tp(gm, [TPSplit(sites[0].collective, "m", 3)], graph=g)
    with pytest.raises(GraphError, match=r"cannot split 2 ways along 'n'"):
        decompose_tp(gm, [TPSplit(sites[0].collective, "n", 2)], graph=g)  # an all_gather splits along m only


GLOO_CASES = [  # (preset, build options, rewrite, split dim of the reductions)
    ("llama-tiny", dict(parallel="tp", dtype="float32", seq_len=16, batch=2, attention="sdpa"), "decompose_tp", "n"),
    ("llama-tiny", dict(parallel="tp+sp", dtype="float32", seq_len=16, batch=2, attention="sdpa"), "decompose_tp", "m"),
    ("llama-tiny", dict(parallel="tp+sp", mode="prefill", dtype="float32", seq_len=16, batch=2, attention="sdpa"),
     "decompose_tp", "n"),
]  # fmt: skip


@pytest.mark.slow
def test_decomposed_zoo_steps_match_on_gloo():
    """Real gloo ranks: the traced zoo step and its decomposition agree on every output (a split matmul may round
    differently from the whole one, so to a float32 tolerance), and the step did real work."""
    from gloo_helpers import assert_outputs_match, compare_on_gloo

    results = compare_on_gloo(GLOO_CASES, world_size=2, seed=7)
    labels = [f"{p} {o['parallel']} {o.get('mode', 'train')} split {dim}" for p, o, _, dim in GLOO_CASES]
    assert_outputs_match(labels, results)

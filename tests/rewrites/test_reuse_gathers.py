"""Gathered parameters kept for the backward (rewrites/reuse_gathers.py): which all_gathers repeat an earlier one,
the same function on every rank (bit for bit: the dropped gather's value is the kept one's), each group's
collectives in one order, the IR made directly equal to the rewritten module's import, and real gloo ranks."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.frontends.fx import from_fx
from commsched.ir import GraphError
from commsched.rewrites import run_spmd
from commsched.rewrites.reuse_gathers import find_regathers, reuse_gathers, reuse_graph
from commsched.workloads import build
from commsched.workloads.program import StepProgram

FIELDS = ("kinds", "in_ptr", "in_idx", "dep_ptr", "dep_idx", "flops", "buf_ptr", "buf_nbytes", "buf_storage",
          "storage_nbytes", "storage_owner", "side_effect", "coll_type", "coll_group", "coll_in_bytes",
          "coll_out_bytes", "coll_sync", "wait_of")  # fmt: skip


def _same_graph(a, b) -> None:
    assert a.names == b.names and a.targets == b.targets
    assert a.buf_shape == b.buf_shape and a.buf_dtype == b.buf_dtype
    for f in FIELDS:
        assert np.array_equal(getattr(a, f), getattr(b, f)), f
    assert a.coll_reduce_op == b.coll_reduce_op and a.groups == b.groups


@pytest.mark.parametrize(
    "preset, parallel, world, runs",
    [("llama-tiny", "fsdp", 4, [9, 9, 1]), ("llama-tiny", "fsdp+tp", 4, [9, 9, 1]),
     ("mixtral-tiny", "fsdp+ep", 8, None), ("llama-tiny", "ddp", 2, []), ("llama-tiny", "tp", 2, [])],
)  # fmt: skip
def test_regathers_on_traced_zoo_steps(preset, parallel, world, runs):
    """Each layer's backward gathers (and the embedding's at the end) repeat the forward's; DDP and TP gather no
    parameter twice."""
    w = build(preset, parallel=parallel, world_size=world, layers=2)
    found = find_regathers(w.graph_module)
    if runs is not None:
        assert [len(r) for r in found] == runs
    else:
        assert found and all(r.param.startswith(("layers_", "tok_")) for run in found for r in run)
    names = {n.name: n for n in w.graph_module.graph.nodes}
    for run in found:
        for r in run:  # the same placeholder through the same chain, earlier in the program
            assert r.forward != r.backward and r.param in names
            order = list(names)
            assert order.index(r.forward) < order.index(r.backward)


@pytest.mark.parametrize("parallel", ["fsdp", "fsdp+tp"])
def test_ir_made_directly_is_the_rewritten_modules_import(parallel):
    w = build("llama-tiny", parallel=parallel, world_size=4, layers=2)
    runs = find_regathers(w.graph_module)
    for j in range(1, len(runs) + 1):
        dropped = [r for run in runs[:j] for r in run]
        gm = reuse_gathers(w.graph_module, [r.backward for r in dropped]).gm
        imported = from_fx(gm, group_sizes=w.graph.group_sizes(), meta=w.graph.meta)
        made = reuse_graph(w.graph, dropped)
        made.validate()
        _same_graph(made, imported)
        assert len(made.collectives) == len(w.graph.collectives) - len(dropped)


def _per_group(g) -> dict[str, list[str]]:
    out: dict[str, list[str]] = {}
    for c in g.collectives.tolist():
        out.setdefault(g.groups[int(g.coll_group[c])].name, []).append(g.names[c])
    return out


@settings(max_examples=10, deadline=None)
@given(
    world=st.sampled_from([2, 4]),
    layers=st.integers(1, 2),
    picks=st.lists(st.booleans(), min_size=19, max_size=19),
    seed=st.integers(0, 100),
)
def test_dropping_any_regathers_computes_the_same_function(world, layers, picks, seed):
    """Any subset of an FSDP step's re-gathers dropped: every rank's outputs are bit-identical (every rank in one
    process, exact collective semantics), the graph is valid, and the group keeps its other collectives in their
    order (the same on every rank: every rank runs this program)."""
    w = build("llama-tiny", parallel="fsdp", world_size=world, layers=layers, dtype="float32", seq_len=16,
              attention="sdpa")  # fmt: skip
    regathers = [r for run in find_regathers(w.graph_module) for r in run]
    dropped = [r.backward for r, p in zip(regathers, picks, strict=False) if p]
    res = reuse_gathers(w.graph_module, dropped)
    g2 = from_fx(res.gm, group_sizes=w.graph.group_sizes(), meta=w.graph.meta)
    g2.validate()
    before, after = _per_group(w.graph), _per_group(g2)
    assert {k: [n for n in v if n not in dropped] for k, v in before.items()} == after
    inputs = [StepProgram(w.spec, {}, r).real_inputs(seed=seed) for r in range(world)]
    want, got = run_spmd(w.graph_module, inputs), run_spmd(res.gm, inputs)
    for a, b in zip(want, got, strict=True):
        assert len(a) == len(b) and all(torch.equal(x, y) for x, y in zip(a, b, strict=True))


def test_bad_names_are_one_line_errors():
    w = build("llama-tiny", parallel="fsdp", world_size=2, layers=1)
    first = find_regathers(w.graph_module)[0][0]
    with pytest.raises(GraphError, match=r"'nope' is not an all_gather that repeats"):
        reuse_gathers(w.graph_module, ["nope"])
    with pytest.raises(GraphError, match=r"is not an all_gather that repeats"):
        reuse_gathers(w.graph_module, [first.forward])  # the first gather repeats nothing


@pytest.mark.slow
def test_kept_gathers_match_on_gloo():
    """Real gloo ranks: the step with every re-gather dropped gives each rank's outputs of the traced step exactly."""
    from gloo_helpers import assert_outputs_match, compare_on_gloo

    cases = [("llama-tiny", dict(parallel="fsdp", dtype="float32", seq_len=16, batch=2, attention="sdpa"),
              "reuse_gathers", "h100-sxm")]  # fmt: skip
    assert_outputs_match(["fsdp reuse_gathers"], compare_on_gloo(cases, world_size=2, seed=11), rtol=0, atol=0)

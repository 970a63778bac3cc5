"""``permute_nodes`` is the graph ``from_fx`` imports from the module reordered the same way, so ``optimize`` reports
the returned module without importing it again: random programs in random orders, and ``optimize``'s kept
programs (traced, bucketed, decomposed TP, split batch) on zoo steps."""

from __future__ import annotations

import random

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from random_programs import programs, random_topological_order
from test_bucket_graph import assert_same_graph

import commsched
from commsched.frontends.fake_pg import fake_process_group
from commsched.frontends.fx import from_fx
from commsched.ir import GraphError
from commsched.ir.transform import permute_nodes
from commsched.passes import Schedule
from commsched.rewrites.fxutil import copy_graph_module
from commsched.runtime.apply import apply_schedule, module_order
from commsched.workloads import build


@settings(max_examples=60, deadline=None)
@given(programs(), st.integers(0, 2**16))
def test_permuted_graph_is_the_reordered_module_reimported(program, seed):
    gm, graph = program.trace()
    order = np.asarray(random_topological_order(graph, random.Random(seed)), np.int32)
    moved = apply_schedule(copy_graph_module(gm), Schedule(graph, order))
    with fake_process_group(program.world):
        fx = from_fx(moved)
    permuted = permute_nodes(graph, module_order(graph, order))
    assert_same_graph(fx, permuted)
    permuted.validate()


def test_an_order_that_is_not_topological_is_refused():
    g = build("llama-tiny", parallel="fsdp", world_size=2, layers=1).graph
    with pytest.raises(GraphError, match="before an input"):
        permute_nodes(g, np.arange(len(g))[::-1])
    with pytest.raises(GraphError, match="each of the graph's"):
        permute_nodes(g, np.zeros(len(g), np.int64))


@pytest.mark.parametrize(
    ("parallel", "world", "batch", "seq_len", "kept"),
    [
        ("fsdp", 64, None, None, "bucketed"),
        ("tp+sp", 8, None, None, "decomposed TP"),
        ("tp+sp", 8, 2, 4096, "split batch"),
        ("tp+sp", 8, None, None, "split sequence"),
        ("fsdp", 512, None, None, "gathers kept for the backward"),
    ],
)
def test_optimize_reports_the_module_it_returns(parallel, world, batch, seq_len, kept, monkeypatch):
    from commsched.optimize.families import split_sequence

    if kept != "split sequence":  # it wins on these TP+SP prefills: the others are checked without it
        monkeypatch.setattr(split_sequence, "SEQUENCE_CHUNKS", ())
    mode = "train" if parallel == "fsdp" else "prefill"
    w = build("llama3-8b", parallel=parallel, world_size=world, layers=2, mode=mode, batch=batch, seq_len=seq_len)
    o = commsched.optimize(w.graph_module, "h100-sxm", group_sizes=w.graph.group_sizes())
    assert kept in o.label  # the case exercises what it names
    fx = from_fx(o.gm, group_sizes=w.graph.group_sizes(), meta=w.graph.meta)
    assert_same_graph(fx, o.graph)

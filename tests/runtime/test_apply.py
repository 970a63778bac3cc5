"""apply_schedule: the FX graph follows the schedule, stays valid, and computes bit-identical results in any order."""

from __future__ import annotations

import random

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from torch.fx.experimental.proxy_tensor import make_fx

import commsched
from commsched.frontends.fx import from_fx
from commsched.ir import GraphError
from commsched.passes import schedule
from commsched.runtime import STREAM_META_KEY, apply_schedule, copy_graph_module, fx_order
from orders import random_topo_order
from programs import trace_program

_ENDS = (commsched.OpKind.INPUT, commsched.OpKind.OUTPUT)


def _body(gm) -> list[str]:
    """FX node names in graph order without placeholders and output (they always keep their places)."""
    return [n.name for n in gm.graph.nodes if n.op not in ("placeholder", "output")]


def _order_body(g, order) -> list[str]:
    return [g.names[i] for i in order.tolist() if g.kinds[i] not in _ENDS]


@pytest.fixture(scope="module")
def fsdp():
    gm, g = trace_program("fsdp_mlp", 4, layers=3, dim=128)
    sched = schedule(g, "h100-sxm", "default")
    return gm, g, sched


def test_reorders_like_the_schedule_and_lints(fsdp):
    gm, g, sched = fsdp
    assert not np.array_equal(sched.order, np.arange(len(g))), "the pass should move something on this program"
    before = _body(gm)
    out = apply_schedule(copy_graph_module(gm), sched)
    assert _body(out) == _order_body(g, sched.order)
    assert _body(gm) == before  # the copy was reordered, not the original
    out.graph.lint()
    assert "wait_tensor" in out.code  # recompiled: the code is regenerated from the new order
    first_ag = out.code.index("all_gather_into_tensor")
    assert out.code.index("all_gather_into_tensor", first_ag + 1) < out.code.index("mm")  # prefetched
    # the reordered graph imports to the same graph, node for node, in the scheduled order
    g2 = from_fx(out, group_sizes={grp.name: grp.size for grp in g.groups})
    assert sorted(g2.names) == sorted(g.names)
    assert _order_body(g2, np.arange(len(g2))) == _order_body(g, sched.order)


def test_accepts_names_and_annotates_streams(fsdp):
    gm, g, sched = fsdp
    streams = np.zeros(len(g), np.int32)
    colls = g.collectives
    streams[colls] = 1
    out = apply_schedule(copy_graph_module(gm), sched.names, streams=streams[sched.order])
    got = {n.name: n.meta.get(STREAM_META_KEY) for n in out.graph.nodes}
    assert all(got[g.names[c]] == 1 for c in colls.tolist())
    assert sum(v == 0 for v in got.values()) == len(g) - len(colls)
    # a later schedule without streams removes the stale annotation
    apply_schedule(out, sched)
    assert all(STREAM_META_KEY not in n.meta for n in out.graph.nodes)


@pytest.mark.parametrize(
    ("mutate", "message"),
    [
        (lambda names: [*names, "no_such_node"], "not in the FX graph"),
        (lambda names: [names[0], *names], "twice"),
        (lambda names: list(reversed(names)), "before its input"),
    ],
)
def test_bad_orders_raise_and_leave_the_graph_unchanged(fsdp, mutate, message):
    gm, _g, sched = fsdp
    work = copy_graph_module(gm)
    before, code = _body(work), work.code
    with pytest.raises(GraphError, match=message):
        apply_schedule(work, mutate(list(sched.names)))
    assert _body(work) == before
    assert work.code == code


def test_nodes_the_order_omits_follow_their_inputs(fsdp):
    gm, _g, sched = fsdp
    views = {n.name for n in gm.graph.nodes if n.op == "call_function" and n.target is torch.ops.aten.view.default}
    assert views
    order = fx_order(gm, [n for n in sched.names if n not in views])
    names = [n.name for n in order]
    assert sorted(names) == sorted(n.name for n in gm.graph.nodes)
    pos = {n: i for i, n in enumerate(names)}
    for node in order:
        if node.name in views:
            latest = max(pos[a.name] for a in node.all_input_nodes)
            assert latest < pos[node.name]
            assert all(n in views for n in names[latest + 1 : pos[node.name]])  # right after, among omitted ones


def _mlp_program():
    """A joint forward + backward of a small MLP on real tensors (no collectives): results are exactly
    reproducible on one thread, whatever the order of independent ops."""
    torch.manual_seed(0)
    ws = [torch.randn(48, 48, requires_grad=True) for _ in range(3)]
    x = torch.randn(16, 48)

    def step(x, *ws):
        h, outs = x, []
        for w in ws:
            h = torch.tanh(h @ w) + h.sum(dim=0, keepdim=True) * 1e-3
            outs.append(h.mean())
        loss = sum(outs)
        return [loss, *torch.autograd.grad(loss, ws)]

    gm = make_fx(step)(x, *ws)
    return gm, from_fx(gm), [x, *ws]


@pytest.fixture(scope="module")
def mlp():
    threads = torch.get_num_threads()
    torch.set_num_threads(1)  # one thread: reductions are reproducible bit for bit
    try:
        gm, g, inputs = _mlp_program()
        with torch.no_grad():
            yield gm, g, inputs, gm(*inputs)
    finally:
        torch.set_num_threads(threads)


@settings(max_examples=25)
@given(seed=st.integers(0, 2**32 - 1))
def test_any_valid_order_runs_and_is_bit_identical(mlp, seed):
    gm, g, inputs, expected = mlp
    order = random_topo_order(g, random.Random(seed))
    work = apply_schedule(copy_graph_module(gm), [g.names[i] for i in order.tolist()])
    assert _body(work) == _order_body(g, order)
    with torch.no_grad():
        got = work(*inputs)
    assert all(torch.equal(a, b) for a, b in zip(got, expected, strict=True))

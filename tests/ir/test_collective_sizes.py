"""A collective's sizes agree with its group and its output tensors (issue 36, item 6): graph validation refuses an
all_gather whose out_bytes is not in_bytes x group size (and the other kinds' rules) with one line naming the node,
so no collective is costed at a size it does not move. Every traced collective kind passes."""

from __future__ import annotations

import json

import pytest
import torch
from torch._subclasses.fake_tensor import FakeTensorMode
from torch.fx.experimental.proxy_tensor import make_fx

from commsched.frontends.fake_pg import fake_process_group
from commsched.frontends.fx import from_fx
from commsched.frontends.json_io import graph_from_dict, graph_to_dict, load_graph
from commsched.ir import CollType, GraphError
from hostile import assert_user_error
from programs import trace_program

c10d = torch.ops._c10d_functional


@pytest.mark.parametrize("world", [2, 4, 8, 16])
@pytest.mark.parametrize("kind", ["every_collective", "inplace", "fsdp_mlp"])
def test_every_traced_collective_kind_has_sizes_that_agree(kind, world):
    _, g = trace_program(kind, world)
    g.validate()
    for c in g.collectives.tolist():
        coll = g.collective(c)
        size = g.groups[coll.group].size
        assert coll.out_bytes == sum(b.nbytes for b in g.buffers(c)) > 0
        want = {CollType.ALL_GATHER: (coll.out_bytes, coll.in_bytes * size),
                CollType.REDUCE_SCATTER: (coll.in_bytes, coll.out_bytes * size)}  # fmt: skip
        left, right = want.get(coll.type, (coll.in_bytes, coll.out_bytes))
        assert left == right, (g.names[c], coll)
    assert {g.collective(c).type for c in g.collectives.tolist()} >= (
        set(CollType) if kind == "every_collective" else set()
    )


def test_uneven_all_to_all_stays_valid():
    """all_to_all_single with uneven splits moves different totals in and out; the graph records no splits, so
    its in_bytes and out_bytes are not held to each other (only out_bytes to its output tensor)."""
    with fake_process_group(2) as pg, FakeTensorMode():
        x = torch.randn(4, 8)
        gm = make_fx(lambda x: c10d.wait_tensor(c10d.all_to_all_single(x, [1, 5], [2, 2], pg.group_name)))(x)
        g = from_fx(gm).validate()
    (c,) = g.collectives.tolist()
    assert (g.coll_in_bytes[c], g.coll_out_bytes[c]) == (4 * 8 * 4, 6 * 8 * 4)


def _every_collective_dict(world: int = 8) -> dict:
    return graph_to_dict(trace_program("every_collective", world)[1])


def _first(d: dict, ctype: str) -> tuple[int, dict]:
    return next((i, n) for i, n in enumerate(d["nodes"]) if (n.get("collective") or {}).get("type") == ctype)


# (kind, field changed, factor, the rule the message names)
BROKEN = [
    ("all_gather", "out_bytes", 3 / 8, "expected out_bytes = in_bytes x group size"),
    ("all_gather", "in_bytes", 2, "expected out_bytes = in_bytes x group size"),
    ("reduce_scatter", "in_bytes", 1 / 2, "expected in_bytes = out_bytes x group size"),
    ("reduce_scatter", "out_bytes", 8, "expected in_bytes = out_bytes x group size"),
    ("all_reduce", "out_bytes", 2, "expected in_bytes = out_bytes"),
    ("broadcast", "in_bytes", 1 / 4, "expected in_bytes = out_bytes"),
]


@pytest.mark.parametrize(("ctype", "field", "factor", "rule"), BROKEN, ids=[f"{b[0]}.{b[1]}" for b in BROKEN])
def test_inconsistent_sizes_are_refused_naming_the_node(tmp_path, ctype, field, factor, rule):
    d = _every_collective_dict()
    i, node = _first(d, ctype)
    node["collective"][field] = int(node["collective"][field] * factor)
    path = tmp_path / "g.json"
    path.write_text(json.dumps(d))
    with pytest.raises(GraphError) as info:
        load_graph(path)
    msg = str(info.value)
    assert msg.startswith(f"{path}: node {i} {node['name']!r}") and rule in msg and "\n" not in msg
    assert_user_error(["simulate", str(path)], f"node {i} {node['name']!r}", rule)


def test_sizes_that_agree_but_not_with_the_output_tensor_are_refused(tmp_path):
    """in_bytes and out_bytes doubled together still agree with each other, not with the tensor the node writes."""
    d = _every_collective_dict()
    i, node = _first(d, "all_gather")
    node["collective"]["in_bytes"] *= 2
    node["collective"]["out_bytes"] *= 2
    with pytest.raises(GraphError, match=rf"node {i} '{node['name']}' .*out_bytes \d+ but its output tensors hold"):
        graph_from_dict(d)


def test_a_traced_zoo_all_gather_at_the_wrong_size_fails_on_the_cli(tmp_path):
    """The issue's case: a traced FSDP step whose first all_gather's out_bytes was edited (3 x its input, on a
    group of 8) was accepted and costed at 3/8 of the size it gathers."""
    from commsched.workloads import build

    d = graph_to_dict(build("llama-tiny", parallel="fsdp", world_size=8, layers=1).graph)
    i, node = _first(d, "all_gather")
    node["collective"]["out_bytes"] = node["collective"]["in_bytes"] * 3
    path = tmp_path / "bad_ag.json"
    path.write_text(json.dumps(d))
    for cmd in (["simulate", str(path)], ["schedule", str(path)], ["info", str(path)], ["estimate", str(path)]):
        assert_user_error(cmd, str(path), f"node {i} '{node['name']}'", "all_gather", "group size 8")

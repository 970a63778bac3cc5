"""IR invariants: CSR adjacency, ancestors, validation errors, subgraph selection."""

from __future__ import annotations

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from commsched.ir import CollType, GraphBuilder, GraphError, OpKind
from commsched.ir.transform import eliminate_dead_nodes
from programs import trace_program
from strategies import graphs


def _naive_preds(g):
    return [sorted(set(g.inputs(i).tolist()) | set(g.deps(i).tolist())) for i in range(len(g))]


@given(graphs(max_nodes=50))
def test_csr_matches_naive_adjacency(g):
    g.validate()
    preds = _naive_preds(g)
    for i in range(len(g)):
        assert g.predecessors(i).tolist() == preds[i]
    succs = [[] for _ in range(len(g))]
    for i, ps in enumerate(preds):
        for p in ps:
            succs[p].append(i)
    for i in range(len(g)):
        assert g.successors(i).tolist() == succs[i]
    ptr, idx = g.successors_csr()
    assert ptr.dtype == np.int32 and idx.dtype == np.int32


@given(graphs(max_nodes=40))
def test_ancestor_bitsets(g):
    preds = _naive_preds(g)
    anc = [set() for _ in range(len(g))]
    for i in range(len(g)):
        for p in preds[i]:
            anc[i] |= anc[p] | {p}
    bits = g.ancestor_bitsets()
    for i in range(len(g)):
        assert {j for j in range(len(g)) if bits[i] >> j & 1} == anc[i]
    some = [len(g) - 1, 0]
    assert g.ancestor_bitsets(some) == [bits[0], bits[len(g) - 1]]


@given(graphs(max_nodes=40))
def test_select_and_dead_node_elimination(g):
    g2 = eliminate_dead_nodes(g)
    g2.validate()
    # every kept non-input node is used by someone or is side-effecting
    users = np.zeros(len(g2), bool)
    users[g2.in_idx] = True
    removable = ~users & ~g2.side_effect & np.isin(g2.kinds, [OpKind.COMPUTE, OpKind.OTHER, OpKind.VIEW])
    assert not removable.any()
    assert len(g2.collectives) == len(g.collectives)
    assert set(g2.names) <= set(g.names)


def test_traced_graph_csr_and_storage_users():
    _, g = trace_program("fsdp_mlp", 8, layers=2, dim=64)
    ptr, idx = g.storage_users
    for s in range(g.num_storages):
        users = set(idx[ptr[s] : ptr[s + 1]].tolist())
        naive = {i for i in range(len(g)) if s in {b.storage for b in g.buffers(i)}}
        naive |= {i for i in range(len(g)) for p in g.inputs(i) if s in {b.storage for b in g.buffers(int(p))}}
        assert users == naive


def _small_builder():
    b = GraphBuilder()
    grp = b.group("tp", 8)
    x = b.add_node("x", "placeholder", OpKind.INPUT, buffers=[((4,), "float32", 16, None)])
    c = b.add_node(
        "ar",
        "_c10d_functional.all_reduce.default",
        OpKind.COLLECTIVE,
        [x],
        buffers=[((4,), "float32", 16, None)],
        side_effect=True,
    )
    b.set_collective(c, CollType.ALL_REDUCE, grp, "sum", 16, 16)
    return b, x, c


def test_validate_wait_without_collective():
    b, x, c = _small_builder()
    w = b.add_node("w", "_c10d_functional.wait_tensor.default", OpKind.WAIT, [c], buffers=[((4,), "float32", 16, 1)])
    b.set_wait(w, c)
    b.add_node("bad_wait", "_c10d_functional.wait_tensor.default", OpKind.WAIT, [x])
    with pytest.raises(GraphError, match=r"'bad_wait'.*does not belong to a collective"):
        b.build()


def test_validate_collective_without_wait():
    b, _x, _c = _small_builder()
    with pytest.raises(GraphError, match=r"'ar'.*has no wait"):
        b.build()


def test_validate_wait_on_non_collective():
    b, x, c = _small_builder()
    w = b.add_node("w", "_c10d_functional.wait_tensor.default", OpKind.WAIT, [c])
    b.set_wait(w, c)
    w2 = b.add_node("w2", "_c10d_functional.wait_tensor.default", OpKind.WAIT, [x])
    b.set_wait(w2, x)
    with pytest.raises(GraphError, match=r"'w2'.*which is not a collective"):
        b.build()


def test_validate_out_of_order_and_cycle():
    b, _x, c = _small_builder()
    w = b.add_node("w", "_c10d_functional.wait_tensor.default", OpKind.WAIT, [c])
    b.set_wait(w, c)
    b.add_node("a", "aten.relu.default", OpKind.OTHER, [w])
    b.add_node("late", "placeholder", OpKind.INPUT)
    b.inputs[1] = [0, 4]  # 'ar' now reads a later node: out of order
    with pytest.raises(GraphError, match=r"'ar'.*input 'late' \(id 4\) comes after it"):
        b.build()
    b.inputs[1] = [0, 3]  # 'ar' reads 'a', which reads 'w', which reads 'ar': a cycle
    with pytest.raises(GraphError, match="cycle: 'ar' -> 'w' -> 'a' -> 'ar'"):
        b.build()


def test_duplicate_names_rejected():
    b = GraphBuilder()
    b.add_node("x", "placeholder", OpKind.INPUT)
    with pytest.raises(GraphError, match="duplicate node name 'x'"):
        b.add_node("x", "placeholder", OpKind.INPUT)


_EDGES = st.integers(1, 40).flatmap(
    lambda n: st.tuples(st.just(n), st.lists(st.tuples(st.integers(0, n - 1), st.integers(0, n - 1)), max_size=120))
)


@settings(max_examples=200, deadline=None)
@given(_EDGES)
def test_csr_groups_unique_sources_by_destination(case):
    from commsched.ir.graph import csr

    n, edges = case
    src = np.asarray([s for s, _ in edges], np.int64)
    dst = np.asarray([d for _, d in edges], np.int64)
    ptr, idx = csr(n, src, dst)
    assert ptr.dtype == np.int32 and idx.dtype == np.int32 and len(ptr) == n + 1
    for d in range(n):
        assert idx[ptr[d] : ptr[d + 1]].tolist() == sorted({s for s, t in edges if t == d})

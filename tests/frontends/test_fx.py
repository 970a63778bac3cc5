"""FX frontend on graphs traced from real torch programs under the fake process group."""

from __future__ import annotations

import operator

import pytest
import torch

from commsched.frontends.fx import from_fx
from commsched.ir import CollType, GraphError, OpKind
from commsched.ir.inplace import inplace_deps
from commsched.ir.transform import eliminate_dead_nodes
from programs import DIM, TOKENS, trace_program


def _by_name(g):
    return {n.name: n for n in g}


@pytest.mark.parametrize("world", [8, 1024])
def test_every_collective_type_sizes_and_groups(world):
    gm, g = trace_program("every_collective", world)
    g.validate()
    fx_names = [n.name for n in gm.graph.nodes]
    assert g.names == fx_names  # names and order are the FX ones
    colls = [g.collective(int(c)) for c in g.collectives]
    types = sorted(c.type.name for c in colls)
    assert types == sorted(
        [
            "ALL_GATHER",
            "ALL_REDUCE",
            "REDUCE_SCATTER",
            "ALL_TO_ALL",
            "BROADCAST",
            "ALL_REDUCE",
            "ALL_GATHER",
            "REDUCE_SCATTER",
        ]
    )
    assert all(g.groups[c.group].size == world for c in colls)
    tokens = TOKENS * world // 8
    f32 = 4
    by_type = {}
    for c in g.collectives:
        by_type.setdefault(g.collective(int(c)).type, []).append(int(c))
    ag, _ag_c = by_type[CollType.ALL_GATHER]
    assert g.collective(ag).in_bytes == 2 * DIM * f32
    assert g.collective(ag).out_bytes == world * 2 * DIM * f32
    assert g.comm_bytes[ag] == world * 2 * DIM * f32  # nccl-tests: whole gathered output
    ar, ar_c = by_type[CollType.ALL_REDUCE]
    h_bytes = tokens * world * 2 * f32
    assert g.collective(ar).in_bytes == g.collective(ar).out_bytes == h_bytes
    assert g.collective(ar_c).reduce_op == "avg"
    assert g.collective(ar_c).in_bytes == 2 * tokens * DIM * f32
    assert len(g.collective(ar_c).waits) == 2  # coalesced: one wait per output, through getitem
    rs, rs_c = by_type[CollType.REDUCE_SCATTER]
    assert g.collective(rs).in_bytes == h_bytes and g.collective(rs).out_bytes == h_bytes // world
    assert g.comm_bytes[rs] == h_bytes  # nccl-tests: whole input
    assert g.collective(rs_c).in_bytes == 2 * world * tokens * DIM * f32
    (a2a,) = by_type[CollType.ALL_TO_ALL]
    assert g.collective(a2a).in_bytes == h_bytes
    (bc,) = by_type[CollType.BROADCAST]
    assert g.collective(bc).in_bytes == tokens * DIM * f32


@pytest.mark.parametrize("world", [8, 1024])
def test_kinds_aliasing_and_flops(world):
    _gm, g = trace_program("every_collective", world)
    nodes = _by_name(g)
    assert nodes["x_1"].kind == OpKind.INPUT
    assert nodes["output"].kind == OpKind.OUTPUT
    mm = nodes["mm"]
    assert mm.kind == OpKind.COMPUTE
    tokens = TOKENS * world // 8
    assert mm.flops == 2 * tokens * DIM * (2 * world)
    # a wait returns the collective's buffer: same storage, no new allocation
    for w in (n for n in g if n.kind == OpKind.WAIT):
        coll = g.node(w.wait_of)
        assert w.buffers[0].storage in {b.storage for b in coll.buffers}
    # t is a view of the gathered weight: it shares the wait's (= the all_gather's) storage
    t = nodes["t"]
    assert t.kind == OpKind.VIEW and t.buffers[0].storage == nodes["wait_tensor"].buffers[0].storage
    # getitem of a coalesced collective aliases the right output
    coalesced = [n for n in g if n.kind == OpKind.COLLECTIVE and n.target.endswith("coalesced.default")]
    for c in coalesced:
        users = [n for n in g if n.kind == OpKind.VIEW and n.inputs == [c.id]]
        assert [u.buffers[0].storage for u in users] == [b.storage for b in c.buffers]
    assert g.flops.sum() >= mm.flops


def test_inplace_and_out_variants_order_writes():
    gm, g = trace_program("inplace", 8)
    nodes = _by_name(g)
    ar = nodes["all_reduce_"]
    assert ar.kind == OpKind.COLLECTIVE
    assert ar.buffers[0].storage == nodes["mul"].buffers[0].storage  # all_reduce_ writes its input
    ag = nodes["all_gather_into_tensor_out"]
    assert ag.buffers[0].storage == nodes["empty"].buffers[0].storage  # _out writes `out`
    copy = nodes["copy_"]
    assert copy.side_effect if hasattr(copy, "side_effect") else g.side_effect[copy.id]
    # WAR: buf.sum() read buf before copy_ overwrote it -> the copy must follow the read
    assert nodes["sum_1"].id in copy.deps or nodes["sum_1"].id in copy.inputs
    assert copy.buffers[0].storage == nodes["b_1"].buffers[0].storage  # copy_ returns its destination
    # RAW: a later read of buf through the *original* name (not copy_'s result) must still follow the copy
    fx_sum3 = next(n for n in gm.graph.nodes if n.name == "sum_3")
    fx_b = next(n for n in gm.graph.nodes if n.name == "b_1")
    fx_sum3.args = (fx_b,)
    g2 = from_fx(gm, group_sizes={"0": 8})
    later = g2.node("sum_3")
    assert later.inputs == [g2.index["b_1"]] and g2.index["copy_"] in later.deps


def test_the_shared_in_place_rule_gives_the_imported_ordering_edges():
    """``commsched.ir.inplace.inplace_deps`` over the imported graph (the writes as the IR shows them) gives every
    ordering edge ``from_fx`` made but each wait's to its collective: the importer and the IR rewrites share it."""
    _gm, g = trace_program("inplace", 8)
    assert_ordering_edges_follow_the_rule(g)


def assert_ordering_edges_follow_the_rule(g) -> None:
    rule = inplace_deps(g.kinds, g.in_ptr, g.in_idx, g.buf_ptr, g.buf_storage, g.storage_owner, g.wait_of, g.coll_sync)
    assert rule, "no in-place write to order: the check checks nothing"
    for v in range(len(g)):
        c = int(g.wait_of[v])
        wait = [c] if c >= 0 and c not in g.inputs(v).tolist() else []
        assert sorted(g.deps(v).tolist()) == sorted({*rule.get(v, ()), *wait}), g.names[v]


def test_fsdp_autograd_makes_reduce_scatters():
    _gm, g = trace_program("fsdp_mlp", 8, layers=3, dim=256)
    types = [g.collective(int(c)).type for c in g.collectives]
    assert types.count(CollType.ALL_GATHER) == 3
    assert types.count(CollType.REDUCE_SCATTER) == 3  # all_gather's backward
    for c in g.collectives:
        coll = g.collective(int(c))
        assert coll.comm_bytes == 256 * 256 * 4


def test_missing_meta_is_a_clear_error():
    gm, _ = trace_program("fsdp_mlp", 8, layers=1, dim=64)
    victim = next(n for n in gm.graph.nodes if n.op == "call_function" and "mm" in n.name)
    del victim.meta["val"]
    victim.meta.pop("tensor_meta", None)
    with pytest.raises(GraphError, match=rf"FX node '{victim.name}'.*meta\['val'\]"):
        from_fx(gm)


def test_an_eager_c10d_collective_is_refused_not_imported_as_compute():
    """``dist.all_reduce`` traced as is records c10d's in-place op; imported as an ordinary op its transfer was lost
    (a step with no collective: a wrong time). It is refused, naming the node and the functional collectives."""
    import torch.distributed as dist
    from torch.fx.experimental.proxy_tensor import make_fx

    from commsched.frontends.fake_pg import fake_process_group

    def step(x):
        dist.all_reduce(x)
        return x * 2

    with fake_process_group(4):
        gm = make_fx(step)(torch.randn(4, 4))
    for node in gm.graph.nodes:  # the process-group constant given a value, as FakeTensorProp would leave it
        node.meta.setdefault("val", None)
    with pytest.raises(GraphError, match=r"FX node 'allreduce_' \(c10d\.allreduce_\.default\): an eager c10d .*"
                                          r"_functional_collectives"):  # fmt: skip
        from_fx(gm, group_sizes={"0": 4})


def test_unknown_group_needs_group_sizes():
    gm, _ = trace_program("fsdp_mlp", 8, layers=1, dim=64)
    # outside the fake process group the group cannot be resolved: all_gather carries its size, so this works
    g = from_fx(gm)
    assert g.groups[0].size == 8
    gm2, _ = trace_program("every_collective", 8)
    with pytest.raises(GraphError, match="cannot tell the size of process group"):
        from_fx(gm2)
    g2 = from_fx(gm2, group_sizes={"0": 8})
    assert {p.size for p in g2.groups} == {8}


def test_dce_drops_unused_chains_but_keeps_collectives():
    _gm, g = trace_program("every_collective", 8)
    assert all(g.kinds[g.in_idx] >= 0)  # sanity
    g2 = eliminate_dead_nodes(g)
    g2.validate()
    assert len(g2.collectives) == len(g.collectives)
    assert (g2.kinds == OpKind.WAIT).sum() == (g.kinds == OpKind.WAIT).sum()
    # nothing dead in a make_fx graph except what autograd left; applying twice is a no-op
    assert len(eliminate_dead_nodes(g2)) == len(g2)


def test_dce_removes_a_dead_chain():
    import torch.fx

    gm, _ = trace_program("fsdp_mlp", 8, layers=1, dim=64)
    graph = gm.graph
    out = next(n for n in graph.nodes if n.op == "output")
    x = next(n for n in graph.nodes if n.op == "placeholder")
    with graph.inserting_before(out):
        d1 = graph.call_function(torch.ops.aten.relu.default, (x,))
        d2 = graph.call_function(torch.ops.aten.neg.default, (d1,))
    d1.meta["val"] = x.meta["val"]
    d2.meta["val"] = x.meta["val"]
    g = from_fx(gm)
    g2 = eliminate_dead_nodes(g)
    assert len(g) - len(g2) == 2 and d1.name in g.index and d1.name not in g2.index and d2.name not in g2.index
    assert isinstance(gm, torch.fx.GraphModule)


def test_torch_compile_custom_backend_graphs():
    """ATen graphs captured through torch.compile (aot_autograd with a custom compiler) import correctly."""
    import torch.distributed._functional_collectives as fc
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    from commsched.frontends.fake_pg import fake_process_group

    captured = []

    def compiler(gm, example_inputs):
        captured.append(from_fx(gm))
        return make_boxed_func(gm.forward)

    with fake_process_group(8) as pg:

        class Shard(torch.nn.Module):
            def __init__(self):
                super().__init__()
                self.w = torch.nn.Parameter(torch.randn(4, 32))

            def forward(self, x):
                w = fc.all_gather_tensor(self.w, 0, pg)
                return torch.relu(x @ w.t()).sum()

        torch._dynamo.reset()
        model = torch.compile(Shard(), backend=aot_autograd(fw_compiler=compiler, bw_compiler=compiler))
        model(torch.randn(16, 32)).backward()
        torch._dynamo.reset()
    fw, bw = captured
    assert [fw.collective(int(c)).type for c in fw.collectives] == [CollType.ALL_GATHER]
    assert [bw.collective(int(c)).type for c in bw.collectives] == [CollType.REDUCE_SCATTER]
    assert fw.groups[0].size == 8 and bw.groups[0].size == 8
    assert fw.collective(int(fw.collectives[0])).out_bytes == 8 * 4 * 32 * 4
    assert bw.collective(int(bw.collectives[0])).in_bytes == 8 * 4 * 32 * 4
    mm = [n for n in fw if n.target == "aten.mm.default"]
    assert mm and mm[0].flops == 2 * 16 * 32 * 32


def test_getitem_of_an_output_the_op_did_not_produce():
    """native_layer_norm_backward without an input gradient returns None first: its getitems must not shift."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    def f(x, w, b):
        y = torch.nn.functional.layer_norm(x, (8,), w, b)
        return torch.autograd.grad(y.sum(), (w,))

    with FakeTensorMode():
        x, w, b = torch.randn(4, 8), torch.randn(8, requires_grad=True), torch.randn(8, requires_grad=True)
        gm = make_fx(f)(x, w, b)
    g = from_fx(gm)
    bwd = next(n for n in gm.graph.nodes if "native_layer_norm_backward" in str(n.target))
    outs = bwd.meta["val"]
    assert outs[0] is None  # x needs no gradient
    for n in gm.graph.nodes:
        if n.target is operator.getitem and n.args[0] is bwd:
            node = g.node(n.name)
            element = outs[n.args[1]]
            if element is None:
                assert node.buffers == []
            else:
                assert node.buffers[0].shape == tuple(element.shape)
                assert node.buffers[0].storage in {b.storage for b in g.node(bwd.name).buffers}


def test_a_rewritten_copy_imported_with_the_traced_meta_keeps_its_own_causal_marks():
    """``from_fx(..., meta=traced.meta)`` adds the traced graph's meta, but what the import derives from the module
    itself (its causal attention nodes) is the module's: a prompt split in two chunks has two causal attentions,
    where the traced prefill had one (the second one was costed as full attention before)."""
    from commsched.ir import CAUSAL_META
    from commsched.rewrites.split_sequence import split_zoo_sequence
    from commsched.workloads import build

    w = build("llama-tiny", parallel="tp+sp", world_size=2, layers=1, mode="prefill", seq_len=16)
    split = split_zoo_sequence(w.spec, 2).gm
    g = from_fx(split, group_sizes=w.graph.group_sizes(), meta=w.graph.meta)
    attention = [n.name for n in split.graph.nodes if "flash_attention" in str(n.target)]
    assert len(w.graph.meta[CAUSAL_META]) == 1 and g.meta[CAUSAL_META] == attention and len(attention) == 2
    assert g.meta["workload"] == w.graph.meta["workload"]  # the rest of the traced meta is kept

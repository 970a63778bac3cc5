"""FSDP2 graph passes on steps traced from torch's own ``fully_shard`` (CPU, fake process group): functionalizing
its c10d collectives, relinking unsharded parameters, reinplacing the all_gather, enforcing FSDP comm order."""

from __future__ import annotations

import copy
import functools
import itertools

import pytest
import torch
from hypothesis import Phase, given, settings
from hypothesis import strategies as st
from random_programs import trace

from commsched.frontends.fake_pg import fake_process_group
from commsched.frontends.fx import from_fx
from commsched.ir import CollType, GraphError, OpKind
from commsched.memory import memory_profile
from commsched.rewrites import run_spmd
from commsched.rewrites.c10d_functionalize import functionalize_c10d
from commsched.rewrites.fsdp_ordering import enforce_fsdp_comm_ordering, ordering_constraints
from commsched.rewrites.fsdp_reinplace import reinplace_fsdp_all_gather
from commsched.rewrites.fsdp_trace import shard_mlp, tiny_mlp, trace_fsdp2_step
from commsched.rewrites.fsdp_unsharded_params import remove_unsharded_param_usage

c10d = torch.ops._c10d_functional


def _loss(model, x):
    return model(x).float().pow(2).mean()


@functools.cache
def _pipeline(world: int, mixed_precision: bool):
    """The traced FSDP2 step and each rewrite's result, in pipeline order, plus the unsharded reference model."""
    from torch.distributed.device_mesh import init_device_mesh

    reference = tiny_mlp()
    with fake_process_group(world):
        mesh = init_device_mesh("cpu", (world,))
        model = shard_mlp(copy.deepcopy(reference), mesh, mixed_precision=mixed_precision)
        shards = [param.to_local().detach().clone() for param in model.parameters()]
        gm = trace_fsdp2_step(model, _loss, torch.randn(4, 16))
        functional = functionalize_c10d(gm)
        before_relink = from_fx(functional.gm)
        relinked = remove_unsharded_param_usage(functional.gm)
        reinplaced = reinplace_fsdp_all_gather(relinked.gm)
        graph = from_fx(reinplaced.gm)
        ordered = enforce_fsdp_comm_ordering(reinplaced.gm, graph)
        ordered_graph = from_fx(ordered.gm).validate()
    return dict(gm=gm, functional=functional, before_relink=before_relink, relinked=relinked,
                reinplaced=reinplaced, reinplaced_graph=graph, ordered=ordered, ordered_graph=ordered_graph,
                reference=reference, shards=shards)  # fmt: skip


def _ops(gm, *targets):
    return [n for n in gm.graph.nodes if n.op == "call_function" and n.target in targets]


def _identical(a, b):
    return all(torch.equal(x, y) for ra, rb in zip(a, b, strict=True) for x, y in zip(ra, rb, strict=True))


def test_fully_shard_trace_contains_fsdp2_ops():
    p = _pipeline(2, False)
    gm = p["gm"]
    fsdp = torch.ops.fsdp
    assert len(_ops(gm, fsdp.all_gather_copy_in.default)) == 6  # 3 Linear units, forward + backward re-gather
    assert len(_ops(gm, fsdp.split_with_sizes_copy.default)) == 6
    assert len(_ops(gm, fsdp.chunk_cat.default)) == 3
    assert len(_ops(gm, torch.ops.c10d._allgather_base_.default)) == 6
    assert len(gm.meta["fsdp2_copy_outs"]) == 6 and gm.meta["fsdp2_groups"]


@pytest.mark.parametrize("mixed_precision", [False, True])
def test_functionalized_collectives_are_readable_by_the_ir(mixed_precision):
    p = _pipeline(2, mixed_precision)
    gm = p["functional"].gm
    assert not _ops(gm, torch.ops.c10d._allgather_base_.default, torch.ops.c10d._reduce_scatter_base_.default)
    g = p["before_relink"].validate()
    types = [CollType(int(g.coll_type[c])) for c in g.collectives.tolist()]
    assert types.count(CollType.ALL_GATHER) == 6 and types.count(CollType.REDUCE_SCATTER) == 3
    assert all(len(g.waits_of(c)) == 1 for c in g.collectives.tolist())


def _weight_readers_with_all_gather_ancestor(g):
    """(matmuls, of which have an all_gather among their ancestors)."""
    mms = [i for i in range(len(g)) if g.kinds[i] == OpKind.COMPUTE]
    anc = g.ancestor_bitsets(mms)
    ags = [c for c in g.collectives.tolist() if g.coll_type[c] == CollType.ALL_GATHER]
    return len(mms), sum(any(a >> c & 1 for c in ags) for a in anc)


@pytest.mark.parametrize("mixed_precision", [False, True])
def test_relinking_makes_compute_depend_on_the_all_gathers(mixed_precision):
    p = _pipeline(2, mixed_precision)
    n, linked = _weight_readers_with_all_gather_ancestor(p["before_relink"])
    assert n > 0 and linked == 0  # the trace reads unsharded parameters as constants: no edge to the all_gathers
    with fake_process_group(2):
        after = from_fx(p["relinked"].gm).validate()
    n, linked = _weight_readers_with_all_gather_ancestor(after)
    assert linked == n
    assert p["relinked"].counts["uses_replaced"] >= 6
    assert not [x for x in p["relinked"].gm.graph.nodes if x.op == "get_attr" and "param_constant" in x.target]


def test_relinked_step_computes_the_model_its_gathered_weights_make():
    """Every emulated rank holds rank 0's shards, so the gathered weights are [shard; shard]: the relinked step
    must compute that model's loss and rank 0's shard of its gradients (a wrong buffer, offset, stride or a
    parameter read before its copy-out would not)."""
    p = _pipeline(2, False)
    x = torch.randn(4, 16)
    loss, *grads = run_spmd(p["relinked"].gm, [[x], [x]])[0]
    model = copy.deepcopy(p["reference"])
    with torch.no_grad():
        for param, shard in zip(model.parameters(), p["shards"], strict=True):
            param.copy_(torch.cat([shard, shard]))
    ref = _loss(model, x)
    ref.backward()
    torch.testing.assert_close(loss, ref.detach(), rtol=1e-6, atol=0)
    for g, param in zip(grads, model.parameters(), strict=True):
        torch.testing.assert_close(g, param.grad[: len(g)], rtol=1e-5, atol=1e-7)


@pytest.mark.parametrize("mixed_precision", [False, True])
def test_reinplaced_all_gathers_write_the_copy_in_buffer(mixed_precision):
    p = _pipeline(2, mixed_precision)
    gm = p["reinplaced"].gm
    assert not _ops(gm, c10d.all_gather_into_tensor.default)
    outs = _ops(gm, c10d.all_gather_into_tensor_out.default)
    assert len(outs) == 6 == p["reinplaced"].counts["reinplaced"]
    for node in outs:
        buf = node.kwargs["out"]
        assert buf.args[0].target is torch.ops.fsdp.all_gather_copy_in.default and buf.args[1] == 1
    with fake_process_group(2):
        before = from_fx(p["relinked"].gm)
    # one gathered-size buffer less per all_gather
    saved = sum(r["bytes_saved"] for r in p["reinplaced"].rows)
    assert saved > 0
    assert before.storage_nbytes.sum() - p["reinplaced_graph"].storage_nbytes.sum() == saved
    assert memory_profile(p["reinplaced_graph"]).peak_bytes <= memory_profile(before).peak_bytes
    inputs = [[torch.randn(4, 16)] for _ in range(2)]
    assert _identical(run_spmd(p["relinked"].gm, inputs), run_spmd(gm, inputs))


@pytest.mark.parametrize("mixed_precision", [False, True])
def test_fsdp_comm_ordering_groups_and_orders(mixed_precision):
    p = _pipeline(2, mixed_precision)
    res, g = p["ordered"], p["ordered_graph"]
    order = {n.name: i for i, n in enumerate(res.gm.graph.nodes)}
    groups = res.extra["groups"]
    assert [x["kind"] for x in groups].count("all_gather") == 6
    assert [x["kind"] for x in groups].count("reduce_scatter") == 3
    for kind in ("all_gather", "reduce_scatter"):
        mine = [x for x in groups if x["kind"] == kind]
        for prev, nxt in itertools.pairwise(mine):  # one collective in flight ahead of its use
            assert max(order[n] for n in prev["wait"]) < min(order[n] for n in nxt["issue"])
        for x in mine:  # the wait group (wait, views, copy-out) runs back to back
            span = sorted(order[n] for n in x["wait"])
            assert span[-1] - span[0] == len(span) - 1
    src, dst = ordering_constraints(g, res)
    assert len(src) == 7 and all(g.names[s] in order and g.names[d] in order for s, d in zip(src, dst, strict=True))
    inputs = [[torch.randn(4, 16)] for _ in range(2)]
    assert _identical(run_spmd(p["reinplaced"].gm, inputs), run_spmd(res.gm, inputs))


def _compiled_fsdp_pattern(p, shard, x):
    """The pattern torch.compile's FSDP2 leaves: resize the unsharded parameter input, fsdp.copy_ into it, use it,
    free it; twice (forward and the backward re-gather)."""
    full = p.numel() * p.element_size()
    for k in range(2):
        torch.ops.inductor.resize_storage_bytes_(p, full)
        torch.ops.fsdp.copy_(p, torch.cat([shard * (k + 1), shard]))
        x = torch.relu(x @ p)
        torch.ops.inductor.resize_storage_bytes_(p, 0)
    return [x]


def test_compile_pattern_uses_the_copied_values():
    import torch._inductor

    gm, _ = trace(_compiled_fsdp_pattern, 1, [(4, 4), (2, 4), (3, 4)])
    res = remove_unsharded_param_usage(gm)
    assert res.counts == {"uses_replaced": 2, "params": 1}
    assert not _ops(res.gm, torch.ops.fsdp.copy_.default, torch.ops.inductor.resize_storage_bytes_.default)
    placeholder = next(n for n in res.gm.graph.nodes if n.op == "placeholder")
    assert not placeholder.users
    inputs = [[torch.randn(4, 4), torch.randn(2, 4), torch.randn(3, 4)]]
    assert _identical(run_spmd(gm, inputs), run_spmd(res.gm, inputs))


def test_compile_pattern_with_unpaired_resizes_is_left_alone():
    def unpaired(p, shard, x):
        torch.ops.inductor.resize_storage_bytes_(p, p.numel() * p.element_size())
        torch.ops.fsdp.copy_(p, torch.cat([shard, shard]))
        return [x @ p]  # never freed: the parameter stays alive past this graph

    import torch._inductor

    gm, _ = trace(unpaired, 1, [(4, 4), (2, 4), (3, 4)])
    res = remove_unsharded_param_usage(gm)
    assert res.counts == {"resize_pattern_mismatch": 1} and not res.changed


def test_user_mutation_of_an_unsharded_parameter_is_an_error():
    def mutating(p, shard, x):
        torch.ops.fsdp.copy_(p, torch.cat([shard, shard]))
        p.mul_(2)
        return [x @ p]

    gm, _ = trace(mutating, 1, [(4, 4), (2, 4), (3, 4)])
    with pytest.raises(GraphError, match="writes FSDP2 unsharded parameter"):
        remove_unsharded_param_usage(gm)


@pytest.mark.slow
@settings(max_examples=10, phases=(Phase.explicit, Phase.reuse, Phase.generate))  # each example traces FSDP2
@given(
    st.lists(st.integers(2, 12), min_size=2, max_size=4),
    st.sampled_from([2, 4]),
    st.booleans(),
    st.integers(0, 2**16),
)
def test_fsdp_passes_on_random_fully_shard_models(dims, world, mixed_precision, seed):
    """Random widths (odd ones make FSDP2 pad shards), world sizes and mixed precision: every pass leaves a valid
    graph (lint, IR validation) with the same outputs, and every matmul depends on an all_gather."""
    from torch.distributed.device_mesh import init_device_mesh

    from commsched.rewrites.fsdp_trace import fsdp2_passes

    dims = [16, *dims]
    with fake_process_group(world):
        mesh = init_device_mesh("cpu", (world,))
        model = shard_mlp(tiny_mlp(dims, seed=seed), mesh, mixed_precision=mixed_precision)
        gm = trace_fsdp2_step(model, _loss, torch.randn(3, 16))
        relinked = remove_unsharded_param_usage(functionalize_c10d(gm).gm).gm
        final = fsdp2_passes(gm)
        final.graph.lint()
        graph = from_fx(final).validate()
    n, linked = _weight_readers_with_all_gather_ancestor(graph)
    # per layer a forward and two backward matmuls (none for the input's gradient): all read gathered weights
    assert n >= 3 * (len(dims) - 1) - 1 and linked == n
    gen = torch.Generator().manual_seed(seed)
    inputs = [[torch.randn(3, 16, generator=gen)] for _ in range(world)]
    assert _identical(run_spmd(relinked, inputs), run_spmd(final, inputs))


def test_tracing_needs_two_ranks():
    from torch.distributed.device_mesh import init_device_mesh

    with fake_process_group(1):
        model = shard_mlp(tiny_mlp(), init_device_mesh("cpu", (1,)))
        with pytest.raises(ValueError, match=">= 2 ranks"):
            trace_fsdp2_step(model, _loss, torch.randn(4, 16))


def test_trace_fsdp2_is_the_public_way_in_for_a_fully_shard_step():
    """Issue #36 item 13, README's FSDP2 example: ``commsched.trace_fsdp2`` gives a program ``from_fx`` imports with
    every collective and every matmul linked to its all_gather, and ``optimize`` takes."""
    import torch.nn as nn
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.fsdp import fully_shard

    import commsched

    with commsched.fake_process_group(world_size=8):
        model = nn.Sequential(nn.Linear(1024, 4096), nn.GELU(), nn.Linear(4096, 1024))
        mesh = init_device_mesh("cpu", (8,))
        for layer in model[::2]:
            fully_shard(layer, mesh=mesh)  # one FSDP2 unit per Linear, then the root
        fully_shard(model, mesh=mesh)
        gm = commsched.trace_fsdp2(model, lambda m, x: m(x).pow(2).mean(), torch.randn(64, 1024))
        g = commsched.from_fx(gm)  # functional collectives, weights read from their all_gathers
        opt = commsched.optimize(gm, "h100-sxm")  # or simulate / schedule g, apply_schedule(gm, ...)
    types = [CollType(int(g.coll_type[c])) for c in g.collectives.tolist()]
    # forward gathers both Linears; backward re-gathers the first (the root keeps the last one gathered)
    assert (types.count(CollType.ALL_GATHER), types.count(CollType.REDUCE_SCATTER)) == (4, 2)
    n, linked = _weight_readers_with_all_gather_ancestor(g)
    assert n == 5 and linked == n  # 2 forward, 3 backward matmuls (no input gradient for the first)
    assert opt.after.makespan_s <= opt.before.makespan_s and len(opt.graph.collectives) >= 1


def test_from_fx_on_a_fully_shard_step_traced_as_is_names_trace_fsdp2():
    """``make_fx`` of a ``fully_shard`` step alone said "run FakeTensorProp first", which is not the fix; with the
    process-group constants given a value it imported with no collective at all (a wrong step time)."""
    from torch.distributed.device_mesh import init_device_mesh
    from torch.fx.experimental.proxy_tensor import make_fx

    with fake_process_group(2):
        model = shard_mlp(tiny_mlp(), init_device_mesh("cpu", (2,)))

        def step(x):
            loss = _loss(model, x)
            loss.backward()
            return [loss, *[p.grad for p in model.parameters()]]

        gm = make_fx(step)(torch.randn(4, 16))
        with pytest.raises(GraphError, match=r"FX node 'all_gather_copy_in' .*commsched\.trace_fsdp2\(model, loss_fn"):
            from_fx(gm)
        for node in gm.graph.nodes:  # what running FakeTensorProp leaves: the constants hold no tensor
            node.meta.setdefault("val", None)
        with pytest.raises(GraphError, match=r"FSDP2 \(fully_shard\).*commsched\.trace_fsdp2"):
            from_fx(gm)

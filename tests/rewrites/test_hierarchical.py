"""Hierarchical all_reduce (issue 18 c): the three-collective program computes the same function on every rank."""

from __future__ import annotations

import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from random_programs import trace

from commsched.frontends.fx import from_fx
from commsched.rewrites.spmd import run_spmd

c10d = torch.ops._c10d_functional


@settings(max_examples=10, deadline=None)
@given(
    per_node=st.sampled_from([2, 4]),
    nodes=st.sampled_from([2, 3]),
    rows=st.integers(1, 4),
    cols=st.integers(1, 3),
    op=st.sampled_from(["sum", "avg", "max"]),
    seed=st.integers(0, 2**16),
)
def test_hierarchical_all_reduce_computes_the_same_function(per_node, nodes, rows, cols, op, seed):
    """all_reduce -> reduce_scatter in the node, all_reduce across nodes, all_gather in the node: the same result
    on every rank (sub-groups built from the group's blocks), to float64 rounding (sums are reassociated)."""
    from commsched.hardware import get
    from commsched.rewrites.hierarchical import (
        find_hierarchical_sites,
        hierarchical_all_reduce,
        sub_group_blocks,
        sub_groups,
    )

    world = per_node * nodes
    shape = (rows * per_node, cols)

    def fn(x):
        y = c10d.wait_tensor(c10d.all_reduce(torch.sin(x), op, "0"))
        return [y * 2]

    gm, g = trace(fn, world, [shape])
    hw = get("h100-sxm", num_nodes=nodes, gpus_per_node=per_node)
    sites = find_hierarchical_sites(g, hw)
    assert [(grp, per) for _, grp, per in sites] == [("0", per_node)]
    res = hierarchical_all_reduce(gm, sites)
    sizes = {**g.group_sizes(), **sub_groups("0", world, 1, per_node)}
    g2 = from_fx(res.gm, group_sizes=sizes)
    g2.validate()
    assert len(g2.collectives) == 3
    blocks = sub_group_blocks([list(range(world))], per_node, "0")
    assert blocks["0:inter"][0] == list(range(0, world, per_node))
    gen = torch.Generator().manual_seed(seed)
    inputs = [[torch.randn(*shape, generator=gen, dtype=torch.float64)] for _ in range(world)]
    before, after = run_spmd(gm, inputs), run_spmd(res.gm, inputs, groups=blocks)
    for r in range(world):
        torch.testing.assert_close(before[r][0], after[r][0], rtol=1e-12, atol=1e-12)

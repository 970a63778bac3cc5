"""Decomposed TP collectives on torch's own tensor parallelism: an MLP parallelised with DTensor
(``ColwiseParallel`` / ``RowwiseParallel``, with and without sequence parallelism), compiled through AOTAutograd on a
fake process group. The sites are found in the forward and backward graphs torch emits, and every split computes the
same function (each rank's real tensors, every rank in one process)."""

from __future__ import annotations

import pytest
import torch
import torch.nn as nn

from commsched.frontends.fake_pg import fake_process_group
from commsched.frontends.fx import from_fx
from commsched.rewrites.decompose_tp import TPSplit, decompose_tp, find_tp_sites
from commsched.rewrites.spmd import run_spmd

WORLD = 4


class _MLP(nn.Module):
    """Llama's MLP: down(relu(up(x)) * gate(x))."""

    def __init__(self, dim: int = 16, hidden: int = 32):
        super().__init__()
        self.up = nn.Linear(dim, hidden, bias=False)
        self.gate = nn.Linear(dim, hidden, bias=False)
        self.down = nn.Linear(hidden, dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.down(torch.relu(self.up(x)) * self.gate(x))


def _dtensor_graphs(sp: bool) -> list[torch.fx.GraphModule]:
    """The forward and backward graphs AOTAutograd gives for one training step of the DTensor-parallel MLP."""
    from functorch.compile import make_boxed_func
    from torch._functorch.aot_autograd import aot_module_simplified
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Shard
    from torch.distributed.tensor.parallel import ColwiseParallel, RowwiseParallel, parallelize_module

    graphs: list[torch.fx.GraphModule] = []

    def keep(gm, _inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    def backend(gm, example_inputs):
        return aot_module_simplified(gm, example_inputs, fw_compiler=keep, bw_compiler=keep)

    if sp:  # sequence parallel: activations sharded on rows between the blocks
        plan = {"up": ColwiseParallel(input_layouts=Shard(0)), "gate": ColwiseParallel(input_layouts=Shard(0)),
                "down": RowwiseParallel(output_layouts=Shard(0))}  # fmt: skip
    else:
        plan = {"up": ColwiseParallel(), "gate": ColwiseParallel(), "down": RowwiseParallel()}
    torch._dynamo.reset()
    try:
        with fake_process_group(WORLD):
            mesh = init_device_mesh("cpu", (WORLD,))
            model = parallelize_module(_MLP().double(), mesh, plan)
            x = torch.randn(8, 16, dtype=torch.float64, requires_grad=True)
            torch.compile(model, backend=backend, fullgraph=True)(x).sum().backward()
    finally:
        torch._dynamo.reset()
    return graphs


@pytest.mark.parametrize(("sp", "patterns"), [(False, {"mm_ar"}), (True, {"ag_mm", "mm_rs"})])
def test_sites_on_dtensor_graphs_split_to_the_same_function(sp, patterns):
    graphs = _dtensor_graphs(sp)
    assert len(graphs) == 2  # forward, backward
    found = set()
    for gm in graphs:
        sites = find_tp_sites(gm)
        assert sites, f"no TP site in torch's {'backward' if found else 'forward'} graph"
        found |= {s.pattern for s in sites}
        g = from_fx(gm, group_sizes={s.group: WORLD for s in sites})
        gen = torch.Generator().manual_seed(0)
        inputs = [[torch.randn(*p.meta["val"].shape, generator=gen, dtype=torch.float64)
                   for p in gm.graph.find_nodes(op="placeholder")] for _ in range(WORLD)]  # fmt: skip
        before = run_spmd(gm, inputs)
        for dim in ("m", "n"):
            splits = [TPSplit(s.collective, "m" if s.pattern == "ag_mm" else dim, 2) for s in sites]
            res = decompose_tp(gm, splits, graph=g)
            g2 = from_fx(res.gm, group_sizes=g.group_sizes())
            g2.validate()
            assert len(g2.collectives) == len(g.collectives) + len(sites)
            after = run_spmd(res.gm, inputs)
            for r in range(WORLD):
                for a, b in zip(before[r], after[r], strict=True):
                    if isinstance(a, torch.Tensor):
                        torch.testing.assert_close(a, b, rtol=1e-10, atol=1e-10)
    assert found == patterns

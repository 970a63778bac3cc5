"""Async TP with symmetric memory (commsched.rewrites.async_tp): the rewrite keeps every data dependency of the
program (random TP+SP layers), decomposes each site per peer as torch's fused ops do, its copy-engine transfers do
not slow compute while NCCL's do, the fused zoo step is never slower than the plain one, and predict refuses it in
one line where it cannot run."""

from __future__ import annotations

import dataclasses
import functools

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st
from random_programs import trace

from commsched.cost.model import CostEstimate
from commsched.cost.symm_mem import COPY_ENGINE_PROFILES, COPY_ENGINE_TARGET, JOIN_TARGET
from commsched.ir import CollType, GraphBuilder, OpKind
from commsched.rewrites.async_tp import SYMM_MEM_SUFFIX, async_tp_graph, async_tp_sites

c10d = torch.ops._c10d_functional


def _sp_layer(world: int, readers: int, side_reader: bool, extra_wait: bool):
    """A TP+SP block as the zoo traces it: all_gather -> ``readers`` column-parallel mms -> one row-parallel mm ->
    reduce_scatter; ``side_reader``: a weight gradient's transpose of the gathered input; ``extra_wait``: a user
    program's second wait on each result."""

    def wait(t):
        t = c10d.wait_tensor(t)
        return c10d.wait_tensor(t) if extra_wait else t

    def fn(x, *ws):
        h = wait(c10d.all_gather_into_tensor(x, world, "0"))
        parts = [torch.mm(h, w) for w in ws[:readers]]
        y = torch.mm(functools.reduce(torch.mul, parts), ws[readers])
        out = wait(c10d.reduce_scatter_tensor(y, "sum", world, "0"))
        return [out * 1, *([h.t() * 1] if side_reader else [])]

    return fn


def _ancestors(g, names: set[str]) -> dict[str, frozenset[str]]:
    """For every node named in ``names``: the names in ``names`` it depends on (data and ordering edges)."""
    ptr, idx = g.predecessors_csr()
    out: dict[int, frozenset[str]] = {}
    for v in range(len(g)):  # ids are topological
        acc: set[str] = set()
        for u in idx[ptr[v] : ptr[v + 1]].tolist():
            acc |= out[u]
            if g.names[u] in names:
                acc.add(g.names[u])
        out[v] = frozenset(acc)
    return {g.names[v]: out[v] for v in range(len(g)) if g.names[v] in names}


@settings(max_examples=25, deadline=None)
@given(
    world=st.sampled_from([2, 4, 8]),
    rows=st.integers(1, 3),
    k_dim=st.integers(1, 6),
    hidden=st.integers(1, 5),
    readers=st.integers(1, 3),
    side_reader=st.booleans(),
    extra_wait=st.booleans(),
)
def test_the_rewrite_keeps_every_data_dependency(world, rows, k_dim, hidden, readers, side_reader, extra_wait):
    """Every node the rewrite keeps depends on exactly the kept nodes it depended on (the fused ops compute the same
    functions of the same inputs); each site becomes ``W - 1`` transfers on the copy engines' group and ``W``
    partial matmuls per matmul, one ``sum`` per reduce_scatter; no NCCL collective is left."""
    shapes = [(rows, k_dim), *[(k_dim, hidden)] * readers, (hidden, k_dim * world)]
    gm, g = trace(_sp_layer(world, readers, side_reader, extra_wait), world, shapes)
    sites = async_tp_sites(gm, "0")
    assert [s.pattern for s in sites] == ["ag_mm", "mm_rs"]
    new = async_tp_graph(g, sites).graph
    new.validate()
    kept = set(g.names) & set(new.names)
    assert _ancestors(g, kept) == _ancestors(new, kept)
    colls = new.collectives.tolist()
    assert all(new.targets[c] == COPY_ENGINE_TARGET for c in colls) and len(colls) == 2 * (world - 1)
    assert {new.groups[new.coll_group[c]].name for c in colls} == {"0" + SYMM_MEM_SUFFIX}
    mms = sum(t == "aten.mm.default" for t in new.targets)
    assert mms == world * (readers + 1) and sum(t == "aten.sum.dim_IntList" for t in new.targets) == 1
    assert sum(t == JOIN_TARGET for t in new.targets) == readers + 1 + side_reader
    assert int((new.wait_of >= 0).sum()) == len(colls)


def _race(copy_engine: bool) -> int:
    """End of a 100 us kernel that runs beside a 100 us transfer, with compute slowed 2x by collectives that take
    SMs."""
    b = GraphBuilder()
    grp = b.group("tp", 2)
    x = b.add_node("x", "placeholder", OpKind.INPUT, buffers=[((256,), "bfloat16", 512, None)])
    c = b.add_node("copy", COPY_ENGINE_TARGET, OpKind.COLLECTIVE, [x], side_effect=True,
                   buffers=[((256,), "bfloat16", 512, None)])  # fmt: skip
    b.set_collective(c, CollType.BROADCAST, grp, None, 512, 512)
    k = b.add_node("kernel", "aten.sin.default", OpKind.OTHER, [x], buffers=[((256,), "bfloat16", 512, None)])
    w = b.add_node("wait", "_c10d_functional.wait_tensor.default", OpKind.WAIT, [c], side_effect=True,
                   buffers=[((256,), "bfloat16", 512, c)])  # fmt: skip
    b.set_wait(w, c)
    b.add_node("output", "output", OpKind.OUTPUT, [k, w])
    g = b.build()
    from commsched.sim import simulate_costs

    node_s = np.where(np.isin(np.arange(len(g)), [c, k]), 100e-6, 0.0)
    costs = CostEstimate(node_s=node_s, coll_latency_s=np.zeros(len(g)),
                         coll_link=np.where(g.coll_type >= 0, 1, -1).astype(np.int8), compute_slowdown=2.0,
                         copy_engine=(np.arange(len(g)) == c) if copy_engine else None)  # fmt: skip
    return int(simulate_costs(g, costs, [x, c, k, w, len(g) - 1]).end_ns[k])


def test_copy_engine_transfers_do_not_slow_compute():
    """The one rule (sim.model.takes_sms): beside an NCCL transfer the kernel runs at half speed until it ends; beside
    a copy-engine transfer it takes its own 100 us."""
    assert _race(copy_engine=True) == 100_000
    assert _race(copy_engine=False) == 150_000  # 50 us of work in the first 100 us, then 50 us alone


# ---------------------------------------------------------------- the zoo step through predict
@functools.cache
def _predicted(parallel: str, tp_size: int, async_tp: bool, hardware: str = "h100-sxm"):
    from commsched.experiments.predict import StepConfig, predict_workload

    cfg = StepConfig(preset="llama3-8b", parallel=parallel, world_size=8, layers=1, seq_len=8192, batch=1,
                     tp_size=tp_size, compile=True, async_tp=async_tp)  # fmt: skip
    plain = dataclasses.replace(cfg, async_tp=False)
    return predict_workload(_traced(plain), cfg, hardware)


@functools.cache
def _traced(cfg):
    from commsched.experiments.predict import trace

    return trace(cfg)


@pytest.mark.parametrize(("parallel", "tp_size"), [("tp+sp", 8), ("fsdp+tp+sp", 4)])
def test_the_fused_zoo_step_is_never_slower(parallel, tp_size):
    """llama3-8b at 8 ranks (TP 8, and FSDP 2 x TP 4), one block of 8192 tokens, compiled, on h100-sxm: the six
    block sites (two gathers and two reduce_scatters forward, the two row-parallel gradient gathers backward) are
    fused, and the simulated step is no slower (and its exposed communication less) than the plain one."""
    plain, fused = _predicted(parallel, tp_size, False), _predicted(parallel, tp_size, True)
    g = fused.sim.graph
    assert g.meta["async_tp"]["sites"] == 6
    ce = [c for c in g.collectives.tolist() if g.targets[c] == COPY_ENGINE_TARGET]
    assert len(ce) == 6 * (tp_size - 1)
    assert fused.step_s <= plain.step_s and fused.sim.exposed_comm_s < plain.sim.exposed_comm_s
    assert "async TP (6 fused sites)" in fused.configuration_line()
    print(f"{parallel}: plain {plain.step_s * 1e3:.3f} ms, async TP {fused.step_s * 1e3:.3f} ms "
          f"({(1 - fused.step_s / plain.step_s) * 100:.1f} % faster)")  # fmt: skip


@pytest.mark.parametrize("hardware", ["mi300x", "cpu-local"])
def test_async_tp_is_refused_where_symmetric_memory_copies_cannot_run(hardware):
    """AMD (no NVLink symmetric memory numbers) and a CPU: one line naming the profile."""
    with pytest.raises(ValueError) as exc:
        _predicted("tp+sp", 8, True, hardware)
    msg = str(exc.value)
    assert "\n" not in msg and "async TP" in msg and hardware in msg, msg
    assert hardware not in COPY_ENGINE_PROFILES


def test_cli_async_tp_option_and_its_refusals():
    """``predict --async-tp`` reaches the step; without --compile, without TP or on a profile without symmetric-
    memory copies it is one line (exit 2) before any trace."""
    from typer.testing import CliRunner

    from commsched.cli import app

    runner = CliRunner()
    base = ["predict", "llama3-8b", "-w", "8", "--layers", "1", "--async-tp"]
    for args, words in (
        ([*base, "-p", "tp+sp"], ["needs torch.compile", "--compile"]),
        ([*base, "-p", "fsdp", "--compile"], ["needs tensor parallelism", "fsdp"]),
        ([*base, "-p", "tp+sp", "--compile", "-H", "mi300x"], ["async TP", "mi300x", "symmetric-memory"]),
    ):
        res = runner.invoke(app, args)
        lines = [line for line in res.stderr.splitlines() if line.strip()]
        assert res.exit_code == 2 and len(lines) == 1 and all(w in lines[0] for w in words), (args, res.output)

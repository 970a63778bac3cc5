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


def _fused_layer(fn, world: int, rows: int, k_dim: int, hidden: int, readers: int):
    """(the traced IR of layer ``fn``, its async-TP rewrite), checked: its two sites (the gather's ``readers``
    matmuls) found, the rewrite valid, every kept node depending on exactly the kept nodes it depended on, and
    ``W - 1`` copy-engine transfers per site, nothing else on a comm stream."""
    shapes = [(rows, k_dim), *[(k_dim, hidden)] * readers, (hidden, k_dim * world)]
    gm, g = trace(fn, world, shapes)
    sites = async_tp_sites(gm, "0")
    assert [s.pattern for s in sites] == ["ag_mm", "mm_rs"] and len(sites[0].matmuls) == readers
    new = async_tp_graph(g, sites).graph
    new.validate()
    kept = set(g.names) & set(new.names)
    assert _ancestors(g, kept) == _ancestors(new, kept)
    colls = new.collectives.tolist()
    assert all(new.targets[c] == COPY_ENGINE_TARGET for c in colls) and len(colls) == 2 * (world - 1)
    return g, new


LAYERS = {
    "world": st.sampled_from([2, 4, 8]),
    "rows": st.integers(1, 3),
    "k_dim": st.integers(1, 6),
    "hidden": st.integers(1, 5),
    "readers": st.integers(1, 3),
    "side_reader": st.booleans(),
}
"""the random TP+SP layers' dimensions: ranks, rows per rank, features, column-parallel readers, a side reader"""


@settings(max_examples=25, deadline=None)
@given(**LAYERS, extra_wait=st.booleans())
def test_the_rewrite_keeps_every_data_dependency(world, rows, k_dim, hidden, readers, side_reader, extra_wait):
    """Every node the rewrite keeps depends on exactly the kept nodes it depended on (the fused ops compute the same
    functions of the same inputs); each site becomes ``W - 1`` transfers on the copy engines' group and ``W``
    partial matmuls per matmul, one ``sum`` per reduce_scatter; no NCCL collective is left."""
    new = _fused_layer(_sp_layer(world, readers, side_reader, extra_wait), world, rows, k_dim, hidden, readers)[1]
    colls = new.collectives.tolist()
    assert {new.groups[new.coll_group[c]].name for c in colls} == {"0" + SYMM_MEM_SUFFIX}
    mms = sum(t == "aten.mm.default" for t in new.targets)
    assert mms == world * (readers + 1) and sum(t == "aten.sum.dim_IntList" for t in new.targets) == 1
    assert sum(t == JOIN_TARGET for t in new.targets) == readers + 1 + side_reader
    assert int((new.wait_of >= 0).sum()) == len(colls)


F8 = torch.float8_e4m3fn


def _scale(t, rowwise: bool, dim: int = -1):
    """A float8 scale of ``t`` as torchao's tensorwise (one) or rowwise (one per slice along ``dim``) recipe makes
    it."""
    amax = t.abs().amax(dim=dim, keepdim=True) if rowwise else t.abs().max()
    return (448.0 / amax.clamp(min=1e-12)).reciprocal()


def _scaled(a, w, scale_a):
    """``a @ w`` in float8; a rowwise ``scale_a`` with a rowwise weight scale (per column of ``w``)."""
    scale_b = _scale(w, scale_a.dim() == 2, dim=0)
    return torch._scaled_mm(a, w.to(F8), scale_a=scale_a, scale_b=scale_b, out_dtype=torch.float32)


def _float8_sp_layer(world: int, readers: int, side_reader: bool, rowwise: bool):
    """A float8 TP+SP block as torchao's float8 TP styles trace it: the input cast to float8, gathered as bytes and
    viewed back (then ``detach``), read by ``readers`` column-parallel ``_scaled_mm`` with one input scale; the
    row-parallel ``_scaled_mm`` (``rowwise``: a per-row input scale) reduce-scattered in high precision."""

    def fn(x, *ws):
        data = x.to(F8).view(torch.uint8)
        h = c10d.wait_tensor(c10d.all_gather_into_tensor(data, world, "0")).view(F8).detach()
        scale = _scale(x, False)
        parts = [_scaled(h, w, scale) for w in ws[:readers]]
        y = functools.reduce(torch.mul, parts)
        out = _scaled(y.to(F8), ws[readers], _scale(y, rowwise))
        out = c10d.wait_tensor(c10d.reduce_scatter_tensor(out, "sum", world, "0"))
        return [out * 1, *([h.t().float() * 1] if side_reader else [])]

    return fn


@settings(max_examples=20, deadline=None)
@given(**LAYERS, rowwise=st.booleans())
def test_the_float8_rewrite_keeps_every_data_dependency(world, rows, k_dim, hidden, readers, side_reader, rowwise):
    """As torch's ``fused_all_gather_scaled_matmul`` and ``fused_scaled_matmul_reduce_scatter``: the gather found
    through its dtype view, each site ``W - 1`` copy-engine transfers and ``W`` partial ``_scaled_mm`` per matmul
    with its weight and scales (a per-row input scale cut to the rows: one slice per partial), each shard viewed
    back as float8, the flops kept; every kept node depends on exactly the kept nodes it depended on."""
    layer = _float8_sp_layer(world, readers, side_reader, rowwise)
    g, new = _fused_layer(layer, world, rows, k_dim, hidden, readers)
    scaled = [v for v, t in enumerate(new.targets) if t == "aten._scaled_mm.default"]
    assert len(scaled) == world * (readers + 1) and "aten.mm.default" not in new.targets
    before = [v for v, t in enumerate(g.targets) if t == "aten._scaled_mm.default"]
    assert new.flops[scaled].sum() == pytest.approx(g.flops[before].sum())
    assert all(len(new.inputs(v)) == len(g.inputs(before[0])) for v in scaled)  # the weight and both scales
    views = [sum(t == "aten.view.dtype" for t in x.targets) for x in (g, new)]
    assert views[1] == views[0] - 1 + world  # the gathered bytes' view: one per shard instead
    scale_cuts = sum(new.targets[i] == "aten.slice.Tensor" for v in scaled for i in new.inputs(v)[1:].tolist())
    assert scale_cuts == (world if rowwise else 0)  # the reduce_scatter's partials: one row block each
    assert sum(t == JOIN_TARGET for t in new.targets) == readers + 1 + side_reader


def _refused(fn, world: int, shapes) -> list:
    gm, _ = trace(fn, world, shapes)
    return async_tp_sites(gm, "0")


def test_float8_sites_torch_would_not_fuse_are_left_alone():
    """micro_pipeline_tp's rules: no fusion where a matmul's scale depends on the gathered tensor, where an op
    other than the dtype view (a slice) stands between the gather and the matmul, where the gathered bytes have
    another reader besides their dtype view, or where the reduced ``_scaled_mm`` has another reader."""
    world = 2

    def gathered(x):
        return c10d.wait_tensor(c10d.all_gather_into_tensor(x.to(F8).view(torch.uint8), world, "0"))

    def scale_from_gather(x, w):
        h = gathered(x).view(F8)
        return [_scaled(h, w, _scale(h.float(), False))]

    def sliced(x, w):  # an op other than the dtype view between the gather and the matmul
        return [_scaled(gathered(x).view(F8)[1:], w, x.new_ones(()))]

    def bytes_read(x, w):
        b = gathered(x)
        return [_scaled(b.view(F8), w, x.new_ones(())), b.float()]

    def reduced_read(x, w):
        y = _scaled(x.to(F8), w, x.new_ones(()))
        return [c10d.wait_tensor(c10d.reduce_scatter_tensor(y, "sum", world, "0")), y * 1]

    def fused(x, w):  # the control: fused
        return [_scaled(gathered(x).view(F8), w, x.new_ones(()))]

    assert [s.pattern for s in _refused(fused, world, [(4, 3), (3, 5)])] == ["ag_mm"]
    for fn in (scale_from_gather, sliced, bytes_read, reduced_read):
        assert _refused(fn, world, [(4, 3), (3, 5)]) == [], fn.__name__


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
def _predicted(parallel: str, tp_size: int, async_tp: bool, hardware: str = "h100-sxm", float8: str = "none",
               layers: int = 1, ac: str = "none"):  # fmt: skip
    from commsched.experiments.predict import StepConfig, predict_workload

    cfg = StepConfig(preset="llama3-8b", parallel=parallel, world_size=8, layers=layers, seq_len=8192, batch=1,
                     tp_size=tp_size, compile=True, async_tp=async_tp, float8=float8, ac=ac)  # fmt: skip
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


def test_the_fused_float8_zoo_step_keeps_its_dependencies_and_is_never_slower():
    """llama3-8b TP+SP at 8 ranks, float8 tensorwise (torchao's float8 TP styles), two blocks of 8192 tokens,
    compiled, on h100-sxm: per block the six sites of the bf16 step, as ``_scaled_mm`` behind byte gathers (the two
    float8 input gathers and the two reduce_scatters forward, the two float8 output-gradient gathers backward);
    every node kept depends on the kept nodes it depended on; the step is no slower, its exposed communication
    less."""
    plain, fused = (_predicted("tp+sp", 8, a, float8="tensorwise", layers=2) for a in (False, True))
    g, before = fused.sim.graph, plain.sim.graph
    assert g.meta["async_tp"]["sites"] == 6 * 2 and "async TP (12 fused sites)" in fused.configuration_line()
    ce = [c for c in g.collectives.tolist() if g.targets[c] == COPY_ENGINE_TARGET]
    assert len(ce) == 12 * 7 and "aten.mm.default" not in {g.targets[int(g.inputs(c)[0])] for c in ce}
    scaled = [sum(t == "aten._scaled_mm.default" for t in x.targets) for x in (before, g)]
    assert scaled[1] - scaled[0] == (8 - 1) * (3 + 2 + 1 + 1 + 1 + 1) * 2  # each fused matmul: 8 partials
    kept = {n for n in set(before.names) & set(g.names) if "_scaled_mm" in n or "wait" in n}
    assert _ancestors(before, kept) == _ancestors(g, kept)
    assert fused.step_s <= plain.step_s and fused.sim.exposed_comm_s < plain.sim.exposed_comm_s
    print(f"float8 tp+sp: plain {plain.step_s * 1e3:.3f} ms, async TP {fused.step_s * 1e3:.3f} ms "
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


def test_a_recompute_s_matmuls_split_by_async_tp_keep_their_tag():
    """llama3-8b TP 8 + SP, one block, full AC, compiled: the recompute's gathers and reduce-scatters are fused too,
    and the matmuls they split into keep the recompute tag, so the step's recompute flops are the plain step's."""
    from commsched.report.summary import compute_shares

    plain = _predicted("tp+sp", 8, False, ac="full")
    fused = _predicted("tp+sp", 8, True, ac="full")
    before = compute_shares(plain.sim.graph)["recompute"]
    after = compute_shares(fused.sim.graph)["recompute"]
    assert before["flops"] > 0
    assert after["nodes"] > before["nodes"]  # split matmuls, each a node of its own
    assert after["flops"] == pytest.approx(before["flops"], rel=1e-9)

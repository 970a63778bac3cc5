"""torch.compile integration: the AOTAutograd backend schedules forward and backward graphs (fake process group:
capture + schedule; 2 gloo ranks: scheduled vs unscheduled bit-identical), and the Inductor post-grad pass; with
``optimize=True`` both run ``commsched.optimize`` (fewer collectives run, same numbers as eager on 2 gloo ranks)."""

from __future__ import annotations

import contextlib
import logging
import os
import tempfile
from collections import Counter
from pathlib import Path

import numpy as np
import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

import commsched
from commsched.io import free_port
from commsched.runtime import CommschedPostGradPass, commsched_backend
from programs import trace_program

DIM, LAYERS = 64, 3
# optimize's setting under which bucketing wins on this small step: on cpu-local (gloo's profile) the per-collective
# latency dominates 16 KiB gathers, and a bucketed gather holds every layer's weight at once (~1.3-1.6x the traced
# peak, over optimize's default 1.05x budget), so the budget is raised to let the simulator pick it
OPTIMIZE = {"optimize": True, "memory_budget": 2.0}


def fsdp_step(x, shards, group):
    """FSDP-style forward: each layer's weight all-gathered from its shard (the backward reduce-scatters)."""
    h = x
    for s in shards:
        w = fc.all_gather_tensor(s, 0, group).view(DIM, DIM)
        h = torch.tanh(h @ w.t())
    return h.pow(2).mean()


def _moved(schedule) -> int:
    return int(np.count_nonzero(schedule.order != np.arange(len(schedule.order))))


def _collectives_run(step) -> Counter[str]:
    """The ``_c10d_functional`` collectives (wait_tensor aside) that ``step()`` really runs, by op name (from the
    profiler: unlike a dispatch mode, it does not make dynamo fall back to eager)."""
    from torch.profiler import ProfilerActivity, profile

    with profile(activities=[ProfilerActivity.CPU]) as prof:
        step()
    names = [e.name.split("::")[1] for e in prof.events() if e.name.startswith("_c10d_functional::")]
    return Counter(n for n in names if n != "wait_tensor")


def _fx_collectives(graph: torch.fx.Graph) -> int:
    return sum(1 for n in graph.nodes if "_c10d_functional" in str(n.target) and "wait_tensor" not in str(n.target))


def _kept(opt) -> str:
    """The label of the one variant the search kept (and check there is exactly one)."""
    (kept,) = [t.label for t in opt.tried if t.verdict == "kept"]
    return kept


def test_backend_schedules_forward_and_backward_under_the_fake_process_group():
    seen = []
    torch._dynamo.reset()
    with commsched.fake_process_group(world_size=4) as pg:
        shards = [torch.randn(DIM * DIM // 4, requires_grad=True) for _ in range(LAYERS)]
        backend = commsched_backend("h100-sxm", on_schedule=lambda kind, s: seen.append((kind, s)))
        step = torch.compile(lambda x, ss: fsdp_step(x, ss, pg), backend=backend)
        loss = step(torch.randn(32, DIM), shards)
        loss.backward()
    kinds = {k: s for k, s in seen}
    assert set(kinds) == {"forward", "backward"}
    fwd, bwd = kinds["forward"], kinds["backward"]
    assert len(fwd.graph.collectives) == LAYERS and len(bwd.graph.collectives) == LAYERS  # gathers; reduce-scatters
    assert fwd.passes == ["overlap"] and _moved(fwd) > 0  # the forward was reordered: gathers prefetched
    assert all(s.grad is not None and s.grad.shape == s.shape for s in shards)


def test_backend_optimize_runs_the_bucketed_program_under_the_fake_process_group(caplog):
    """optimize=True: the collectives that run are the kept program's (one bucketed gather, one bucketed
    reduce-scatter instead of one per layer), and every graph's decision is kept and logged."""
    torch._dynamo.reset()
    seen = []
    with commsched.fake_process_group(world_size=4) as pg, caplog.at_level(logging.INFO, "commsched.runtime.compile"):
        shards = [torch.randn(DIM * DIM // 4, requires_grad=True) for _ in range(LAYERS)]
        backend = commsched_backend("cpu-local", on_schedule=lambda kind, s: seen.append(kind), **OPTIMIZE)
        step = torch.compile(lambda x, ss: fsdp_step(x, ss, pg), backend=backend)
        step(torch.randn(32, DIM), shards).backward()  # compiles both graphs
        ran = _collectives_run(lambda: step(torch.randn(32, DIM), shards).backward())
    assert ran == {"all_gather_into_tensor": 1, "reduce_scatter_tensor": 1}  # eager: LAYERS of each
    assert [kind for kind, _ in backend.results] == ["forward", "backward"] == seen
    for _kind, opt in backend.results:
        assert _kept(opt) == opt.label and opt.label.startswith("bucketed")
        assert len(opt.before.graph.collectives) == LAYERS and _fx_collectives(opt.gm.graph) == 1
        assert opt.summary() in caplog.text
    assert all(s.grad is not None and s.grad.shape == s.shape for s in shards)


def test_optimize_refuses_what_it_cannot_honour():
    with pytest.raises(ValueError, match="leave passes and costs"):
        commsched_backend("cpu-local", optimize=True, passes=["overlap"])
    with pytest.raises(TypeError, match="unknown option"):
        CommschedPostGradPass("cpu-local", optimize=True, overlap={"waits": "late"})


def test_post_grad_pass_reorders_a_graph_in_place():
    gm, _g = trace_program("fsdp_mlp", 4, layers=3, dim=128)
    p = CommschedPostGradPass("h100-sxm")
    with commsched.fake_process_group(world_size=4):
        p(gm.graph)  # what Inductor calls with its post-grad graph
    names = [n.name for n in gm.graph.nodes if n.op not in ("placeholder", "output")]
    sched = p.last
    assert _moved(sched) > 0
    assert names == [n for n in sched.names if n in set(names)]
    gm.graph.lint()
    assert p.uuid() == CommschedPostGradPass("h100-sxm").uuid()
    assert p.uuid() != CommschedPostGradPass("h100-sxm", num_nodes=2).uuid()
    assert p.uuid() != CommschedPostGradPass("h100-sxm", reorder_collectives=True).uuid()


def _aot_forward(world: int) -> torch.fx.GraphModule:
    """The forward ATen graph AOTAutograd makes of ``fsdp_step`` (what Inductor's post-grad passes see is like it)."""
    from functorch.compile import make_boxed_func
    from torch._dynamo.backends.common import aot_autograd

    graphs = []

    def keep(gm, _example_inputs):
        graphs.append(gm)
        return make_boxed_func(gm.forward)

    torch._dynamo.reset()
    with commsched.fake_process_group(world_size=world) as pg:
        shards = [torch.randn(DIM * DIM // world, requires_grad=True) for _ in range(LAYERS)]
        torch.compile(lambda x, ss: fsdp_step(x, ss, pg), backend=aot_autograd(fw_compiler=keep))(
            torch.randn(32, DIM), shards
        )
    return graphs[0]


def test_post_grad_pass_optimize_replaces_the_graph_in_place():
    gm = _aot_forward(4)
    graph, before = gm.graph, _fx_collectives(gm.graph)
    inputs = [n for n in graph.nodes if n.op == "placeholder"]
    output = graph.output_node()
    p = CommschedPostGradPass("cpu-local", **OPTIMIZE)
    with commsched.fake_process_group(world_size=4):
        p(graph)
        (opt,) = p.results
        assert _kept(opt) == opt.label and opt.label.startswith("bucketed")
        assert gm.graph is graph and graph.output_node() is output  # the same graph and output node, changed
        assert [n for n in graph.nodes if n.op == "placeholder"] == inputs
        assert _fx_collectives(graph) == _fx_collectives(opt.gm.graph) == 1 < before == LAYERS
        # Inductor decomposes split_with_sizes_copy before its post-grad passes and refuses it after: none is left
        gm.recompile()
        assert "split_with_sizes_copy" in opt.gm.code and "split_with_sizes_copy" not in gm.code
        graph.lint()
        args = [torch.randn(n.meta["val"].shape) for n in inputs]
        assert [t.shape for t in gm(*args)] == [t.shape for t in opt.gm(*args)]  # it runs, same signature
    assert p.last is opt.schedule and not p.refused
    assert p.uuid() != CommschedPostGradPass("cpu-local", memory_budget=2.0).uuid()  # the cache tells them apart


def test_post_grad_pass_only_schedules_a_graph_reading_its_module(caplog):
    """A get_attr resolves on the owning module, which the optimized copy is not: that graph is only scheduled."""
    gm, _g = trace_program("fsdp_mlp", 4, layers=3, dim=128)
    gm.register_buffer("scale", torch.ones(()))
    output = next(n for n in gm.graph.nodes if n.op == "output")
    with gm.graph.inserting_before(output):
        gm.graph.get_attr("scale").meta["val"] = torch.ones(())
    p = CommschedPostGradPass("cpu-local", optimize=True, memory_budget=2.0)
    with commsched.fake_process_group(world_size=4), caplog.at_level(logging.WARNING, "commsched.runtime.compile"):
        p(gm.graph)
    assert p.results == [] and len(p.refused) == 1 and "get_attr" in p.refused[0]
    assert "optimize refused" in caplog.text and p.last is not None and _moved(p.last) > 0  # scheduled instead
    assert _fx_collectives(gm.graph) == 6


@contextlib.contextmanager
def _gloo_rank(rank: int, world: int, port: int):
    """One gloo rank of the test step: yields its full weights and its input; after the block, a barrier (nobody
    tears down while a peer still talks: gloo aborts a rank whose peer closed first), then the teardown."""
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port))
    torch.set_num_threads(1)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        torch.manual_seed(0)
        full = [torch.randn(DIM, DIM) * 0.2 for _ in range(LAYERS)]
        yield full, torch.randn(32, DIM, generator=torch.Generator().manual_seed(rank))
        dist.barrier()
    finally:
        dist.destroy_process_group()


def _compiled_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    with _gloo_rank(rank, world, port) as (full, x):
        results, moved = {}, {}
        for mode in ("verified", "eager"):
            torch._dynamo.reset()
            shards = [w.reshape(-1).chunk(world)[rank].clone().requires_grad_(True) for w in full]
            step = fsdp_step
            if mode == "verified":  # runs the traced order next to ours and raises unless every bit matches
                record = lambda kind, s: moved.update({kind: _moved(s)})  # noqa: E731
                backend = commsched_backend("cpu-local", on_schedule=record, verify=True)
                step = torch.compile(fsdp_step, backend=backend)
            loss = step(x, shards, dist.group.WORLD)
            loss.backward()
            results[mode] = [loss.detach(), *[s.grad for s in shards]]
        torch.save({"results": results, "moved": moved}, Path(out_dir) / f"rank{rank}.pt")


def _run_gloo(worker, world: int) -> list[dict]:
    """Run ``worker(rank, world, port, out_dir)`` on ``world`` gloo ranks; each rank's saved ``rank{r}.pt``."""
    import torch.multiprocessing as mp

    with tempfile.TemporaryDirectory() as d:
        try:
            mp.start_processes(worker, args=(world, free_port(), d), nprocs=world, start_method="spawn")
        except mp.ProcessExitedException:
            # gloo can still abort a rank while tearing down ("terminate called without an active exception"),
            # after every rank saved its results; a failure before that leaves a file missing and fails below
            if not all((Path(d) / f"rank{r}.pt").exists() for r in range(world)):
                raise
        return [torch.load(Path(d) / f"rank{r}.pt", weights_only=True) for r in range(world)]


@pytest.mark.slow
def test_compiled_step_runs_on_two_gloo_ranks_and_scheduling_changes_no_bit():
    per_rank = _run_gloo(_compiled_worker, 2)
    for out in per_rank:
        res = out["results"]
        assert out["moved"]["forward"] > 0  # the verified graph really was reordered
        for a, b in zip(res["verified"], res["eager"], strict=True):
            torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)  # AOTAutograd's graph vs eager: same math


def _optimized_worker(rank: int, world: int, port: int, out_dir: str) -> None:
    """The FSDP step three ways: eager; the AOTAutograd backend with optimize (verify on: the traced graph runs
    next to the kept one at every call); Inductor with the optimizing post-grad pass."""
    with _gloo_rank(rank, world, port) as (full, x):
        results, kept = {}, {}
        for mode in ("backend", "inductor", "eager"):
            torch._dynamo.reset()
            shards = [w.reshape(-1).chunk(world)[rank].clone().requires_grad_(True) for w in full]
            post_grad = CommschedPostGradPass("cpu-local", **OPTIMIZE)
            backend = commsched_backend("cpu-local", verify=True, **OPTIMIZE) if mode == "backend" else "inductor"
            step = fsdp_step if mode == "eager" else torch.compile(fsdp_step, backend=backend)
            # no cache: a cached graph would skip the pass (its uuid is part of the key), leaving nothing to check
            with (
                torch._inductor.config.patch(post_grad_custom_post_pass=post_grad, fx_graph_cache=False),
                torch._functorch.config.patch(enable_autograd_cache=False),
            ):
                loss = step(x, shards, dist.group.WORLD)
                loss.backward()
            results[mode] = [loss.detach(), *[s.grad for s in shards]]
            opts = [o for _k, o in backend.results] if mode == "backend" else post_grad.results
            kept[mode] = [(_kept(o), len(o.before.graph.collectives), _fx_collectives(o.gm.graph)) for o in opts]
        torch.save({"results": results, "kept": kept}, Path(out_dir) / f"rank{rank}.pt")


@pytest.mark.slow
def test_optimized_step_on_two_gloo_ranks_runs_bucketed_and_matches_eager():
    per_rank = _run_gloo(_optimized_worker, 2)
    for out in per_rank:
        res, kept = out["results"], out["kept"]
        # forward and backward each: one bucketed collective where eager runs one per layer
        for mode in ("backend", "inductor"):
            assert len(kept[mode]) == 2, mode
            for label, traced, now in kept[mode]:
                assert label.startswith("bucketed") and (traced, now) == (LAYERS, 1), (mode, label)
        for mode in ("backend", "inductor"):
            for a, b in zip(res[mode], res["eager"], strict=True):
                # backend: the same ATen ops as eager, and a 2-rank bucketed reduce-scatter adds the same two
                # numbers per element (bit-identical here); Inductor's fused C++ kernels (vectorized tanh, the mean
                # summed in another order) differ from eager by a few float32 ulps (seen: 3e-8 on the loss, 3e-9 on
                # 1e-2 gradients), so a relative 1e-5 is far above rounding yet far below a wrong bucket (O(1e-2))
                torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7)
    assert per_rank[0]["kept"] == per_rank[1]["kept"]  # SPMD: every rank kept the same programs


def test_verify_raises_when_the_scheduled_graph_computes_other_bits():
    """verify=True must be able to fail: a graph drawing random numbers gives other bits on every run."""
    torch._dynamo.reset()
    noisy = torch.compile(lambda x: x + torch.rand_like(x), backend=commsched_backend("cpu-local", verify=True))
    with pytest.raises(RuntimeError, match="differs from the traced one"):
        noisy(torch.zeros(8))
    torch._dynamo.reset()
    same = torch.compile(lambda x: torch.tanh(x) * 2, backend=commsched_backend("cpu-local", verify=True))
    assert torch.equal(same(torch.ones(8)), torch.tanh(torch.ones(8)) * 2)


def test_verify_with_optimize_compares_the_bucketed_program_within_rounding():
    """Where optimize changed the program, verify still runs the traced graph next to the kept one and raises on a
    difference beyond rounding (here: a random number drawn on each run)."""
    torch._dynamo.reset()
    with commsched.fake_process_group(world_size=4) as pg:
        # with gradients: in the inference graph the gathered weights die early, so bucketing them costs memory
        shards = [torch.randn(DIM * DIM // 4, requires_grad=True) for _ in range(LAYERS)]
        backend = commsched_backend("cpu-local", verify=True, **OPTIMIZE)
        noisy = torch.compile(lambda x, ss: fsdp_step(x, ss, pg) + torch.rand(()), backend=backend)
        with pytest.raises(RuntimeError, match="optimized program differs from the traced one beyond rounding"):
            noisy(torch.randn(32, DIM), shards)
    ((kind, opt),) = backend.results
    assert kind == "forward" and opt.label.startswith("bucketed")


def test_post_grad_pass_on_inductor_cache_hits():
    """Issue 19.8: compiled twice, the second compile came from Inductor's cache and its pass's ``last`` was None
    with nothing saying why. Now ``scheduled`` counts the graphs the pass ran on (none on a hit, as documented),
    and ``cache=False`` makes Inductor compile afresh, so ``last`` holds a schedule after every compile."""
    from torch._inductor.utils import fresh_cache

    def step(x, w):
        return torch.relu(x @ w).sum(dim=0)

    x, w = torch.randn(32, 16), torch.randn(16, 8)

    def compile_twice(**options) -> list[CommschedPostGradPass]:
        passes = []
        for _ in range(2):
            torch._dynamo.reset()
            p = CommschedPostGradPass("cpu-local", **options)
            with (
                torch._inductor.config.patch(post_grad_custom_post_pass=p, fx_graph_cache=True),
                torch._functorch.config.patch(enable_autograd_cache=True),
            ):
                torch.testing.assert_close(torch.compile(step)(x, w), step(x, w))
            passes.append(p)
        return passes

    with fresh_cache():
        cached = compile_twice()
        fresh = compile_twice(cache=False)
    torch._dynamo.reset()
    assert cached[0].scheduled == 1 and cached[0].last is not None
    assert cached[1].scheduled == 0 and cached[1].last is None  # served from the cache: the pass never ran
    assert [p.scheduled for p in fresh] == [1, 1] and all(p.last is not None for p in fresh)
    assert fresh[0].uuid() is None and cached[0].uuid() == CommschedPostGradPass("cpu-local").uuid()
    assert fresh[1].last.names == cached[0].last.names  # the same graph, scheduled again

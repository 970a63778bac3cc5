"""Cross-rank alignment and collective trace import, with real gloo ranks (forked local processes)."""

from __future__ import annotations

import contextlib
import multiprocessing as mp
import os
import warnings

import numpy as np
import pytest

from commsched.cost import CostEstimate, align_across_ranks, median_across_ranks, table_from_chrome_trace
from commsched.io import free_port

WORLD = 3
pytestmark = pytest.mark.slow  # forks 3 gloo ranks and profiles one: ~8 s on 2 cores


def _run(rank: int, port: int, trace_path: str, queue) -> None:
    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        est = CostEstimate.from_times(np.array([rank, 10.0 - rank, 5.0]))
        aligned = align_across_ranks(est)
        # only rank 0 profiles (the profiler costs seconds per process on a small machine)
        profiler = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
        with profiler if rank == 0 else contextlib.nullcontext():
            x = torch.ones(1024 * WORLD)
            for _ in range(2):
                dist.all_reduce(x)
                out = torch.empty(1024 * WORLD * WORLD)
                dist.all_gather_into_tensor(out, x)
        if rank == 0:
            profiler.export_chrome_trace(trace_path)
        queue.put((rank, aligned.node_s.tolist(), aligned.meta.get("aligned_ranks")))
        dist.barrier()  # nobody tears down while a peer still talks (gloo aborts a rank whose peer closed first)
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def gloo_results(tmp_path_factory):
    trace = str(tmp_path_factory.mktemp("trace") / "trace.json")
    ctx = mp.get_context("fork")
    queue = ctx.Queue()
    port = free_port()
    procs = [ctx.Process(target=_run, args=(r, port, trace, queue)) for r in range(WORLD)]
    for p in procs:
        p.start()
    results = [queue.get(timeout=60) for _ in range(WORLD)]
    for p in procs:
        p.join(timeout=30)
        assert p.exitcode == 0
    return sorted(results), trace


def test_every_rank_gets_the_median(gloo_results):
    results, _ = gloo_results
    for _rank, node_s, aligned in results:
        assert node_s == [1.0, 9.0, 5.0] and aligned == WORLD


def test_collectives_from_a_gloo_trace(gloo_results):
    _, trace = gloo_results
    assert os.path.exists(trace)
    table = table_from_chrome_trace(trace)
    kinds = {(k, n, b) for k, n, b, _ in table.collectives}
    assert ("all_reduce", WORLD, 1024 * WORLD * 4) in kinds
    # all_gather in the nccl-tests convention: the whole gathered output
    assert ("all_gather", WORLD, 1024 * WORLD * WORLD * 4) in kinds
    assert all(t > 0 for *_, t in table.collectives)


def test_median_helpers():
    assert median_across_ranks([np.array([1.0, 4.0]), np.array([3.0, 2.0]), np.array([2.0, 9.0])]).tolist() == [2, 4]
    with pytest.raises(ValueError, match="different lengths"):
        median_across_ranks([np.zeros(2), np.zeros(3)])
    est = CostEstimate.from_times(np.ones(3))
    assert align_across_ranks(est) is est  # no process group in this process: nothing to align

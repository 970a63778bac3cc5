"""Replay the traces of 2 real profiled gloo ranks (made here, fresh each run): an async all_reduce whose
``work.wait()`` the profiler does not record, then a blocking one; the stored ``gloo_rank*.json.gz`` were made by
the same program with a 16x smaller async all_reduce (here 1 MB, so that the wait is sure to be recorded even when
the machine is loaded and the matmul it overlaps runs slow)."""

from __future__ import annotations

import warnings
from pathlib import Path

import numpy as np
import pytest
from replay_helpers import assert_replay_valid

from commsched.replay.kineto import read_trace
from commsched.replay.run import replay, replay_traces
from commsched.replay.whatif import Scale
from commsched.replay.work import COMM
from gloo_ranks import run_forked_ranks

WORLD = 2


def program(rank: int, port: int, folder: str) -> None:
    """One rank: 2 iterations of matmul + relu (labelled "forward"), an async all_reduce (of 16 copies of the result),
    a matmul + tanh while it runs, its wait, a blocking all_reduce; the profiler's trace to
    ``folder/rank{rank}.json``."""
    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore")
    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=WORLD)
    try:
        w, x = torch.randn(256, 256), torch.randn(64, 256)
        prof = torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CPU], record_shapes=True)
        with prof:
            for _ in range(2):
                with torch.profiler.record_function("forward"):
                    y = torch.relu(x @ w) @ w
                work = dist.all_reduce(torch.cat([y] * 16), async_op=True)  # 1 MB: outlasts the matmul
                z = torch.tanh(x @ w)
                work.wait()
                dist.all_reduce(z)
        prof.export_chrome_trace(f"{folder}/rank{rank}.json")
        dist.barrier()
    finally:
        dist.destroy_process_group()


@pytest.fixture(scope="module")
def traces(tmp_path_factory) -> list[Path]:
    folder = tmp_path_factory.mktemp("gloo")
    run_forked_ranks(program, WORLD, str(folder))
    return [folder / f"rank{r}.json" for r in range(WORLD)]


@pytest.mark.slow
def test_live_gloo_ranks_replay_within_5_percent(traces):
    mr = replay_traces(traces)
    assert mr.aligned_collectives == 4 and sum(mr.last_arrivals.values()) == 4
    for r in mr.reports:
        t = r.trace
        assert t.mode == "cpu" and abs(r.error) < 0.05
        assert_replay_valid(t, r.sim, t.dur_ns)
        comm = np.flatnonzero(t.role == COMM)
        assert len(comm) == 4 and all(t.names[i] == "gloo:all_reduce" for i in comm)
        assert len(t.collectives) == 4 and {c.kind for c in t.collectives.values()} == {"all_reduce"}
        assert {"forward"} <= set(t.labels)
        # gloo's worker threads run the collectives; the step's thread issues them
        assert len({t.stream[i] for i in comm} & {t.stream[i] for i, n in enumerate(t.names) if "aten::mm" in n}) == 0


@pytest.mark.slow
def test_live_gloo_waits_follow_the_collectives(traces):
    """The step's thread idles in unrecorded waits; the replay links them to the collectives they waited for, so a
    slower collective delays the step and a free one shortens it."""
    t = read_trace(traces[0])
    assert t.inferred_edges >= 1
    base, slow, free = (replay(t, [Scale("comm", "", f)]) for f in (1.0, 3.0, 0.0))
    assert slow.replayed.step_s > base.replayed.step_s >= free.replayed.step_s

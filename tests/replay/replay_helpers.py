"""The invariant every replay keeps, and the stored traces the tests replay."""

from __future__ import annotations

from pathlib import Path

import numpy as np

from commsched.replay.work import ReplayTrace
from commsched.sim.result import SimResult

DATA = Path(__file__).parent / "data"
NCCL_TRACE = Path(__file__).parents[1] / "cost" / "data" / "kineto" / "hta_nccl_data.json.gz"
STORED = [*sorted(DATA.glob("*.json.gz")), NCCL_TRACE]


def assert_replay_valid(trace: ReplayTrace, sim: SimResult, dur_ns: np.ndarray) -> None:
    """Every item runs for its duration, after each dependency has ended, and after the previous item of its
    stream; and nothing starts before time 0."""
    start, end = sim.start_ns, sim.end_ns
    assert np.array_equal(end - start, dur_ns), "an item did not run for its duration"
    assert start.min(initial=0) >= 0
    src, dst = trace.edges[:, 0], trace.edges[:, 1]
    bad = np.flatnonzero(start[dst] < end[src])
    first = f"{trace.names[src[bad[0]]]} -> {trace.names[dst[bad[0]]]}" if len(bad) else ""
    assert not len(bad), f"{len(bad)} dependencies broken, e.g. {first}"
    for s in range(len(trace.streams)):
        ids = np.flatnonzero(trace.stream == s)  # in the trace's (topological) order = the stream's program order
        assert np.all(start[ids[1:]] >= end[ids[:-1]]), f"stream {trace.streams[s]} ran two items at once"

"""The interference probe's inversion (times made by the two-way slowdown model give back its factors), and the
niced compute thread that makes a CPU run share its cores the way that model describes."""

from __future__ import annotations

import pytest


@pytest.mark.parametrize(
    ("times", "factors"),
    [
        # comm 100, compute 50 slowed 1.5x ends at 75; comm at half speed meanwhile (37.5 done), the rest by 137.5
        ((100.0, 50.0, 75.0, 137.5), (1.5, 2.0)),
        # compute outlasts comm (150 vs 100, 1.2x while comm runs): both end at 166.67, and g cannot be seen
        ((100.0, 150.0, 500.0 / 3.0, 500.0 / 3.0), (1.2, None)),
        # no overlap at all: the serial sum
        ((100.0, 50.0, 50.0, 150.0), (1.0, 4.0)),
    ],
)
def test_interference_factors_invert_the_model(times, factors):
    from commsched.runtime.measure import interference_factors

    assert interference_factors(*times) == pytest.approx(factors)


def test_niced_compute_thread_lowers_only_this_thread_and_restores_it():
    import os
    import sys
    import threading

    from commsched.runtime.executor import niced_compute_thread

    if not sys.platform.startswith("linux"):
        pytest.skip("niceness is per thread only on Linux; elsewhere the context does nothing")
    started, stop = threading.Event(), threading.Event()
    other: list[int] = []
    seen: dict[str, object] = {}

    def comm_thread() -> None:  # stands for a gloo worker: started before, must keep its priority
        other.append(threading.get_native_id())
        started.set()
        stop.wait()

    def compute_thread() -> None:  # a throwaway thread: pytest's own thread is never niced
        me = threading.get_native_id()
        before = os.getpriority(os.PRIO_PROCESS, me)
        seen["before_other"] = os.getpriority(os.PRIO_PROCESS, other[0])
        with niced_compute_thread(0):  # 0: untouched
            seen["zero"] = os.getpriority(os.PRIO_PROCESS, me) == before
        with niced_compute_thread(5):
            seen["inside"] = os.getpriority(os.PRIO_PROCESS, me) - before
            seen["other_inside"] = os.getpriority(os.PRIO_PROCESS, other[0])
        seen["after"] = os.getpriority(os.PRIO_PROCESS, me)
        try:  # can this thread lower its niceness at all (CAP_SYS_NICE)? only then must the block restore it
            os.setpriority(os.PRIO_PROCESS, me, before + 1)
            os.setpriority(os.PRIO_PROCESS, me, before)
            seen["can_lower"] = True
        except PermissionError:
            seen["can_lower"] = False
        seen["before"] = before

    t = threading.Thread(target=comm_thread)
    t.start()
    started.wait()
    try:
        worker = threading.Thread(target=compute_thread)
        worker.start()
        worker.join()
    finally:
        stop.set()
        t.join()
    assert seen["zero"]
    assert seen["inside"] == min(19, seen["before"] + 5) - seen["before"]
    assert seen["other_inside"] == seen["before_other"]
    if seen["can_lower"]:
        assert seen["after"] == seen["before"]


def test_replay_records_only_ops_that_leave_their_arguments_alone():
    import torch

    from commsched.runtime.measure import _mutates

    assert _mutates(torch.ops.aten.add_.Tensor) and _mutates(torch.ops.aten.copy_.default)
    assert not _mutates(torch.ops.aten.add.Tensor) and not _mutates(torch.ops.aten.mm.default)
    assert not _mutates(len)  # not an ATen op: nothing to tell, recorded like any call


def test_step_comm_s_sums_every_collective_of_a_traced_step_by_its_key():
    from commsched.runtime.measure import collective_key, collective_keys, step_comm_s
    from commsched.workloads import build

    graph = build("llama-tiny", parallel="fsdp", world_size=2, dtype="float32").graph
    keys = collective_keys(graph)
    assert len(keys) < len(graph.collectives)  # the step repeats shapes: one calibration row serves several nodes
    rows = [(k, s, b, 1e-3 * (i + 1)) for i, (k, s, b) in enumerate(sorted(keys))]
    per_key = {(k, s, b): t for k, s, b, t in rows}
    expected = sum(per_key[collective_key(graph, c)] for c in graph.collectives.tolist())
    assert step_comm_s(graph, rows) == pytest.approx(expected)
    assert step_comm_s(graph, rows[1:]) < expected  # a key without a row counts nothing

"""The compiled pipeline event loop (``commsched.pipeline.engine_jit``) gives exactly the Python Engine's step: every
field ``simulate_program`` returns, on every schedule torch lowers (FSDP's collectives, shared host cores,
OVERLAP_F_B pairs, timed P2P with the compute slowdown), on random costs (hypothesis), and the same DeadlockError
on programs that cannot finish."""

from __future__ import annotations

import dataclasses
import math
from unittest import mock

import numpy as np
import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from tests.pipeline.test_pipeline_props import pipelines
from tests.pipeline.test_pipeline_sim import custom

from commsched.hardware import for_graph
from commsched.pipeline import ActionKind, DeadlockError, StageCosts, lower_schedule, simulate_program
from commsched.pipeline import simulate as simulate_module
from commsched.pipeline.engine import Engine
from commsched.sim import jit

pytestmark = pytest.mark.skipif(jit.numba is None, reason="numba is a dependency: the compiled loop needs it")

# (schedule, V, M) torch accepts at P = 4
SCHEDULES = [("GPipe", 1, 8), ("1F1B", 1, 8), ("Interleaved1F1B", 2, 8), ("LoopedBFS", 2, 4),
             ("InterleavedZeroBubble", 2, 8), ("ZBVZeroBubble", 2, 8), ("DualPipeV", 2, 8)]  # fmt: skip
HOST_CORES = (math.inf, 1.5, ((2.0, 1.8), (4.0, 2.5)))


def _outcome(program, costs: StageCosts, **options):
    try:
        return simulate_program(program, costs, **options)
    except DeadlockError as exc:
        return str(exc)


def both(program, costs: StageCosts, **options):
    """(compiled, Python) outcomes of ``simulate_program``: a result or a DeadlockError's message. The compiled run
    hands over to the Python Engine only where that raises (so the compiled loop really ran)."""
    handed_over = []

    def engine(*args):
        handed_over.append(args)
        return Engine(*args)

    with mock.patch.object(jit, "ENABLED", True), mock.patch.object(simulate_module, "Engine", engine):
        compiled = _outcome(program, costs, **options)
    with mock.patch.object(jit, "ENABLED", False):
        python = _outcome(program, costs, **options)
    assert isinstance(python, str) or not handed_over
    return compiled, python


def assert_identical(compiled, python) -> None:
    if isinstance(python, str):  # the same DeadlockError
        assert compiled == python
        return
    assert compiled.as_dict() == python.as_dict()  # step, bubble, busy / exposed / peak memory per rank
    for field in ("start_ns", "end_ns"):
        for a, b in zip(getattr(compiled, field), getattr(python, field), strict=True):
            assert a.dtype == b.dtype and np.array_equal(a, b), field


def _costs(stages: int, rng: np.random.Generator, *, fsdp: bool, pair: bool) -> StageCosts:
    def us(low: int, high: int):
        return rng.integers(low, high, stages) * 1e-6

    fsdp_s = us(0, 2000) if fsdp else 0
    return StageCosts(forward_s=us(100, 3000), backward_input_s=us(100, 3000), backward_weight_s=us(100, 3000),
                      send_bytes=rng.integers(1 << 16, 1 << 26, stages), static_bytes=1 << 32,
                      activation_bytes=rng.integers(0, 1 << 30, stages),
                      backward_peak_bytes=rng.integers(0, 1 << 29, stages), unshard_s=fsdp_s, reduce_grad_s=fsdp_s,
                      overlap_f_b_s=rng.integers(100, 5000, (stages, stages)) * 1e-6 if pair else None)  # fmt: skip


@pytest.mark.parametrize(("schedule", "v", "m"), SCHEDULES)
def test_every_schedule_gives_the_python_engines_step(schedule, v, m):
    """Each schedule with and without FSDP's collectives, P2P free or timed on H100s (8 ranks apart: across nodes,
    compute slowed while a transfer is in flight), ranks with a core each or sharing them, DualPipeV's OVERLAP_F_B
    as its two halves or as measured pairs, receives as early as possible or deferred."""
    rng = np.random.default_rng(sum(map(ord, schedule)))
    stages = 4 * v
    for defer in (False, True):
        program = lower_schedule(schedule, 4, m, v, defer_recv=defer)
        for fsdp, pair in ((False, False), (True, schedule == "DualPipeV")):
            costs = _costs(stages, rng, fsdp=fsdp, pair=pair)
            for host_cores in HOST_CORES:
                for comm in (dict(free_comm=True), dict(hardware="h100-sxm", ranks_between_stages=8)):
                    assert_identical(*both(program, costs, host_cores=host_cores, **comm))


def test_the_large_layouts_give_the_python_engines_step():
    """The sizes ``commsched plan`` judges: ZBVZeroBubble at P = 16, M = 64 and 1F1B at P = 8, M = 32."""
    rng = np.random.default_rng(0)
    for schedule, p, m, v in (("ZBVZeroBubble", 16, 64, 2), ("1F1B", 8, 32, 1)):
        program = lower_schedule(schedule, p, m, v)
        costs = _costs(p * v, rng, fsdp=True, pair=False)
        assert_identical(*both(program, costs, hardware="h100-sxm", ranks_between_stages=32))


@settings(max_examples=40, deadline=None)
@given(pipelines(), st.sampled_from(HOST_CORES), st.sampled_from([None, 1.0, 1.37]))
def test_random_costs_give_the_python_engines_step(case, host_cores, slowdown):
    """test_pipeline_props's pipelines (every StageCosts field drawn per stage, P2P free or timed), with shared host
    cores and the compute slowdown of communication drawn too."""
    program, costs, comm = case
    if comm == "free":
        options = dict(free_comm=True)
    else:
        hw = for_graph("h100-sxm", world_size=program.pp_size * comm)
        if slowdown is not None:
            hw = dataclasses.replace(hw, compute_slowdown=slowdown)
        options = dict(hardware=hw, ranks_between_stages=comm)
    assert_identical(*both(program, costs, host_cores=host_cores, **options))


RANK0 = "0F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1"
DEADLOCKS = {
    "receives out of order": {0: RANK0, 1: "1RECV_F1 1F1 1B1 1SEND_B1 1RECV_F0 1F0 1B0 1SEND_B0"},
    "a peer pair's stream crossed": {0: RANK0, 1: "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1"},
    "an input from its own rank later": {
        0: "0RECV_B0 0B0 " + RANK0,
        1: "1RECV_F0 1F0 1B0 1SEND_B0 1RECV_F1 1F1 1B1 1SEND_B1",
    },
    "posted twice": {
        0: "0F0 0SEND_F0 0SEND_F0 0F1 0SEND_F1 0RECV_B0 0B0 0RECV_B1 0B1",
        1: "1RECV_F0 1F0 1RECV_F1 1F1 1B0 1SEND_B0 1B1 1SEND_B1",
    },
    "a receive never sent": {0: RANK0, 1: "1RECV_F0 1F0 1RECV_F1 1F1 1RECV_F1 1B0 1SEND_B0 1B1 1SEND_B1"},
}


@pytest.mark.parametrize("name", sorted(DEADLOCKS))
def test_a_program_that_cannot_finish_raises_the_same_error(name):
    compiled, python = both(custom(DEADLOCKS[name]), StageCosts(forward_s=1e-3, backward_s=2e-3), free_comm=True)
    assert isinstance(python, str) and "rank" in python
    assert compiled == python


def test_a_wait_for_a_batch_never_posted_and_mixed_batches_raise_the_same_error():
    """GPipe's and 1F1B's WAIT rows and coalesced batches (``_batch_p2p``): a WAIT before its batch is posted, and a
    transfer with one end in a coalesced batch and the other alone."""
    program = lower_schedule("1F1B", 2, 2)
    acts = [a.copy() for a in program.actions]
    acts[1][np.flatnonzero(acts[1][:, 0] == ActionKind.WAIT)[0], 4] = 99  # a batch no row posts
    mixed = [a.copy() for a in program.actions]
    send = np.flatnonzero((mixed[0][:, 0] == ActionKind.SEND_F) & (mixed[0][:, 2] == 1))[0]
    mixed[0][send, 4] = -1  # 0SEND_F1 posted alone, its receive in rank 1's coalesced batch
    for rows, expected in ((acts, "no batch 99 posted before it"), (mixed, "one end is in a coalesced batch")):
        bad = dataclasses.replace(program, actions=tuple(rows))
        compiled, python = both(bad, StageCosts(forward_s=1e-3, backward_s=2e-3), free_comm=True)
        assert isinstance(python, str) and expected in python
        assert compiled == python

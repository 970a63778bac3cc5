"""Simulate a pipeline step rank by rank: each rank's actions in its order, transfers between ranks, memory.

The rules (torch's ``_PipelineScheduleRuntime`` on GPUs, ProcessGroupNCCL's stream semantics):

* a rank runs its compute actions (F, B, I, W, OVERLAP_F_B) one at a time in program order on one compute stream;
  one starts when the previous one ended and its inputs are there: a forward's input from the previous stage (its
  forward on this rank, else the transfer that brings it), a backward's output gradient from the next stage (its
  B / I on this rank, else the transfer; the last stage's from its own forward), a W's I;
* a SEND or RECV is posted at its place in the program and starts no earlier than the compute issued before it
  (NCCL's stream waits for the current stream), so a rank's posts never block it; its compute waits only where it
  consumes a received tensor;
* a transfer starts when its send and its receive are both posted and the previous transfer from the same sender
  to the same receiver has ended (NCCL matches a pair's P2P in order; each direction of a link is its own channel,
  as NVLink and InfiniBand are full duplex), and takes the collective model's ``sendrecv`` time
  (:func:`commsched.pipeline.costs.p2p_times_ns`); a receive never completes before its send was posted;
* UNSHARD (FSDP's all_gather of a stage's parameters) and REDUCE_GRAD (its gradient reduction) run once per step
  on the rank's all_gather and reduce-scatter streams (FSDP2's two streams), each FIFO, posted at their place in
  the program and taking the stage's ``unshard_s`` / ``reduce_grad_s``; a stage's compute waits for its UNSHARD,
  and the step waits for every REDUCE_GRAD (the waits count as exposed communication); RESHARD takes no time;
* a stage holds ``activation_bytes`` per micro-batch from its forward's start to the end of its backward (B, or the
  W after an I), plus ``static_bytes`` all step.

One pass over every action with a work list of ranks (a rank blocked on a transfer is woken when it is timed):
O(actions). Times are int64 ns (``sim/model.py``), so equal costs give exact ties.
"""

from __future__ import annotations

import dataclasses
from collections import deque

import numpy as np

from commsched.hardware import Hardware
from commsched.pipeline.actions import COMPUTE_KINDS, ActionKind, PipelineProgram, lower_schedule
from commsched.pipeline.costs import StageCosts, StageTimes, p2p_times_ns, stage_times

_COMPUTE = frozenset(int(k) for k in COMPUTE_KINDS)
_P2P = frozenset(int(k) for k in (ActionKind.SEND_F, ActionKind.SEND_B, ActionKind.RECV_F, ActionKind.RECV_B))
FWD, BWD = 0, 1  # a transfer's direction: a forward activation to stage s, an output gradient to stage s


@dataclasses.dataclass(frozen=True)
class RankResult:
    """One pipeline rank over the step: ``busy_s + bubble_s == step_s``; ``exposed_comm_s`` is the part of the
    bubble spent waiting for a transfer in flight."""

    rank: int
    busy_s: float  # its compute actions, summed
    bubble_s: float  # its compute stream idle over the step
    exposed_comm_s: float  # idle while an input it waits for was on the wire
    peak_memory_bytes: int  # static bytes of its stages + the most activations it held at once


@dataclasses.dataclass(frozen=True, eq=False)
class PipelineResult:
    """A simulated pipeline step. ``start_ns[r][i]`` / ``end_ns[r][i]``: action i of rank r (a compute action on the
    compute stream, a SEND / RECV its transfer), -1 for the actions that take no time."""

    program: PipelineProgram
    step_s: float
    per_rank: tuple[RankResult, ...]
    start_ns: tuple[np.ndarray, ...]
    end_ns: tuple[np.ndarray, ...]

    @property
    def bubble_fraction(self) -> float:
        """Idle compute over the step, mean over ranks."""
        return float(np.mean([r.bubble_s for r in self.per_rank]) / self.step_s) if self.step_s > 0 else 0.0

    @property
    def peak_memory_bytes(self) -> int:
        """The worst rank's peak."""
        return max(r.peak_memory_bytes for r in self.per_rank)

    def as_dict(self) -> dict:
        """The numbers as plain JSON types (issue 39's ``--json`` fields that do not need a model's tokens)."""
        return {"schedule": self.program.schedule, "pp_size": self.program.pp_size,
                "microbatches": self.program.microbatches, "stages_per_rank": self.program.stages_per_rank,
                "step_s": self.step_s, "bubble_fraction": self.bubble_fraction,
                "peak_memory_bytes": self.peak_memory_bytes,
                "per_rank": [dataclasses.asdict(r) for r in self.per_rank]}  # fmt: skip


class DeadlockError(ValueError):
    """No rank can move: each waits for a transfer whose send or receive is never posted before it."""


class _Run:
    """The mutable state of one simulation; ``advance`` runs one rank as far as its inputs allow."""

    def __init__(self, program: PipelineProgram, times: StageTimes, xfer_ns: np.ndarray) -> None:
        self.p, self.xfer_ns = program, [int(x) for x in xfer_ns]
        p = program.pp_size
        self.s2r = [int(r) for r in program.stage_to_rank]
        self.rows = [acts.tolist() for acts in program.actions]  # plain ints: the loop touches each row once
        self.table = {ActionKind.FORWARD: times.forward_ns.tolist(),
                      ActionKind.FULL_BACKWARD: times.backward_ns.tolist(),
                      ActionKind.BACKWARD_INPUT: times.backward_input_ns.tolist(),
                      ActionKind.BACKWARD_WEIGHT: times.backward_weight_ns.tolist()}  # fmt: skip
        self.pair = None if times.overlap_f_b_ns is None else times.overlap_f_b_ns.tolist()
        self.held = [int(b) for b in times.activation_bytes]
        self.pos, self.cursor = [0] * p, [0] * p
        self.busy, self.exposed = [0] * p, [0] * p
        self.act, self.peak = [0] * p, [0] * p
        self.fwd_end: dict[tuple[int, int], int] = {}  # (stage, mb) -> end of its forward
        self.bwd_end: dict[tuple[int, int], int] = {}  # (stage, mb) -> end of the B or I that made its input gradient
        self.send_at: dict[tuple[int, int, int], int] = {}  # transfer (direction, stage, mb) -> its send posted
        self.recv_at: dict[tuple[int, int, int], int] = {}  # ... its receive posted
        self.x_start: dict[tuple[int, int, int], int] = {}
        self.x_end: dict[tuple[int, int, int], int] = {}
        self.channels: dict[tuple[int, int], deque] = {}
        self.channel_free: dict[tuple[int, int], int] = {}
        self.waiting: dict[tuple[int, int, int], int] = {}
        self.ready = deque(range(p))
        self.start = [np.full(len(a), -1, np.int64) for a in program.actions]
        self.end = [np.full(len(a), -1, np.int64) for a in program.actions]
        self.send_where: dict[tuple[int, int, int], tuple[int, int]] = {}  # transfer -> (rank, action) of its send
        self.fsdp_ns = {
            ActionKind.UNSHARD: times.unshard_ns.tolist(),
            ActionKind.REDUCE_GRAD: times.reduce_grad_ns.tolist(),
        }
        self.fsdp_free = {(kind, r): 0 for kind in self.fsdp_ns for r in range(p)}  # each rank's two FSDP streams
        self.unshard_at: dict[int, tuple[int, int]] = {}  # stage -> (start, end) of its UNSHARD
        self.recv_where: dict[tuple[int, int, int], tuple[int, int]] = {}  # ... and of its receive

    # ------------------------------------------------------------------ P2P
    def post(self, rank: int, i: int, kind: int, stage: int, mb: int) -> None:
        """A SEND / RECV at rank's cursor; time every transfer its channel can now start."""
        if kind in (ActionKind.SEND_F, ActionKind.SEND_B):
            key = (FWD, stage + 1, mb) if kind == ActionKind.SEND_F else (BWD, stage - 1, mb)
            self.send_at[key] = self.cursor[rank]
            channel = (rank, self.s2r[key[1]])
            self.channels.setdefault(channel, deque()).append(key)
            self.send_where[key] = (rank, i)
        else:
            key = (FWD, stage, mb) if kind == ActionKind.RECV_F else (BWD, stage, mb)
            self.recv_at[key] = self.cursor[rank]
            peer = stage - 1 if kind == ActionKind.RECV_F else stage + 1
            channel = (self.s2r[peer], rank)
            self.recv_where[key] = (rank, i)
        self.flush(channel)

    def flush(self, channel: tuple[int, int]) -> None:
        """Time the transfers at the head of ``channel`` whose receive is posted, in the sender's order."""
        queue = self.channels.get(channel)
        while queue and queue[0] in self.recv_at:
            key = queue.popleft()
            boundary = key[1] - 1 if key[0] == FWD else key[1]
            start = max(self.send_at[key], self.recv_at[key], self.channel_free.get(channel, 0))
            end = start + self.xfer_ns[boundary]
            self.x_start[key], self.x_end[key], self.channel_free[channel] = start, end, end
            for rank, i in (self.send_where[key], self.recv_where[key]):
                self.start[rank][i], self.end[rank][i] = start, end
            waiter = self.waiting.pop(key, None)
            if waiter is not None:
                self.ready.append(waiter)

    def fsdp(self, rank: int, i: int, kind: int, stage: int) -> None:
        """An UNSHARD / REDUCE_GRAD at rank's cursor, on its stream once the one before it there has ended."""
        start = max(self.cursor[rank], self.fsdp_free[kind, rank])
        end = start + self.fsdp_ns[kind][stage]
        self.fsdp_free[kind, rank] = end
        self.start[rank][i], self.end[rank][i] = start, end
        if kind == ActionKind.UNSHARD:
            self.unshard_at[stage] = (start, end)

    # ------------------------------------------------------------------ compute
    def inputs(self, rank: int, kind: int, stage: int, mb: int) -> list[tuple[int, int, tuple | None]]:
        """(ready ns or -1, transfer start ns or -1, the transfer key or None) of each input of one compute; a stage's
        parameters gathered by its UNSHARD are one (a transfer on the rank's own stream)."""
        gathered = self.unshard_at.get(stage)
        own = [] if gathered is None else [(gathered[1], gathered[0], ("unshard", stage))]
        return own + self.data_inputs(rank, kind, stage, mb)

    def data_inputs(self, rank: int, kind: int, stage: int, mb: int) -> list[tuple[int, int, tuple | None]]:
        """The activations and gradients one compute reads (see :meth:`inputs`)."""
        if kind == ActionKind.FORWARD:
            if stage == 0:
                return []
            if self.s2r[stage - 1] == rank:
                return [(self.fwd_end.get((stage - 1, mb), -1), -1, None)]
            key = (FWD, stage, mb)
            return [(self.x_end.get(key, -1), self.x_start.get(key, -1), key)]
        if kind == ActionKind.BACKWARD_WEIGHT:
            return [(self.bwd_end.get((stage, mb), -1), -1, None)]
        own = [(self.fwd_end.get((stage, mb), -1), -1, None)]
        if stage == self.p.num_stages - 1:
            return own
        if self.s2r[stage + 1] == rank:
            return [*own, (self.bwd_end.get((stage + 1, mb), -1), -1, None)]
        key = (BWD, stage, mb)
        return [*own, (self.x_end.get(key, -1), self.x_start.get(key, -1), key)]

    def duration(self, row: list[int]) -> int:
        kind, stage, mb, kind2, stage2, mb2 = row
        if kind != ActionKind.OVERLAP_F_B:
            return self.table[kind][stage][mb]
        if self.pair is not None:
            return self.pair[stage][stage2]
        return self.table[ActionKind.FORWARD][stage][mb] + self.table[kind2][stage2][mb2]

    def compute(self, rank: int, i: int, row: list[int]) -> bool:
        """Run one compute action, or register the rank as waiting and return False."""
        kind, stage, mb, kind2, stage2, mb2 = row
        parts = [(kind, stage, mb)] if kind != ActionKind.OVERLAP_F_B else [(ActionKind.FORWARD, stage, mb),
                                                                             (kind2, stage2, mb2)]  # fmt: skip
        deps = [d for k, s, m in parts for d in self.inputs(rank, k, s, m)]
        for ready, _, key in deps:
            if ready < 0:
                if key is None:
                    raise DeadlockError(f"rank {rank} action {self.p.action_str(rank, i)}: an input it needs from "
                                        "its own rank runs later in its order")  # fmt: skip
                self.waiting[key] = rank
                return False
        cursor = self.cursor[rank]
        start = max([cursor] + [ready for ready, _, _ in deps])
        self.exposed[rank] += max([0] + [min(ready, start) - max(cursor, xs) for ready, xs, key in deps if key])
        end = start + self.duration(row)
        self.start[rank][i], self.end[rank][i], self.cursor[rank] = start, end, end
        self.busy[rank] += end - start
        for k, s, m in parts:
            self.finish(rank, k, s, m, end)
        return True

    def finish(self, rank: int, kind: int, stage: int, mb: int, end_ns: int) -> None:
        """Record a compute part's end and its memory: a forward takes its activations, the end of the backward
        (B, or the W after an I) frees them."""
        held = self.held[stage]
        if kind == ActionKind.FORWARD:
            self.fwd_end[stage, mb] = end_ns
            self.act[rank] += held
            self.peak[rank] = max(self.peak[rank], self.act[rank])
        elif kind in (ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_INPUT):
            self.bwd_end[stage, mb] = end_ns
        if kind in (ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_WEIGHT):
            self.act[rank] -= held

    # ------------------------------------------------------------------ the loop
    def advance(self, rank: int) -> None:
        """Run rank's actions in order until one waits for a transfer not yet timed, or the rank is done."""
        rows = self.rows[rank]
        while self.pos[rank] < len(rows):
            i = self.pos[rank]
            row = rows[i]
            kind = row[0]
            if kind in _P2P:
                self.post(rank, i, kind, row[1], row[2])
            elif kind in self.fsdp_ns:
                self.fsdp(rank, i, kind, row[1])
            elif kind in _COMPUTE and not self.compute(rank, i, row):
                return
            self.pos[rank] = i + 1

    def run(self) -> None:
        while self.ready:
            self.advance(self.ready.popleft())
        stuck = [r for r in range(self.p.pp_size) if self.pos[r] < len(self.p.actions[r])]
        if stuck:
            where = "; ".join(f"rank {r} at {self.p.action_str(r, self.pos[r])}" for r in stuck[:4])
            raise DeadlockError(f"pipeline {self.p.schedule} deadlocks: {where} (each waits for a transfer whose "
                                "send or receive is never posted)")  # fmt: skip


def simulate_program(
    program: PipelineProgram,
    stage_costs: StageCosts,
    hardware: str | Hardware | None = None,
    *,
    ranks_between_stages: int = 1,
    free_comm: bool = False,
) -> PipelineResult:
    """Simulate ``program`` with ``stage_costs``; P2P transfers timed on ``hardware`` (pipeline rank r is global
    rank ``r * ranks_between_stages``), or free with ``free_comm``. Raises ValueError naming a malformed cost field,
    :class:`DeadlockError` when the program cannot finish. O(actions)."""
    times = stage_times(stage_costs, program)
    xfer = np.zeros(max(program.num_stages - 1, 0), np.int64)
    if not free_comm:
        xfer = p2p_times_ns(program, times.send_bytes, hardware, ranks_between_stages)
    run = _Run(program, times, xfer)
    run.run()
    return _result(run, times)


def _result(run: _Run, times: StageTimes) -> PipelineResult:
    program = run.p
    # a rank's step ends with its last compute and its last transfer (torch waits for its sends at the end)
    step_ns = max(max(run.cursor[r], int(run.end[r].max(initial=-1))) for r in range(program.pp_size))
    static = np.zeros(program.pp_size, np.int64)
    np.add.at(static, program.stage_to_rank, times.static_bytes)
    # after its last compute a rank waits for its last gradient reduction (REDUCE_GRAD)
    tail = [max(run.fsdp_free[ActionKind.REDUCE_GRAD, r] - run.cursor[r], 0) for r in range(program.pp_size)]
    per_rank = tuple(
        RankResult(rank=r, busy_s=run.busy[r] * 1e-9, bubble_s=(step_ns - run.busy[r]) * 1e-9,
                   exposed_comm_s=(run.exposed[r] + tail[r]) * 1e-9,
                   peak_memory_bytes=int(static[r]) + run.peak[r])
        for r in range(program.pp_size)
    )  # fmt: skip
    for arr in (*run.start, *run.end):
        arr.flags.writeable = False
    return PipelineResult(program, step_ns * 1e-9, per_rank, tuple(run.start), tuple(run.end))


def simulate_pipeline(
    schedule: str,
    pp_size: int,
    microbatches: int,
    stages_per_rank: int | None,
    stage_costs: StageCosts,
    hardware: str | Hardware | None = None,
    *,
    ranks_between_stages: int = 1,
    free_comm: bool = False,
    defer_recv: bool = False,
) -> PipelineResult:
    """torch's ``schedule`` (:func:`commsched.pipeline.lower_schedule`) for ``pp_size`` ranks, ``microbatches``
    micro-batches and ``stages_per_rank`` stages per rank, simulated with ``stage_costs`` on ``hardware``
    (see :func:`simulate_program`)."""
    program = lower_schedule(schedule, pp_size, microbatches, stages_per_rank, defer_recv=defer_recv)
    return simulate_program(program, stage_costs, hardware, ranks_between_stages=ranks_between_stages,
                            free_comm=free_comm)  # fmt: skip

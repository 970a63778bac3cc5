"""Simulate a pipeline step rank by rank: each rank's actions in its order, transfers between ranks, memory.

The rules (torch's ``_PipelineScheduleRuntime`` and single-stage runtimes on GPUs, ProcessGroupNCCL's streams):

* a rank runs its compute actions (F, B, I, W, OVERLAP_F_B) one at a time in program order on one compute stream;
  one starts when the previous one ended and its inputs are there: a forward's input from the previous stage (its
  forward on this rank, else the transfer that brings it), a backward's output gradient from the next stage (its
  B / I on this rank, else the transfer; the last stage's from its own forward), a W's I;
* a SEND or RECV is posted at its place in the program, when the compute issued before it has ended (NCCL's stream
  waits for the current stream), so posts never block the rank; the compute stream waits only where it consumes a
  received tensor, and at a WAIT (``_wait_batch_p2p`` of GPipe's and 1F1B's runtime loops) until every op of that
  batch has ended, sends included;
* streams are ProcessGroupNCCL's: a P2P op posted alone runs on the two-rank communicator of its peer pair, one
  FIFO stream per peer on each rank that carries both directions (``getKeySendRecv``: torch's default, lazily
  created communicators), so a rank's SEND_F to the next rank and SEND_B to the previous one run side by side; a
  batch that mixes sends and receives is one coalesced NCCL group (``batch_isend_irecv``) on the pipeline group's
  own stream, ending when all its ops have; a stream's next item starts when the one before it has ended;
* a transfer starts when the items of both its ends have started on their streams, and takes the collective
  model's ``sendrecv`` time between the two ranks' placements (:func:`commsched.pipeline.costs.p2p_times_ns`); so a
  receive never completes before its send was posted, and a pair's P2P match in the order both post them;
* UNSHARD (FSDP's all_gather of a stage's parameters) and REDUCE_GRAD (its gradient reduction) run once per step
  on the rank's all_gather and reduce-scatter streams (FSDP2's two streams), each FIFO, posted at their place in
  the program and taking the stage's ``unshard_s`` / ``reduce_grad_s``; a stage's compute waits for its UNSHARD,
  and the step waits for every REDUCE_GRAD (the waits count as exposed communication); RESHARD takes no time;
* while any transfer or FSDP collective of a rank is in flight its compute runs ``compute_slowdown`` times slower
  (the hardware profile's factor; the stream model's rule, :class:`commsched.sim.model.StreamModel`: NCCL's
  kernels take SMs);
* a stage holds ``activation_bytes`` per micro-batch from its forward's start to the end of its backward (B, or the
  W after an I), and ``backward_peak_bytes`` more while a B or I of it runs, plus ``static_bytes`` all step.

An event loop over every action (:mod:`commsched.pipeline.engine`; compiled, with identical results, in
:mod:`commsched.pipeline.engine_jit` unless ``COMMSCHED_JIT=0``): O(actions log actions). Times are int64 ns
(``sim/model.py``), so equal costs give exact ties.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from commsched.hardware import Hardware, for_graph
from commsched.pipeline.actions import ActionKind, PipelineProgram, lower_schedule
from commsched.pipeline.costs import StageCosts, StageTimes, p2p_times_ns, stage_times
from commsched.pipeline.engine import DeadlockError, Engine
from commsched.pipeline.engine_jit import CompiledRun, run_compiled
from commsched.sim import jit
from commsched.sim.model import StreamModel, cores_points

__all__ = ["DeadlockError", "PipelineResult", "RankResult", "simulate_pipeline", "simulate_program"]


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


def simulate_program(
    program: PipelineProgram,
    stage_costs: StageCosts,
    hardware: str | Hardware | None = None,
    *,
    ranks_between_stages: int = 1,
    free_comm: bool = False,
    host_cores: float | tuple[tuple[float, float], ...] = math.inf,
) -> PipelineResult:
    """Simulate ``program`` with ``stage_costs``; P2P transfers timed on ``hardware`` (pipeline rank r is global
    rank ``r * ranks_between_stages``), or free with ``free_comm`` (no transfer time and no slowdown of compute by
    communication); ``host_cores``: the cores the ranks' compute shares on a CPU harness, a number or measured
    (ranks, cores) points (:func:`commsched.sim.model.cores_points`; infinite: one per rank). Raises ValueError
    naming a malformed cost field, :class:`DeadlockError` when the program cannot finish. O(actions log actions)."""
    times = stage_times(stage_costs, program)
    xfer = np.zeros(max(program.num_stages - 1, 0), np.int64)
    points = cores_points(host_cores)
    model = StreamModel(host_cores=points)
    if not free_comm:
        xfer = p2p_times_ns(program, times.send_bytes, hardware, ranks_between_stages)
        if hardware is not None:
            hw = for_graph(hardware, world_size=program.pp_size * ranks_between_stages)
            model = StreamModel(compute_slowdown=float(hw.compute_slowdown), host_cores=points)
    run = run_compiled(program, times, xfer, model) if jit.ENABLED else None
    if run is None:  # the Python loop: COMMSCHED_JIT=0, or the program cannot finish (Engine raises the error)
        run = Engine(program, times, xfer, model)
        run.run()
    return _result(program, run, times)


def _result(program: PipelineProgram, run: Engine | CompiledRun, times: StageTimes) -> PipelineResult:
    # a rank's step ends with its last compute and its last transfer (torch waits for its sends at the end)
    step_ns = max(max(run.cursor[r], int(run.end[r].max(initial=-1))) for r in range(program.pp_size))
    static = np.zeros(program.pp_size, np.int64)
    np.add.at(static, program.stage_to_rank, times.static_bytes)
    # after its last compute a rank waits for its last gradient reduction (REDUCE_GRAD)
    reduce_end = [run.end[r][acts[:, 0] == ActionKind.REDUCE_GRAD].max(initial=0) for r, acts in
                  enumerate(program.actions)]  # fmt: skip
    tail = [max(int(reduce_end[r]) - run.cursor[r], 0) for r in range(program.pp_size)]
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
    host_cores: float | tuple[tuple[float, float], ...] = math.inf,
) -> PipelineResult:
    """torch's ``schedule`` (:func:`commsched.pipeline.lower_schedule`) for ``pp_size`` ranks, ``microbatches``
    micro-batches and ``stages_per_rank`` stages per rank, simulated with ``stage_costs`` on ``hardware``
    (see :func:`simulate_program`)."""
    program = lower_schedule(schedule, pp_size, microbatches, stages_per_rank, defer_recv=defer_recv)
    return simulate_program(program, stage_costs, hardware, ranks_between_stages=ranks_between_stages,
                            free_comm=free_comm, host_cores=host_cores)  # fmt: skip

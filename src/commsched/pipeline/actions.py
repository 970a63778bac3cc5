"""A pipeline schedule as each pipeline rank's ordered action list, taken from torch's own generators.

torch.distributed.pipelining computes every schedule's ``pipeline_order`` (per rank: F, B, I, W, OVERLAP_F_B) from
counts alone, and ``_PipelineScheduleRuntime._prepare_schedule_with_comms`` lowers it with torch's rules: FSDP
UNSHARD / RESHARD (``_add_unshard_reshard``), REDUCE_GRAD after a stage's last backward (``_add_reduce_grad``) and
the P2P SEND_F / RECV_F / SEND_B / RECV_B of every stage boundary that crosses ranks (``_add_send_recv``; RECVs
as early as the senders allow, or ``defer_recv``: just before their consumer, ``_defer_recv_ops``). We run exactly
that on stand-in stage objects (torch's ``get_schedule_ops`` does the same for its visualiser), so every list here
is torch's: nothing of a schedule is derived by hand.

The result is a :class:`PipelineProgram`: per rank an int32 array with one row per action, columns
:data:`COLUMNS`; an OVERLAP_F_B row carries its forward sub-action in ``stage`` / ``microbatch`` and its backward
sub-action in ``stage2`` / ``microbatch2`` / ``kind2``.
"""

from __future__ import annotations

import dataclasses
import functools
from enum import IntEnum
from typing import Any

import numpy as np

SINGLE_STAGE = ("GPipe", "1F1B")
"""torch's ``PipelineScheduleSingle`` schedules: one stage per rank (V = 1)"""
MULTI_STAGE = ("Interleaved1F1B", "LoopedBFS", "InterleavedZeroBubble", "ZBVZeroBubble", "DualPipeV")
"""torch's ``_PipelineScheduleRuntime`` schedules: V >= 2 stages per rank (the V-shaped two: exactly 2)"""
SCHEDULES = SINGLE_STAGE + MULTI_STAGE
V_SHAPED = ("ZBVZeroBubble", "DualPipeV")
"""schedules whose stages sit on the ranks in a V (rank r holds stages r and 2P - 1 - r)"""


class ActionKind(IntEnum):
    """One action of a pipeline rank (torch's ``_ComputationType``)."""

    FORWARD = 0  # F: a stage's forward of one micro-batch
    FULL_BACKWARD = 1  # B: its whole backward (input and weight gradients)
    BACKWARD_INPUT = 2  # I: the input-gradient half (zero-bubble schedules); W follows later
    BACKWARD_WEIGHT = 3  # W: the weight-gradient half
    OVERLAP_F_B = 4  # a forward and a backward of two micro-batches issued together (DualPipeV)
    SEND_F = 5  # send a forward's output to the next stage's rank (posted in order; never blocks the rank)
    RECV_F = 6  # post the receive of a forward input; the F that consumes it waits for the transfer
    SEND_B = 7  # send an input gradient to the previous stage's rank
    RECV_B = 8  # post the receive of an output gradient; the B / I that consumes it waits for the transfer
    UNSHARD = 9  # FSDP all_gather of a stage's parameters (not timed yet)
    RESHARD = 10  # FSDP free of the gathered parameters (no communication)
    REDUCE_GRAD = 11  # the stage's gradient reduction after its last backward (not timed yet)


COMPUTE_KINDS = (ActionKind.FORWARD, ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_INPUT,
                 ActionKind.BACKWARD_WEIGHT, ActionKind.OVERLAP_F_B)  # fmt: skip
COLUMNS = ("kind", "stage", "microbatch", "kind2", "stage2", "microbatch2")
"""the columns of a rank's action array; -1 where a field does not apply"""
_TORCH_NAME = {"F": ActionKind.FORWARD, "B": ActionKind.FULL_BACKWARD, "I": ActionKind.BACKWARD_INPUT,
               "W": ActionKind.BACKWARD_WEIGHT, "OVERLAP_F_B": ActionKind.OVERLAP_F_B, "SEND_F": ActionKind.SEND_F,
               "RECV_F": ActionKind.RECV_F, "SEND_B": ActionKind.SEND_B, "RECV_B": ActionKind.RECV_B,
               "UNSHARD": ActionKind.UNSHARD, "RESHARD": ActionKind.RESHARD,
               "REDUCE_GRAD": ActionKind.REDUCE_GRAD}  # fmt: skip
_LETTER = {kind: name for name, kind in _TORCH_NAME.items()}


@dataclasses.dataclass(frozen=True, eq=False)
class PipelineProgram:
    """Every pipeline rank's ordered actions for one step.

    ``actions[r]`` is an int32 array (n_r, 6) in rank r's program order (columns :data:`COLUMNS`);
    ``stage_to_rank[s]`` the rank holding stage s. Stages 0..num_stages-1 run in that order in the forward."""

    schedule: str
    pp_size: int
    microbatches: int
    stages_per_rank: int
    stage_to_rank: np.ndarray  # int32 (num_stages,)
    actions: tuple[np.ndarray, ...]  # per rank, int32 (n_r, 6)

    @property
    def num_stages(self) -> int:
        return len(self.stage_to_rank)

    def action_str(self, rank: int, index: int) -> str:
        """One action as torch prints it (``2F0``, ``3SEND_B1``, ``(0F7;7B3)OVERLAP_F_B``, ``1UNSHARD``)."""
        kind, stage, mb, kind2, stage2, mb2 = (int(x) for x in self.actions[rank][index])
        if kind == ActionKind.OVERLAP_F_B:
            return f"({stage}F{mb};{stage2}{_LETTER[ActionKind(kind2)]}{mb2})OVERLAP_F_B"
        return f"{stage}{_LETTER[ActionKind(kind)]}{'' if mb < 0 else mb}"

    def rank_strs(self, rank: int) -> list[str]:
        """Rank ``rank``'s actions as torch prints them, in order."""
        return [self.action_str(rank, i) for i in range(len(self.actions[rank]))]


def parse_schedule(schedule: str) -> str:
    """torch's spelling of a schedule name given in any case, or ValueError naming the schedules."""
    name = {name.lower(): name for name in SCHEDULES}.get(str(schedule).lower())
    if name is None:
        raise ValueError(f"schedule={schedule!r}: expected one of {', '.join(SCHEDULES)}")
    return name


def check_schedule_args(schedule: str, pp_size: int, microbatches: int, stages_per_rank: int | None) -> tuple[str, int]:
    """(torch's spelling of ``schedule``, V) or ValueError naming the option and what torch requires."""
    name = parse_schedule(schedule)
    for field, value in (("pp_size", pp_size), ("microbatches", microbatches)):
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise ValueError(f"{field}={value!r}: expected an integer >= 1")
    if pp_size < 2:
        raise ValueError(f"pp_size={pp_size}: a pipeline needs at least 2 ranks")
    default_v = 1 if name in SINGLE_STAGE else 2
    v = default_v if stages_per_rank is None else stages_per_rank
    if isinstance(v, bool) or not isinstance(v, int):
        raise ValueError(f"stages_per_rank={v!r}: expected an integer")
    if name in SINGLE_STAGE and v != 1:
        raise ValueError(f"stages_per_rank={v}: {name} runs one stage per rank (torch's PipelineScheduleSingle)")
    if name in V_SHAPED and v != 2:
        raise ValueError(f"stages_per_rank={v}: {name} runs exactly 2 stages per rank")
    if name in MULTI_STAGE and v < 2:
        raise ValueError(f"stages_per_rank={v}: {name} runs 2 or more stages per rank")
    return name, v


def lower_schedule(
    schedule: str, pp_size: int, microbatches: int, stages_per_rank: int | None = None, *, defer_recv: bool = False
) -> PipelineProgram:
    """torch's ``schedule`` for ``pp_size`` ranks, ``microbatches`` micro-batches and ``stages_per_rank`` stages per
    rank (1 for GPipe / 1F1B, default 2 otherwise), lowered by torch with its communication actions.

    Requires torch. Raises ValueError naming the option when torch refuses the combination (e.g. Interleaved1F1B
    needs M to be a multiple of its rounds, DualPipeV M >= 2P). Cached: the arrays are read-only. Cost: torch's
    generators and lowering (about 1 s at P = 16, M = 64, V = 4 on one core)."""
    name, v = check_schedule_args(schedule, pp_size, microbatches, stages_per_rank)
    return _lower_cached(name, pp_size, microbatches, v, bool(defer_recv))


@functools.lru_cache(maxsize=64)
def _lower_cached(name: str, pp_size: int, microbatches: int, v: int, defer_recv: bool) -> PipelineProgram:
    from commsched.pipeline.cache import cached_program  # on disk: a warm run skips torch's pipelining import

    return cached_program(name, pp_size, microbatches, v, defer_recv, _lower_torch, PipelineProgram)


def _lower_torch(name: str, pp_size: int, microbatches: int, v: int, defer_recv: bool) -> PipelineProgram:
    from torch.distributed.pipelining.schedules import _PipelineScheduleRuntime, get_schedule_class

    where = f"schedule={name}, pp_size={pp_size}, microbatches={microbatches}, stages_per_rank={v}"
    stages = [_stand_in_stage(pp_size, pp_size * v)] * v
    try:
        if name in SINGLE_STAGE:  # torch runs these without an action list: lower what their runtime runs
            lowered = _PipelineScheduleRuntime(stages, microbatches, defer_pp_recv=defer_recv)
            lowered._prepare_schedule_with_comms(_single_stage_order(name, pp_size, microbatches))
        else:  # a _PipelineScheduleRuntime lowers its own order when it is built
            lowered = get_schedule_class(name)(stages, microbatches, defer_pp_recv=defer_recv)
    except (AssertionError, ValueError) as exc:
        raise ValueError(f"{where}: torch refuses it: {exc}") from None
    return program_from_torch(name, pp_size, microbatches, v, lowered.stage_index_to_group_rank,
                              lowered.pipeline_order_with_comms)  # fmt: skip


def program_from_torch(
    schedule: str,
    pp_size: int,
    microbatches: int,
    stages_per_rank: int,
    stage_to_rank: dict[int, int],
    actions: dict[int, list[Any]],
) -> PipelineProgram:
    """A :class:`PipelineProgram` from torch ``_Action`` lists per rank (what a lowered torch schedule, or a CSV in
    torch's ``_dump_csv`` format read by ``_Action.from_str``, holds); ``None`` entries are skipped."""
    num_stages = pp_size * stages_per_rank
    if sorted(stage_to_rank) != list(range(num_stages)):
        raise ValueError(f"stage_to_rank: expected stages 0..{num_stages - 1}, got {sorted(stage_to_rank)}")
    rows_per_rank = []
    for rank in range(pp_size):
        rows = [_row(a) for a in actions.get(rank, []) if a is not None]
        rows_arr = np.asarray(rows, dtype=np.int32).reshape(-1, len(COLUMNS))
        rows_arr.flags.writeable = False
        rows_per_rank.append(rows_arr)
    s2r = np.asarray([stage_to_rank[s] for s in range(num_stages)], dtype=np.int32)
    s2r.flags.writeable = False
    return PipelineProgram(schedule, pp_size, microbatches, stages_per_rank, s2r, tuple(rows_per_rank))


def _row(action: Any) -> tuple[int, ...]:
    kind = _TORCH_NAME[action.computation_type.value]
    mb = -1 if action.microbatch_index is None else int(action.microbatch_index)
    if kind != ActionKind.OVERLAP_F_B:
        return (int(kind), int(action.stage_index), mb, -1, -1, -1)
    subs = action.sub_actions or ()
    fwd = [a for a in subs if a.computation_type.value == "F"]
    bwd = [a for a in subs if a.computation_type.value in ("B", "I")]
    if len(fwd) != 1 or len(bwd) != 1 or len(subs) != 2:
        raise ValueError(f"action {action}: expected an OVERLAP_F_B of one forward and one backward")
    f, b = fwd[0], bwd[0]
    return (int(kind), int(f.stage_index), int(f.microbatch_index), int(_TORCH_NAME[b.computation_type.value]),
            int(b.stage_index), int(b.microbatch_index))  # fmt: skip


def _stand_in_stage(pp_size: int, num_stages: int) -> Any:
    """A stand-in for torch's PipelineStage with the fields the schedule generators read (group size, stage count);
    torch's own ``get_schedule_ops`` builds the same one."""
    from unittest import mock

    from torch.distributed.pipelining.stage import PipelineStage

    stage = mock.create_autospec(PipelineStage, instance=True)
    stage.group_rank, stage.group_size, stage.num_stages, stage.submod = 0, pp_size, num_stages, None
    return stage


class _RecordingStage:
    """The one stage of a rank under a ``PipelineScheduleSingle``: it records the forwards and backwards torch's
    ``_step_microbatches`` runs, in order, and has no P2P ops (those are lowered like every other schedule's)."""

    def __init__(self, rank: int, pp_size: int) -> None:
        self.stage_index, self.num_stages, self.group_rank, self.group_size = rank, pp_size, rank, pp_size
        self.is_first, self.is_last, self.has_backward, self.submod = rank == 0, rank == pp_size - 1, False, None
        self.order: list[tuple[str, int]] = []

    def forward_one_chunk(self, mb: int, *args: Any, **kwargs: Any) -> None:
        self.order.append(("F", mb))

    def backward_one_chunk(self, mb: int, **kwargs: Any) -> None:
        self.order.append(("B", mb))

    def _no_ops(self, mb: int) -> list:
        return []

    get_fwd_recv_ops = get_fwd_send_ops = get_bwd_recv_ops = get_bwd_send_ops = _no_ops

    def clear_runtime_states(self) -> None:
        pass

    def perform_reduce_grad(self, *args: Any) -> None:
        pass


def _single_stage_order(name: str, pp_size: int, microbatches: int) -> dict[int, list[Any]]:
    """What a ``PipelineScheduleSingle``'s ``_step_microbatches`` runs on each rank, in order (its
    ``pipeline_order`` is only drawn, and torch 2.13's 1F1B one starts the last rank at F1: the runtime runs F0)."""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType, get_schedule_class

    kinds = {"F": _ComputationType.FORWARD, "B": _ComputationType.FULL_BACKWARD}
    order = {}
    for rank in range(pp_size):
        stage = _RecordingStage(rank, pp_size)
        runner = get_schedule_class(name)(stage, microbatches)
        runner._stage_forward_initialized = True  # no metadata to infer: the stand-in has no tensors
        runner._step_microbatches()
        order[rank] = [_Action(rank, kinds[k], mb) for k, mb in stage.order]
    return order

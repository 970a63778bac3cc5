"""A pipeline schedule as each pipeline rank's ordered action list, taken from torch's own generators.

torch.distributed.pipelining computes every schedule's ``pipeline_order`` (per rank: F, B, I, W, OVERLAP_F_B) from
counts alone, and ``_PipelineScheduleRuntime._prepare_schedule_with_comms`` lowers it with torch's rules: FSDP
UNSHARD / RESHARD (``_add_unshard_reshard``), REDUCE_GRAD after a stage's last backward (``_add_reduce_grad``) and
the P2P SEND_F / RECV_F / SEND_B / RECV_B of every stage boundary that crosses ranks (``_add_send_recv``; RECVs
as early as the senders allow, or ``defer_recv``: just before their consumer, ``_defer_recv_ops``). We run exactly
that on stand-in stage objects (torch's ``get_schedule_ops`` does the same for its visualiser), so every list here
is torch's: nothing of a schedule is derived by hand.

GPipe and 1F1B have no action list in torch: their ``_step_microbatches`` loops issue the P2P themselves, so we
record what that loop runs (its computes, each ``_batch_p2p`` call and each ``_wait_batch_p2p``), with the stage's
FSDP actions placed as torch's lowering places them.

The result is a :class:`PipelineProgram`: per rank an int32 array with one row per action, columns
:data:`COLUMNS`; an OVERLAP_F_B row carries its forward sub-action in ``stage`` / ``microbatch`` and its backward
sub-action in ``stage2`` / ``microbatch2`` / ``kind2``; a SEND / RECV row carries in ``stage2`` the batch (one
``_batch_p2p`` call) that posted it, or -1 when it was posted alone; a WAIT row the batch it waits for.
"""

from __future__ import annotations

import dataclasses
import functools
from enum import IntEnum
from typing import Any, NamedTuple

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
    REDUCE_GRAD = 11  # the stage's gradient reduction after its last backward
    WAIT = 12  # not torch's: the compute stream waits for a batch of P2P ops (``_wait_batch_p2p``; GPipe / 1F1B)


COMPUTE_KINDS = (ActionKind.FORWARD, ActionKind.FULL_BACKWARD, ActionKind.BACKWARD_INPUT,
                 ActionKind.BACKWARD_WEIGHT, ActionKind.OVERLAP_F_B)  # fmt: skip
COLUMNS = ("kind", "stage", "microbatch", "kind2", "stage2", "microbatch2")
"""the columns of a rank's action array; -1 where a field does not apply (``stage2`` of a SEND / RECV / WAIT: its
P2P batch)"""
P2P_KINDS = (ActionKind.SEND_F, ActionKind.RECV_F, ActionKind.SEND_B, ActionKind.RECV_B)
SENDS = (ActionKind.SEND_F, ActionKind.SEND_B)
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
        if kind == ActionKind.WAIT:
            return f"WAIT{stage2}"
        return f"{stage}{_LETTER[ActionKind(kind)]}{'' if mb < 0 else mb}"

    def rank_strs(self, rank: int) -> list[str]:
        """Rank ``rank``'s actions as torch prints them, in order (a WAIT as ``WAIT<batch>``)."""
        return [self.action_str(rank, i) for i in range(len(self.actions[rank]))]


def coalesced(kinds: list[int]) -> bool:
    """Whether one ``_batch_p2p`` call of these P2P kinds runs as one coalesced NCCL group: torch's ``_batch_p2p``
    issues a batch of only sends or only receives as single ops (no head-of-line blocking) and a mixed one through
    ``batch_isend_irecv`` (deadlock avoidance)."""
    sends = sum(int(k) in SENDS for k in kinds)
    return 0 < sends < len(kinds)


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
    rank (1 for GPipe / 1F1B, default 2 otherwise), lowered by torch with its communication actions (GPipe's and
    1F1B's: what their runtime loop posts and waits for; ``defer_recv``, torch's ``defer_pp_recv``, only moves the
    receives of the action-list schedules).

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
            recorded = _single_stage_runtime(name, pp_size, microbatches)
            lowered = _PipelineScheduleRuntime(stages, microbatches, defer_pp_recv=defer_recv)
            lowered._prepare_schedule_with_comms({r: _computes(rows) for r, rows in recorded.items()})
        else:  # a _PipelineScheduleRuntime lowers its own order when it is built
            lowered = get_schedule_class(name)(stages, microbatches, defer_pp_recv=defer_recv)
    except (AssertionError, ValueError) as exc:
        raise ValueError(f"{where}: torch refuses it: {exc}") from None
    program = program_from_torch(name, pp_size, microbatches, v, lowered.stage_index_to_group_rank,
                                 lowered.pipeline_order_with_comms)  # fmt: skip
    if name in SINGLE_STAGE:
        program = _with_runtime_p2p(program, recorded)
    return program


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


class _P2POp(NamedTuple):
    """A P2P op as a single-stage schedule's stage returns it (``get_fwd_recv_ops`` ...): only what we record."""

    kind: ActionKind
    stage: int
    microbatch: int
    peer: int  # read by torch's ``_sorted_batch_p2p``


class _RecordingStage:
    """The one stage of a rank under a ``PipelineScheduleSingle``: ``rows`` records, in order, the forwards and
    backwards torch's ``_step_microbatches`` runs and the P2P ops it posts (with the batch, one ``_batch_p2p``
    call, that posts them) and waits for (WAIT rows), as :data:`COLUMNS` rows."""

    def __init__(self, rank: int, pp_size: int) -> None:
        self.stage_index, self.num_stages, self.group_rank, self.group_size = rank, pp_size, rank, pp_size
        self.is_first, self.is_last, self.has_backward, self.submod = rank == 0, rank == pp_size - 1, False, None
        self.rows: list[tuple[int, ...]] = []
        self.batches = 0

    def forward_one_chunk(self, mb: int, *args: Any, **kwargs: Any) -> None:
        self.rows.append((int(ActionKind.FORWARD), self.stage_index, mb, -1, -1, -1))

    def backward_one_chunk(self, mb: int, **kwargs: Any) -> None:
        self.rows.append((int(ActionKind.FULL_BACKWARD), self.stage_index, mb, -1, -1, -1))

    def _ops(self, kind: ActionKind, mb: int, skip: bool, peer: int) -> list[_P2POp]:
        return [] if skip else [_P2POp(kind, self.stage_index, mb, peer)]

    def get_fwd_recv_ops(self, mb: int) -> list[_P2POp]:
        return self._ops(ActionKind.RECV_F, mb, self.is_first, self.stage_index - 1)

    def get_fwd_send_ops(self, mb: int) -> list[_P2POp]:
        return self._ops(ActionKind.SEND_F, mb, self.is_last, self.stage_index + 1)

    def get_bwd_recv_ops(self, mb: int) -> list[_P2POp]:
        return self._ops(ActionKind.RECV_B, mb, self.is_last, self.stage_index + 1)

    def get_bwd_send_ops(self, mb: int) -> list[_P2POp]:
        return self._ops(ActionKind.SEND_B, mb, self.is_first, self.stage_index - 1)

    def batch_p2p(self, ops: list[_P2POp], desc: str | None = None) -> list[int]:
        """torch's ``_batch_p2p``, recorded: the ops posted as one batch; its "works" are the batch's id."""
        if not ops:
            return []
        batch, self.batches = self.batches, self.batches + 1
        self.rows += [(int(op.kind), op.stage, op.microbatch, -1, batch, -1) for op in ops]
        return [batch]

    def wait_batch_p2p(self, works: list[int]) -> None:
        self.rows += [(int(ActionKind.WAIT), -1, -1, -1, batch, -1) for batch in works]

    def clear_runtime_states(self) -> None:
        pass

    def perform_reduce_grad(self, *args: Any) -> None:
        pass


def _single_stage_runtime(name: str, pp_size: int, microbatches: int) -> dict[int, list[tuple[int, ...]]]:
    """What a ``PipelineScheduleSingle``'s ``_step_microbatches`` runs on each rank, in order: its computes, P2P
    batches and waits (its ``pipeline_order`` is only drawn, and torch 2.13's 1F1B one starts the last rank at F1:
    the runtime runs F0). ValueError where torch refuses the options."""
    from unittest import mock

    from torch.distributed.pipelining import schedules

    out = {}
    for rank in range(pp_size):
        stage = _RecordingStage(rank, pp_size)
        runner = schedules.get_schedule_class(name)(stage, microbatches)
        runner._stage_forward_initialized = True  # no metadata to infer: the stand-in has no tensors
        with mock.patch.object(schedules, "_batch_p2p", stage.batch_p2p), \
                mock.patch.object(schedules, "_wait_batch_p2p", stage.wait_batch_p2p):  # fmt: skip
            runner._step_microbatches()
        out[rank] = stage.rows
    return out


def _computes(rows: list[tuple[int, ...]]) -> list[Any]:
    """The compute rows of a recorded runtime as torch ``_Action`` s (for torch's FSDP lowering)."""
    from torch.distributed.pipelining.schedules import _Action, _ComputationType

    kinds = {int(ActionKind.FORWARD): _ComputationType.FORWARD, int(ActionKind.FULL_BACKWARD):
             _ComputationType.FULL_BACKWARD}  # fmt: skip
    return [_Action(row[1], kinds[row[0]], row[2]) for row in rows if row[0] in kinds]


def _with_runtime_p2p(program: PipelineProgram, recorded: dict[int, list[tuple[int, ...]]]) -> PipelineProgram:
    """``program`` (torch's lowering of the recorded computes) with its P2P rows replaced by what the runtime loop
    posts and waits for; its FSDP rows (UNSHARD first, REDUCE_GRAD and RESHARD last) kept where torch put them."""
    actions = []
    for rank, acts in enumerate(program.actions):
        compute = np.flatnonzero(np.isin(acts[:, 0], COMPUTE_KINDS))
        p2p = np.isin(acts[:, 0], P2P_KINDS)
        inside = ~p2p[compute[0] : compute[-1] + 1] & ~np.isin(acts[compute[0] : compute[-1] + 1, 0], COMPUTE_KINDS)
        if inside.any():
            raise ValueError(f"{program.schedule}: rank {rank} has FSDP actions between its computes")
        before, after = acts[: compute[0]][~p2p[: compute[0]]], acts[compute[-1] + 1 :][~p2p[compute[-1] + 1 :]]
        rows = np.concatenate([before, np.asarray(recorded[rank], np.int32).reshape(-1, len(COLUMNS)), after])
        rows.flags.writeable = False
        actions.append(rows)
    return dataclasses.replace(program, actions=tuple(actions))

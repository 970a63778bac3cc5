"""What the pipeline reports show of a simulated pipeline step, computed once for the terminal, the HTML report
(``report/pipeline_html.py``) and the Perfetto trace (``report/pipeline_trace.py``): each rank's timed actions on
its lanes, labelled with their micro-batch and stage, and the per-rank rows.

A rank's lanes (:data:`LANES`): its compute stream (F, B, I, W, OVERLAP_F_B), its sends and its receives (a
transfer's time on both ranks' lanes: the simulator times a SEND and its matching RECV as one transfer), FSDP's
all_gather (UNSHARD) and reduce_scatter (REDUCE_GRAD) streams (without FSDP they take no time and are not drawn).
RESHARD takes no time and is not drawn."""

from __future__ import annotations

import dataclasses
from typing import Any

from commsched.pipeline.actions import ActionKind
from commsched.pipeline.simulate import PipelineResult
from commsched.report.units import fmt_bytes

COMPUTE_LANE, SEND_LANE, RECV_LANE, GATHER_LANE, REDUCE_LANE = range(5)
LANES = ("compute", "send", "recv", "fsdp all_gather", "fsdp reduce_scatter")
"""a rank's lanes, in this order (indices above)"""
_LANE_OF = {
    ActionKind.FORWARD: COMPUTE_LANE, ActionKind.FULL_BACKWARD: COMPUTE_LANE, ActionKind.BACKWARD_INPUT: COMPUTE_LANE,
    ActionKind.BACKWARD_WEIGHT: COMPUTE_LANE, ActionKind.OVERLAP_F_B: COMPUTE_LANE,
    ActionKind.SEND_F: SEND_LANE, ActionKind.SEND_B: SEND_LANE, ActionKind.RECV_F: RECV_LANE,
    ActionKind.RECV_B: RECV_LANE, ActionKind.UNSHARD: GATHER_LANE, ActionKind.REDUCE_GRAD: REDUCE_LANE,
}  # fmt: skip
_COMPUTE_LETTER = {ActionKind.FORWARD: "F", ActionKind.FULL_BACKWARD: "B", ActionKind.BACKWARD_INPUT: "I",
                   ActionKind.BACKWARD_WEIGHT: "W"}  # fmt: skip


@dataclasses.dataclass(frozen=True)
class ActionSpan:
    """One timed action of one rank: ``index`` in its program, its lane, its simulated start and end (ns) and its
    label (``F3 s1``: micro-batch 3 of stage 1; ``SEND_F 3 s1``; ``UNSHARD s1``)."""

    rank: int
    index: int
    lane: int
    start_ns: int
    end_ns: int
    label: str
    kind: ActionKind
    stage: int
    microbatch: int  # -1 for the once-per-step FSDP actions


def action_label(row: Any) -> str:
    """A rank's action row (``PipelineProgram.actions[r][i]``) as the reports name it: ``F3 s1``, ``B3 s1``,
    ``W3 s1``, ``F3 s1 + B2 s6`` (an OVERLAP_F_B pair), ``SEND_F 3 s1``, ``RECV_B 3 s2``, ``UNSHARD s1``."""
    kind, stage, mb, kind2, stage2, mb2 = (int(x) for x in row)
    kind = ActionKind(kind)
    if kind == ActionKind.OVERLAP_F_B:
        return f"F{mb} s{stage} + {_COMPUTE_LETTER[ActionKind(kind2)]}{mb2} s{stage2}"
    if kind in _COMPUTE_LETTER:
        return f"{_COMPUTE_LETTER[kind]}{mb} s{stage}"
    return f"{kind.name} {mb} s{stage}" if mb >= 0 else f"{kind.name} s{stage}"


def rank_spans(result: PipelineResult, rank: int) -> list[ActionSpan]:
    """Every action of ``rank`` the simulation timed (start >= 0), in program order, but an UNSHARD or REDUCE_GRAD
    that takes no time: torch lowers them for every stage and runs them only for an FSDP-wrapped one."""
    program = result.program
    starts, ends = result.start_ns[rank].tolist(), result.end_ns[rank].tolist()
    spans = []
    for i, row in enumerate(program.actions[rank].tolist()):
        kind = ActionKind(row[0])
        if starts[i] < 0 or kind not in _LANE_OF or (_LANE_OF[kind] >= GATHER_LANE and ends[i] == starts[i]):
            continue
        spans.append(ActionSpan(rank, i, _LANE_OF[kind], starts[i], ends[i], action_label(row), kind, row[1], row[2]))
    return spans


def rank_lanes(spans: list[ActionSpan]) -> list[int]:
    """The lanes ``spans`` use, in :data:`LANES` order (the compute lane always)."""
    return sorted({COMPUTE_LANE} | {s.lane for s in spans})


def transfer_pairs(result: PipelineResult) -> list[tuple[ActionSpan, ActionSpan]]:
    """Each transfer as (its SEND span, its RECV span): SEND_F of stage s matches RECV_F of stage s + 1, SEND_B of
    stage s RECV_B of stage s - 1, for the same micro-batch."""
    sends: dict[tuple[int, int, int], ActionSpan] = {}
    recvs: dict[tuple[int, int, int], ActionSpan] = {}
    for rank in range(result.program.pp_size):
        for s in rank_spans(result, rank):
            if s.kind == ActionKind.SEND_F:
                sends[0, s.stage + 1, s.microbatch] = s
            elif s.kind == ActionKind.SEND_B:
                sends[1, s.stage - 1, s.microbatch] = s
            elif s.kind in (ActionKind.RECV_F, ActionKind.RECV_B):
                recvs[int(s.kind == ActionKind.RECV_B), s.stage, s.microbatch] = s
    return [(sends[key], recvs[key]) for key in sorted(sends) if key in recvs]


def stage_contents(stage: Any) -> str:
    """A traced stage's contents (:class:`commsched.pipeline.split.Stage`): ``emb+0-3``, ``4-7+out``."""
    span = f"{stage.layers[0]}-{stage.layers[-1]}" if len(stage.layers) > 1 else "".join(map(str, stage.layers))
    return "+".join(part for part in ("emb" if stage.first else "", span, "out" if stage.last else "") if part)


RANK_COLUMNS = ("rank", "stages", "layers", "busy", "bubble", "exposed comm", "peak memory")


def rank_rows(result: PipelineResult, stages: tuple[Any, ...] | None = None) -> list[list[str]]:
    """One row per pipeline rank (:data:`RANK_COLUMNS`): its stages, their layers (``stages``: a resolved job's;
    "-" without), busy, bubble and exposed-communication time and its peak memory."""
    s2r = result.program.stage_to_rank.tolist()
    rows = []
    for r in result.per_rank:
        mine = [s for s, rank in enumerate(s2r) if rank == r.rank]
        layers = "-" if stages is None else ", ".join(stage_contents(stages[s]) for s in mine)
        rows.append([str(r.rank), ", ".join(map(str, mine)), layers, f"{r.busy_s * 1e3:.2f} ms",
                     f"{r.bubble_s * 1e3:.2f} ms", f"{r.exposed_comm_s * 1e3:.2f} ms",
                     fmt_bytes(r.peak_memory_bytes)])  # fmt: skip
    return rows


def schedule_title(result: PipelineResult) -> str:
    """``1F1B P=4 M=8 V=1``."""
    p = result.program
    return f"{p.schedule} P={p.pp_size} M={p.microbatches} V={p.stages_per_rank}"

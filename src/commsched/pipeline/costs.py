"""What a pipeline's stages cost: compute seconds per stage and micro-batch, P2P bytes, memory; and their P2P times.

:class:`StageCosts` is the input a user (or, later, a traced stage program) gives; :func:`stage_times` checks it
against a :class:`PipelineProgram` and turns it into int64 nanosecond tables (``sim/model.py``'s rule:
``seconds_to_ns``); :func:`p2p_times_ns` times each stage boundary's transfer with the collective model's
``sendrecv`` (``cost/collectives.py``: one link step, NVLink inside a node, one NIC across nodes).
"""

from __future__ import annotations

import dataclasses
from typing import Any

import numpy as np

from commsched.cost.collectives import plan_collective
from commsched.hardware import Hardware, for_graph
from commsched.pipeline.actions import ActionKind, PipelineProgram
from commsched.sim.model import HORIZON_NS, seconds_to_ns


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageCosts:
    """Each stage's costs for one micro-batch. A time field is a number (every stage and micro-batch), a
    (stages,) or a (stages, microbatches) array; a bytes field a number or a (stages,) array.

    The backward is given whole (``backward_s``), as its two halves (``backward_input_s`` + ``backward_weight_s``,
    as torch's ``split_di_dw`` splits them; the zero-bubble schedules need them), or both; without ``backward_s`` a
    whole backward costs the two halves together."""

    forward_s: Any
    """F: the stage's forward of one micro-batch"""
    backward_s: Any = None
    """B: its whole backward"""
    backward_input_s: Any = None
    """I: the input-gradient half"""
    backward_weight_s: Any = None
    """W: the weight-gradient half"""
    overlap_f_b_s: Any = None
    """OVERLAP_F_B (DualPipeV): a forward and a backward of other micro-batches run together, a number or a
    (stages, stages) array [forward stage, backward stage]; None: one after the other (torch runs the two
    sub-actions in turn unless a custom function is registered for OVERLAP_F_B)"""
    send_bytes: Any = 0
    """the activation stage s sends to stage s + 1 per micro-batch (its gradient comes back the same size)"""
    activation_bytes: Any = 0
    """what stage s holds per micro-batch from the start of its forward to the end of its backward (B or W)"""
    static_bytes: Any = 0
    """what stage s holds all step: parameters, gradients, optimizer state"""
    backward_peak_bytes: Any = 0
    """what stage s's backward allocates beyond the activations it holds, at its peak, while a B or an I of it runs
    (the gradients of its activations; :func:`commsched.pipeline.stage_memory.backward_peak_bytes` measures it)"""
    unshard_s: Any = 0
    """UNSHARD: FSDP's all_gather of stage s's parameters, once per step (a number or (stages,) seconds)"""
    reduce_grad_s: Any = 0
    """REDUCE_GRAD: the reduction of stage s's gradients after its last backward, once per step"""


@dataclasses.dataclass(frozen=True)
class StageTimes:
    """:class:`StageCosts` checked against a program: int64 ns (stages, microbatches) tables, int64 bytes."""

    forward_ns: np.ndarray
    backward_ns: np.ndarray
    backward_input_ns: np.ndarray
    backward_weight_ns: np.ndarray
    overlap_f_b_ns: np.ndarray | None  # (stages, stages), or None: forward + backward
    send_bytes: np.ndarray  # (stages,)
    activation_bytes: np.ndarray  # (stages,)
    static_bytes: np.ndarray  # (stages,)
    backward_peak_bytes: np.ndarray  # (stages,)
    unshard_ns: np.ndarray  # (stages,)
    reduce_grad_ns: np.ndarray  # (stages,)


def _seconds_table(name: str, value: Any, shape: tuple[int, ...]) -> np.ndarray:
    """``value`` broadcast to ``shape`` (a (stages,) vector along the stages), as int64 ns; ValueError naming the
    field unless every entry is a finite number >= 0 within the simulator's horizon."""
    arr = np.asarray(value, dtype=np.float64)
    if arr.ndim == 1 and len(shape) == 2:
        arr = arr[:, None]
    try:
        arr = np.broadcast_to(arr, shape)
    except ValueError:
        raise ValueError(f"{name}: shape {np.shape(value)} does not fit {shape} (stages, microbatches)") from None
    if not np.isfinite(arr).all() or (arr < 0).any() or (arr * 1e9 >= HORIZON_NS).any():
        raise ValueError(f"{name}: expected finite seconds >= 0 and below {HORIZON_NS * 1e-9:.3g} s")
    return np.vectorize(seconds_to_ns, otypes=[np.int64])(arr) if arr.size else arr.astype(np.int64)


def _bytes_vector(name: str, value: Any, stages: int) -> np.ndarray:
    arr = np.asarray(value)
    if arr.ndim > 1 or (arr.ndim == 1 and len(arr) != stages):
        raise ValueError(f"{name}: expected a number or {stages} values (one per stage), got shape {arr.shape}")
    if not np.issubdtype(arr.dtype, np.number) or not np.isfinite(arr).all() or (arr < 0).any():
        raise ValueError(f"{name}: expected byte counts >= 0")
    return np.broadcast_to(arr.astype(np.int64), (stages,)).copy()


def stage_times(costs: StageCosts, program: PipelineProgram) -> StageTimes:
    """``costs`` as int64 ns tables for ``program``'s stages and micro-batches. ValueError naming the field when
    one is missing for the program's actions (I / W without ``backward_input_s`` / ``backward_weight_s``; B with
    no way to cost it) or malformed."""
    shape = (program.num_stages, program.microbatches)
    kinds = {int(k) for acts in program.actions for k in acts[:, 0]} | {
        int(k) for acts in program.actions for k in acts[:, 3]
    }
    split = costs.backward_input_s is not None and costs.backward_weight_s is not None
    if (ActionKind.BACKWARD_INPUT in kinds or ActionKind.BACKWARD_WEIGHT in kinds) and not split:
        raise ValueError(f"backward_input_s, backward_weight_s: {program.schedule} splits the backward into I and W "
                         "actions; give both halves")  # fmt: skip
    if costs.backward_s is None and not split:
        raise ValueError("backward_s: expected the whole backward's seconds, or backward_input_s and backward_weight_s")
    fwd = _seconds_table("forward_s", costs.forward_s, shape)
    b_in = _seconds_table("backward_input_s", 0 if not split else costs.backward_input_s, shape)
    b_w = _seconds_table("backward_weight_s", 0 if not split else costs.backward_weight_s, shape)
    bwd = b_in + b_w if costs.backward_s is None else _seconds_table("backward_s", costs.backward_s, shape)
    pair = None
    if costs.overlap_f_b_s is not None:
        stages = program.num_stages
        pair = _seconds_table("overlap_f_b_s", costs.overlap_f_b_s, (stages, stages))
    return StageTimes(fwd, bwd, b_in, b_w, pair, _bytes_vector("send_bytes", costs.send_bytes, shape[0]),
                      _bytes_vector("activation_bytes", costs.activation_bytes, shape[0]),
                      _bytes_vector("static_bytes", costs.static_bytes, shape[0]),
                      _bytes_vector("backward_peak_bytes", costs.backward_peak_bytes, shape[0]),
                      _seconds_table("unshard_s", costs.unshard_s, shape[:1]),
                      _seconds_table("reduce_grad_s", costs.reduce_grad_s, shape[:1]))  # fmt: skip


def p2p_times_ns(
    program: PipelineProgram, send_bytes: np.ndarray, hardware: str | Hardware | None, ranks_between: int
) -> np.ndarray:
    """Per stage boundary s (stage s to s + 1; the gradient goes back over the same pair): the transfer's int64 ns,
    0 where both stages share a rank. Pipeline rank r is global rank ``r * ranks_between`` (PP the outermost mesh
    dimension, as torchtitan builds it), so the pair sits ``|r' - r| * ranks_between`` ranks apart and the hardware's
    placement rule says whether it crosses nodes."""
    boundaries = program.num_stages - 1
    out = np.zeros(boundaries, dtype=np.int64)
    if isinstance(ranks_between, bool) or not isinstance(ranks_between, int) or ranks_between < 1:
        raise ValueError(f"ranks_between_stages={ranks_between!r}: expected an integer >= 1")
    crossing = [s for s in range(boundaries) if program.stage_to_rank[s] != program.stage_to_rank[s + 1]]
    if not any(send_bytes[s] > 0 for s in crossing):
        return out
    if hardware is None:
        raise ValueError("hardware: needed to time the P2P transfers of send_bytes > 0 (or pass free_comm=True)")
    hw = for_graph(hardware, world_size=program.pp_size * ranks_between)
    for s in crossing:
        a, b = (int(program.stage_to_rank[s + i]) * ranks_between for i in (0, 1))
        # the collective model places a group contiguously from rank 0; a pair is on NVLink iff both ranks sit in
        # one node (the V's and the loop's wrap-around pairs too), else on the network
        same_node = a // hw.gpus_per_node == b // hw.gpus_per_node
        stride = 1 if same_node else max(abs(b - a), hw.gpus_per_node)
        plan = plan_collective("sendrecv", int(send_bytes[s]), 2, hw, stride=stride)
        out[s] = seconds_to_ns(plan.time_s)
    return out

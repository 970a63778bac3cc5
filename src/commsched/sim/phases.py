"""A training step's memory by phase: the peak of each part of the step, with the level it is measured from.

A step's peak is a maximum over its phases: the forward (to the end of the loss), the backward, the optimizer. Over
the depth L of a model whose blocks repeat, each part's memory is the level of the boundary it sits next to (what is
held there: the persistent state, the activations at the end of the forward, the gradients and the reductions in
flight at the end of the backward; each linear in L) plus the transient of the few blocks it spans (the head's, a
block's: constant in L). Which part holds the peak can change with L (llama3-405b FSDP 128 x TP 4: the backward's end
at 2 and 4 layers, its start at 126), so ``plan`` extrapolates each part along its own level
(:func:`commsched.plan.scale.extrapolate_peak`) and takes the maximum, where one line through the step's peak at two
depths is off once another part overtakes (-19 % there).

Parts (positions in the simulated order; empty ones are left out):

* ``forward_start`` / ``forward_end``: the first / second half of the forward, measured from the persistent bytes /
  the end of the forward (the memory after the loss);
* ``backward_start`` / ``backward_end``: the first / second half of the backward, measured from the end of the
  forward / the end of the backward (the most held from its last matmul to the optimizer's first op: DDP and HSDP
  wait their gradient all-reduces there);
* ``optimizer``: from the optimizer's first op to the end, measured from its own peak (a fixed set of multi-tensor
  ops over every parameter: linear in L as a whole).

Halves, not single blocks: at 2K layers each half holds a block that is neither the first nor the last of its phase
(at K = 2 none is: under FSDP2 the backward's second block runs beside the first one's reduce-scatter, the last one
beside the embedding's all-gather), so ``plan`` takes each part's transient at 2K and only its level's slope from K;
the blocks in between sit between the two halves' (levels linear in the block's index), so the halves bound them.
An order that is not the same for every block (``optimize``'s) is only approximately so.

The forward ends at the loss: the OUTPUT node's first input, a 0-d tensor, in a training step (the zoo's step returns
``[loss, *gradients]``); a step without one (inference) is all forward. The optimizer starts where the framework's
order ends the backward (:func:`commsched.passes.baselines.framework.backward_end`).
"""

from __future__ import annotations

import numpy as np

from commsched.ir.graph import Graph, OpKind
from commsched.memory.liveness import MemoryProfile
from commsched.passes.baselines.framework import backward_end

PARTS = ("forward_start", "forward_end", "backward_start", "backward_end", "optimizer")
"""the parts of a step :func:`phase_peaks` measures, in step order"""


def loss_node(g: Graph) -> int | None:
    """The step's loss (the OUTPUT node's first input, a 0-d tensor, in a training step), or None (no backward)."""
    if g.meta.get("mode", "train") != "train":
        return None
    outputs = np.flatnonzero(g.kinds == OpKind.OUTPUT)
    if not len(outputs) or not len(g.inputs(int(outputs[0]))):
        return None
    loss = int(g.inputs(int(outputs[0]))[0])
    buffers = g.buffers(loss)
    return loss if len(buffers) == 1 and buffers[0].shape == () else None


def phase_bounds(g: Graph, order: np.ndarray) -> tuple[int, int]:
    """``(forward_end, backward_end)``: the positions in ``order`` where the backward and the optimizer start
    (``len(order)`` when there is none). O(N)."""
    n = len(order)
    loss = loss_node(g)
    if loss is None:
        return n, n
    forward_end = int(np.flatnonzero(np.asarray(order) == loss)[0]) + 1
    return forward_end, max(forward_end, backward_end(g, np.asarray(order)))


def phase_peaks(g: Graph, memory: MemoryProfile) -> dict[str, tuple[int, int]]:
    """Per part of the step (:data:`PARTS`, the nonempty ones): ``(level_bytes, peak_bytes)``, the memory at the
    boundary the part is measured from and the most in use while one of its nodes runs (``memory.curve_bytes``).
    The maximum of the peaks is ``memory.peak_bytes``. O(N)."""
    n = len(memory.order)
    curve, after = memory.curve_bytes, memory.after_bytes
    forward_end, optimizer_start = phase_bounds(g, memory.order)
    start_level = memory.persistent_bytes
    end_of_forward = int(after[forward_end - 1]) if forward_end else start_level
    end_of_backward = _held_at_end(g, memory, forward_end, optimizer_start)
    spans = {}
    half = forward_end // 2
    spans["forward_start"] = (start_level, 0, half)
    spans["forward_end"] = (end_of_forward, half, forward_end)
    half = (forward_end + optimizer_start) // 2
    spans["backward_start"] = (end_of_forward, forward_end, half)
    spans["backward_end"] = (end_of_backward, half, optimizer_start)
    spans["optimizer"] = (None, optimizer_start, n)
    out = {}
    for part, (level, lo, hi) in spans.items():
        if hi > lo:
            peak = int(curve[lo:hi].max())
            out[part] = (peak if level is None else int(level), peak)
    return out


def _held_at_end(g: Graph, memory: MemoryProfile, lo: int, hi: int) -> int:
    """The most memory held (after a node's frees) from the last kernel with a flop formula (a matmul, attention) of
    positions ``[lo, hi)`` to ``hi``: what the backward holds at its end with its gradient reductions in flight (DDP
    and HSDP wait all of theirs there: those buffers grow with the depth). The persistent bytes when there is no
    kernel."""
    kernels = np.flatnonzero(g.kinds[memory.order[lo:hi]] == OpKind.COMPUTE)
    return int(memory.after_bytes[lo + int(kernels[-1]) : hi].max()) if len(kernels) else memory.persistent_bytes

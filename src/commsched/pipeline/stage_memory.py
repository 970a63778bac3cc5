"""A traced stage's backward transient memory: what its backward allocates beyond the activations it holds.

The pipeline simulator holds a stage's ``activation_bytes`` per micro-batch from its forward to its backward; while
the backward runs it also allocates the gradients of those activations (and the temporaries that make them), freed
as it goes. :func:`backward_peak_bytes` measures the most of that at once on the traced graph, with the memory
model's semantics (:func:`commsched.memory.liveness.memory_profile`: per storage, allocated at its producer, freed
after its last user), counting only storages the step frees: the parameter gradients (which accumulate into the
stage's ``.grad``, counted in its static bytes) and the input gradient it sends are outputs and stay out.
"""

from __future__ import annotations

import numpy as np

from commsched.memory.liveness import liveness, memory_profile
from commsched.pipeline.stages import TracedStage


def backward_peak_bytes(traced: TracedStage) -> int:
    """The most bytes ``traced`` 's backward has allocated at once beyond what is alive when its forward ends
    (:class:`commsched.pipeline.StageCosts` ``backward_peak_bytes``); 0 without a backward. O(N + E)."""
    g = traced.graph
    forward = np.flatnonzero(traced.forward)
    if len(forward) == 0 or forward[-1] == len(g) - 1:
        return 0
    profile = memory_profile(g)  # the traced order: every forward node before the backward's
    lv = liveness(g)
    freeable = lv.freeable
    pos = np.arange(len(g))
    alloc, free = profile.alloc_position[freeable], profile.free_position[freeable]
    sizes = lv.storage_bytes[freeable]
    # bytes alive while each node runs (after its allocations, before its frees): alloc <= p <= free
    started = np.bincount(alloc, weights=sizes, minlength=len(g))
    ended = np.bincount(free, weights=sizes, minlength=len(g))
    during = np.cumsum(started) - np.cumsum(ended) + ended
    end_of_forward = int(forward[-1])
    held = float(during[end_of_forward] - ended[end_of_forward])  # alive after the forward's last node
    peak = float(during[pos > end_of_forward].max())
    return max(round(peak - held), 0)

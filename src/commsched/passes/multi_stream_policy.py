"""Node policies and the role-to-stream mapping of the ``multi_stream`` pass.

Every node gets a *role* that says which streams may run it and which resources it holds while it runs:

* ``compute``: kernels, views, waits, inputs and the output; run on a compute stream and hold it.
* ``comm``: collectives; issued from the comm role's stream (exactly one, so that every rank issues its collectives
  in one program-forced order), then run on their process group's FIFO comm stream.
* ``hybrid``: fused compute + communication kernels (async-TP ``symm_mem.fused_all_gather_matmul`` and friends,
  symmetric-memory all-reduce kernels): they run on a compute stream and also need the interconnect, so no
  collective runs beside them. Classified by target name.
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

import numpy as np

from commsched.ir import Graph, OpKind

ROLES = ("compute", "comm", "hybrid")
ROLE_COMPUTE, ROLE_COMM, ROLE_HYBRID = 0, 1, 2

# torch's fused compute + communication kernels (torch.ops.symm_mem): each moves data over NVLink from inside a
# kernel on the calling stream, so it needs an SM partition and the links at once
DEFAULT_HYBRID_TARGETS: tuple[str, ...] = (
    "symm_mem.fused_all_gather_matmul",
    "symm_mem.fused_all_gather_scaled_matmul",
    "symm_mem.fused_matmul_reduce_scatter",
    "symm_mem.fused_scaled_matmul_reduce_scatter",
    "symm_mem.one_shot_all_reduce",
    "symm_mem.two_shot_all_reduce",
    "symm_mem.multimem_",
    "symm_mem.reduce_scatter_out",
    "symm_mem._low_contention_",
)


@dataclass(frozen=True)
class StreamMap:
    """Stream ids per role (index ``ROLE_*``); the comm role has exactly one stream."""

    by_role: tuple[tuple[int, ...], tuple[int, ...], tuple[int, ...]]

    @property
    def compute_streams(self) -> tuple[int, ...]:
        return tuple(sorted(set(self.by_role[ROLE_COMPUTE]) | set(self.by_role[ROLE_HYBRID])))

    @property
    def num_streams(self) -> int:
        return 1 + max(s for ids in self.by_role for s in ids)


def resolve_stream_map(compute_streams: int, role_streams: Mapping[str, Sequence[int]] | None) -> StreamMap:
    """The role -> stream ids mapping: by default compute on ``0..compute_streams-1``, hybrid like compute, and the
    collectives issued from a stream of their own (``compute_streams``). ``role_streams`` overrides any role."""
    if compute_streams < 1:
        raise ValueError(f"compute_streams={compute_streams}: expected at least 1 compute stream")
    default = {
        "compute": tuple(range(compute_streams)),
        "comm": (compute_streams,),
        "hybrid": tuple(range(compute_streams)),
    }
    given = dict(role_streams or {})
    unknown = sorted(set(given) - set(ROLES))
    if unknown:
        raise ValueError(f"role_streams: unknown role(s) {unknown}; expected some of {list(ROLES)}")
    if "compute" in given and "hybrid" not in given:
        given["hybrid"] = given["compute"]
    by_role = []
    for role in ROLES:
        raw = given.get(role, default[role])
        if isinstance(raw, (int, np.integer)):
            raw = (int(raw),)
        ids = tuple(dict.fromkeys(int(s) for s in raw))
        if not ids:
            raise ValueError(f"role_streams[{role!r}]: expected at least one stream id")
        if min(ids) < 0:
            raise ValueError(f"role_streams[{role!r}]={list(ids)}: stream ids must be >= 0")
        by_role.append(ids)
    if len(by_role[ROLE_COMM]) != 1:
        raise ValueError(
            f"role_streams['comm']={list(by_role[ROLE_COMM])}: expected exactly one stream; collectives issued from "
            "several streams may be issued in different orders on different ranks (a hang)"
        )
    used = sorted({s for ids in by_role for s in ids})
    if used != list(range(len(used))):
        raise ValueError(f"role_streams: stream ids {used} must be contiguous from 0 (the simulator numbers them)")
    return StreamMap((by_role[0], by_role[1], by_role[2]))


def node_roles(g: Graph, hybrid_targets: Sequence[str] = DEFAULT_HYBRID_TARGETS) -> np.ndarray:
    """Per node: ``ROLE_COMPUTE``, ``ROLE_COMM`` (collectives) or ``ROLE_HYBRID`` (kernels whose target starts with
    one of ``hybrid_targets``). int8."""
    roles = np.full(len(g), ROLE_COMPUTE, np.int8)
    roles[g.coll_type >= 0] = ROLE_COMM
    prefixes = tuple(hybrid_targets)
    if prefixes:
        kernels = np.flatnonzero(np.isin(g.kinds, (OpKind.COMPUTE, OpKind.OTHER)))
        for i in kernels.tolist():
            if g.targets[i].startswith(prefixes):
                roles[i] = ROLE_HYBRID
    return roles

"""The one-shot symmetric-memory all_reduce (``torch.ops.symm_mem.one_shot_all_reduce``): its cost, and when a
sum all_reduce should be lowered to it instead of NCCL.

Every rank reads the whole buffer of each peer over NVLink (the buffers live in symmetric memory) and reduces
locally in one kernel: no ring steps, so for small buffers it beats NCCL's latency. It blocks the stream it runs on
(no wait). time = latency + (n - 1) * nbytes / p2p_read_bandwidth.

Inductor chooses it for sum all_reduces of at most ``one_shot_all_reduce_threshold_bytes`` (128 KiB by default,
torch/_inductor/config.py ``_collective``) on groups with symmetric memory; we choose it under the same threshold
where the group stays inside one NVLink node, the profile has public one-shot numbers, and it is faster than the
NCCL-like plan. Constants per profile below, with their sources.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from commsched.cost.collectives import plan_collective
from commsched.cost.model import LinkClass
from commsched.hardware import Hardware

ONE_SHOT_TARGET = "symm_mem.one_shot_all_reduce.default"
ONE_SHOT_THRESHOLD_BYTES = 128 * 1024  # torch._inductor.config._collective.one_shot_all_reduce_threshold_bytes


@dataclasses.dataclass(frozen=True)
class OneShotProfile:
    latency_s: float  # launch, barrier and the first peer read
    read_bandwidth_bytes_per_s: float  # one GPU reading its peers' buffers over NVLink
    source: str


# yifuwang/symm-mem-recipes PR #3 ("Add all reduce benchmark", 2025-06), column dist_1shot (torch's
# symm_mem.one_shot_all_reduce), bf16, 8 KiB .. 256 KiB: 16.4, 16.5, 17.0, 18.0, 20.3, 25.2 us against NCCL's
# 21.8-24.4 us, on the repository's 8 x H100 NVSwitch machine. Fit (within 2 % at every point): 16 us + 7 peer reads
# at 205 GB/s (0.46 of the 450 GB/s NVLink 4 link). H200 has the same NVLink 4 and SM90 kernels.
_H100 = OneShotProfile(16e-6, 205e9, "yifuwang/symm-mem-recipes PR #3, dist_1shot, 8xH100 (fit)")
ONE_SHOT_PROFILES: dict[str, OneShotProfile] = {"h100-sxm": _H100, "h200-sxm": _H100}


def one_shot_all_reduce_time_s(nbytes: int, group_size: int, hardware: Hardware, *, stride: int = 1) -> float | None:
    """Seconds for a one-shot all_reduce of ``nbytes`` on ``group_size`` ranks, or None where it cannot run
    (no public numbers for the profile, or the group spans nodes: symmetric memory needs NVLink peers)."""
    prof = ONE_SHOT_PROFILES.get(hardware.name)
    if prof is None or group_size < 2:
        return None
    _, nodes = hardware.placement(group_size, stride)
    if nodes > 1:
        return None
    return prof.latency_s + (group_size - 1) * nbytes / prof.read_bandwidth_bytes_per_s


def choose_all_reduce_lowering(
    nbytes: int,
    group_size: int,
    hardware: Hardware,
    *,
    reduce_op: str = "sum",
    stride: int = 1,
    threshold_bytes: int = ONE_SHOT_THRESHOLD_BYTES,
) -> str:
    """``"one_shot"`` for a sum all_reduce under ``threshold_bytes`` that can run one-shot and is faster than the
    NCCL-like plan on ``hardware``; else ``"nccl"``."""
    if reduce_op != "sum" or nbytes > threshold_bytes:
        return "nccl"
    t = one_shot_all_reduce_time_s(nbytes, group_size, hardware, stride=stride)
    if t is None:
        return "nccl"
    return (
        "one_shot" if t < plan_collective("all_reduce", nbytes, group_size, hardware, stride=stride).time_s else "nccl"
    )


def apply_one_shot_costs(g, hw: Hardware, node_s: np.ndarray, latency_s: np.ndarray, link: np.ndarray,
                         algorithms: dict[int, str]) -> None:  # fmt: skip
    """Cost the graph's one-shot all_reduce nodes with :func:`one_shot_all_reduce_time_s` (in place). Where the
    profile cannot run one-shot, the NCCL-like plan the caller already set stays, and the algorithm says so."""
    for i in g.collectives.tolist():
        if g.targets[i] != ONE_SHOT_TARGET:
            continue
        grp = g.groups[int(g.coll_group[i])]
        t = one_shot_all_reduce_time_s(int(g.comm_bytes[i]), grp.size, hw, stride=grp.stride)
        if t is None:
            algorithms[i] = f"{algorithms.get(i, 'nccl')} (one-shot unsupported on {hw.name})"
            continue
        prof = ONE_SHOT_PROFILES[hw.name]
        node_s[i], latency_s[i], link[i] = t, min(prof.latency_s, t), int(LinkClass.INTRA_NODE)
        algorithms[i] = "one_shot/symm_mem"

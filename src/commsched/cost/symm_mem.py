"""Symmetric memory over NVLink: the one-shot all_reduce (``torch.ops.symm_mem.one_shot_all_reduce``: its cost,
and when a sum all_reduce should be lowered to it instead of NCCL), and the copy-engine transfers of async TP
(:mod:`commsched.rewrites.async_tp`: their cost, where they can run).

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


# ---------------------------------------------------------------------- async TP: copy-engine transfers
COPY_ENGINE_TARGET = "symm_mem.copy_engine_p2p"
"""an async-TP transfer: one peer's chunk copied over NVLink by the copy engines (no SMs; ``cudaMemcpyAsync``
between symmetric-memory buffers in torch's ``_pipelined_all_gather_and_consume`` /
``_pipelined_produce_and_all2all``)"""
JOIN_TARGET = "symm_mem.join"
"""the pieces of a fused op's output laid out as one tensor: torch's kernels write them in place into their slices
of the output (``out=``), so the join costs nothing"""


@dataclasses.dataclass(frozen=True)
class CopyEngineProfile:
    latency_s: float  # a copy's launch and the peer signal it waits on
    bandwidth_bytes_per_s: float  # one GPU-to-GPU copy-engine copy over NVLink
    source: str


# NVIDIA/nccl#1264 (HGX H100 SXM, NVLink 4 through NVSwitch), CUDA's p2pBandwidthLatencyTest: "Unidirectional
# P2P=Enabled Bandwidth (P2P Writes)", a cudaMemcpyPeerAsync between two GPUs (a copy-engine copy), 371-377 GB/s for
# every pair; 376 GB/s taken. Latency: twice p2pBandwidthLatencyTest's "P2P=Enabled Latency (P2P Writes)" of an
# NVLink system, 1.8-2.3 us (NVIDIA/cuda-samples#230): the copy's first bytes and the signal that tells the consumer
# (torch's ``_pipelined_all_gather_and_consume`` waits on one per step); not fitted. H200 and the 96 GB H100 SXM
# (HBM2e, 500 W: Grand Teton) have the same NVLink 4 and copy engines.
_H100_CE = CopyEngineProfile(4e-6, 376e9, "NVIDIA/nccl#1264 and NVIDIA/cuda-samples#230 p2pBandwidthLatencyTest")
COPY_ENGINE_PROFILES: dict[str, CopyEngineProfile] = {"h100-sxm": _H100_CE, "h100-sxm-96g": _H100_CE,
                                                      "h200-sxm": _H100_CE}  # fmt: skip


def copy_engine_refusal(hardware: Hardware, group_size: int, stride: int = 1) -> str | None:
    """Why async TP's copy-engine transfers cannot run for a group of ``group_size`` ranks on ``hardware`` (one
    line), or None: they need NVLink peers with symmetric memory in one node and a profile with public copy-engine
    numbers."""
    if hardware.name not in COPY_ENGINE_PROFILES:
        known = ", ".join(sorted(COPY_ENGINE_PROFILES))
        return (f"{hardware.name} has no NVLink symmetric-memory copy-engine numbers (async TP runs on NVLink GPUs "
                f"with symmetric memory; profiles with numbers: {known})")  # fmt: skip
    _, nodes = hardware.placement(group_size, stride)
    if nodes > 1:
        return f"the TP group of {group_size} ranks spans {nodes} nodes: symmetric memory needs NVLink peers"
    return None


def apply_copy_engine_costs(g, hw: Hardware, node_s: np.ndarray, latency_s: np.ndarray, link: np.ndarray,
                            algorithms: dict[int, str]) -> np.ndarray | None:  # fmt: skip
    """Cost the graph's copy-engine transfers (in place: ``latency + bytes / bandwidth``, on the NVLink link class)
    and joins (nothing); returns the per-node copy-engine mask (``CostEstimate.copy_engine``), None when the graph
    has none. ValueError (one line) where they cannot run (:func:`copy_engine_refusal`)."""
    ce = np.asarray([t == COPY_ENGINE_TARGET for t in g.targets], bool)
    joins = [i for i, t in enumerate(g.targets) if t == JOIN_TARGET]
    node_s[joins] = 0.0
    if not ce.any():
        return None
    for i in np.flatnonzero(ce).tolist():
        grp = g.groups[int(g.coll_group[i])]
        why = copy_engine_refusal(hw, grp.size, grp.stride)
        if why is not None:
            raise ValueError(f"async TP transfer {g.names[i]!r}: {why}")
        prof = COPY_ENGINE_PROFILES[hw.name]
        node_s[i] = prof.latency_s + int(g.comm_bytes[i]) / prof.bandwidth_bytes_per_s
        latency_s[i], link[i] = prof.latency_s, int(LinkClass.INTRA_NODE)
        algorithms[i] = "copy_engine/symm_mem"
    return ce

"""What a real pipeline run measures for its prediction, and the prediction.

Once per round of the run, between the timed steps: every rank times each of its stages' forward and backward of one
micro-batch (one rank at a time), then its first split's stages over a fixed window alone and with all ranks
computing at once (:func:`cpu_share_round`), and ranks 0 and 1 time a P2P transfer. The costs then see the same
load as the steps do, which on a shared machine moves a lot within a run. The medians over the rounds are the
:class:`StageCost` s, the :class:`P2PCalibration` and the cores the ranks share that the prediction is fed
(``pipeline_run.predict``: the pipeline simulator with the ranks' compute sharing those cores).
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from commsched.report.run_report import StepTimes
from commsched.runtime.pipeline_stage import ZooStage, stage_loss

SMALL_BYTES = 4
"""the P2P probe's small message: its time is the link's fixed cost per transfer"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class StageCost:
    """One stage's measured costs for one micro-batch (medians over the run's rounds)."""

    stage: int
    rank: int
    layers: int
    forward_s: float
    backward_s: float
    send_bytes: int


@dataclasses.dataclass(frozen=True, kw_only=True)
class P2PCalibration:
    """The link between pipeline ranks 0 and 1 on the receiver's clock, medians over the rounds: ``latency_s`` (a
    4-byte message) and ``bytes_per_s`` (so that ``latency_s + send_bytes / bytes_per_s`` is the hidden state's
    time, ``transfer_s``)."""

    send_bytes: int
    transfer_s: float
    latency_s: float
    bytes_per_s: float

    @classmethod
    def fit(cls, send_bytes: int, small_s: float, transfer_s: float) -> P2PCalibration:
        extra_s = transfer_s - small_s
        if extra_s <= 0:  # the larger message was no slower: all of it is the fixed cost
            return cls(send_bytes=send_bytes, transfer_s=transfer_s, latency_s=transfer_s, bytes_per_s=math.inf)
        bytes_per_s = (send_bytes - SMALL_BYTES) / extra_s
        return cls(send_bytes=send_bytes, transfer_s=transfer_s, latency_s=small_s, bytes_per_s=bytes_per_s)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ScheduleRun:
    """One schedule: measured steps, the predictions, and the numerics of its first step."""

    schedule: str
    stages_per_rank: int
    measured: StepTimes
    predicted_s: float
    """simulated with the measured stage costs and P2P link, the ranks' compute sharing the cores they had
    (:func:`shared_cores`)"""
    predicted_dedicated_s: float
    """the same simulation with a processor per rank"""
    empty_step_s: float
    """the measured step of the same schedule over empty stages (torch's runtime and the P2P alone)"""
    action_overhead_s: float
    """what the runtime adds to each F and B, fitted to ``empty_step_s``"""
    predicted_bubble_fraction: float
    predicted_profile_s: float | None
    """simulated with the profile's roofline of the traced stages (and the measured link); None if not asked"""
    stages: tuple[StageCost, ...]
    loss: float
    """the first step's loss: the mean of its micro-batches' (equal sizes: the batch's mean)"""
    reference_loss: float
    """the unpipelined model's loss on the same batch"""
    max_grad_error: float
    """the largest |pipelined - unpipelined| gradient entry over the largest reference entry, per parameter"""
    round_steps_s: tuple[float, ...] = ()
    """``measured``'s steps in the order of their rounds (every schedule runs one step per round)"""

    @property
    def prediction_error(self) -> float:
        return self.predicted_s / self.measured.median_s - 1.0

    @property
    def loss_error(self) -> float:
        return abs(self.loss - self.reference_loss) / max(abs(self.reference_loss), 1e-30)


def paired_ratio(run: ScheduleRun, ref: ScheduleRun) -> float:
    """``run``'s measured step over ``ref``'s: the median of their per-round ratios (the ratio of medians when
    the rounds are not known)."""
    if run.round_steps_s and len(run.round_steps_s) == len(ref.round_steps_s):
        return statistics.median(a / b for a, b in zip(run.round_steps_s, ref.round_steps_s, strict=True))
    return run.measured.median_s / ref.measured.median_s


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineRunReport:
    """Every schedule of a real pipeline run (rank 0's)."""

    preset: str
    layers: int
    seq_len: int
    batch: int
    dtype: str
    pp_size: int
    microbatches: int
    iters: int
    warmup: int
    threads: int
    hardware: str
    p2p: P2PCalibration
    cores: float
    """the cores the ranks shared: ranks / (their stages' slowdown computing all at once over alone), in [1, P]"""
    core_points: tuple[tuple[float, float], ...] = ()
    """(ranks computing at once, the cores they had): as many ranks as the run may use cores, then all
    (:func:`shared_cores`), the simulation's ``host_cores``"""
    schedules: dict[str, ScheduleRun]
    network: str | None = None

    def ratios(self, base: str | None = None) -> dict[str, tuple[float, float]]:
        """Per schedule: (predicted, measured) step over ``base``'s (default: the first schedule). The measured
        ratio is the median over rounds of the two steps' ratio in the same round: load from other processes that
        comes and goes between rounds slows both steps of a round, where it would skew a ratio of medians."""
        ref = self.schedules[base or next(iter(self.schedules))]
        return {name: (r.predicted_s / ref.predicted_s, paired_ratio(r, ref)) for name, r in self.schedules.items()}

    def to_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        if math.isinf(self.p2p.bytes_per_s):  # JSON has no infinity: the larger message was no slower
            out["p2p"]["bytes_per_s"] = None
        for name, run in self.schedules.items():
            out["schedules"][name].update(prediction_error=run.prediction_error, loss_error=run.loss_error)
        out["ratios"] = {k: {"predicted": p, "measured": m} for k, (p, m) in self.ratios().items()}
        return out


# ---------------------------------------------------------------------------------------------------- rounds
class StageTimer:
    """Times one stage's forward and backward of one micro-batch on fixed inputs: the forward as torch's schedule
    runs it (the last stage's with the loss), the backward from a random output gradient (the last stage's from the
    loss). Each timed part starts at a barrier: every rank calls :meth:`time_once` for the same number of stages."""

    def __init__(self, module: ZooStage, labels: torch.Tensor) -> None:
        self.module, self.labels, self.loss = module, labels, stage_loss
        self.x = module.input_example()
        spec = module.spec
        self.grad = None if module.stage.last else torch.randn(module.shapes.tokens, spec.model.dim, dtype=spec.dtype)

    def time_once(self, *, sync: bool = True) -> tuple[float, float]:
        """(forward, backward) seconds, one of each; ``sync``: each timed part starts at a barrier (every rank
        calls it for the same number of stages), else this rank times alone (:func:`one_rank_at_a_time`)."""
        forward_s, out = self._forward(sync)
        if sync:
            dist.barrier()
        t0 = time.perf_counter()
        torch.autograd.backward(out, self.grad)
        backward_s = time.perf_counter() - t0
        self.module.zero_grad(set_to_none=True)
        return forward_s, backward_s

    def _forward(self, sync: bool) -> tuple[float, torch.Tensor]:
        if sync:
            dist.barrier()
        t0 = time.perf_counter()
        out = self.module(self.x)
        if self.module.stage.last:
            out = self.loss(out, self.labels)
        return time.perf_counter() - t0, out


def one_rank_at_a_time(fn: Callable[[], Any]) -> Any:
    """``fn()`` on each rank in turn (rank order), the others waiting at a barrier; every rank calls it."""
    out = None
    for r in range(dist.get_world_size()):
        if r == dist.get_rank():
            out = fn()
        dist.barrier()
    return out


def available_cores() -> int:
    """The CPUs this process may run on (its affinity mask; ``os.cpu_count()`` where the platform has none)."""
    getaffinity = getattr(os, "sched_getaffinity", None)
    return len(getaffinity(0)) if getaffinity is not None else (os.cpu_count() or 1)


def passes_s(timers: list[StageTimer], window_s: float) -> float:
    """Seconds per pass over ``timers`` (each stage's forward and backward, this rank alone in its timing) when
    passes repeat for ``window_s``: the passes that ended inside the window, whose time every rank computing at once
    spends fully contended; one pass if it is longer than the window."""
    t0 = time.perf_counter()
    deadline, passes, last = t0 + window_s, 0, t0
    while True:
        for t in timers:
            t.time_once(sync=False)
        now = time.perf_counter()
        if now > deadline:
            return (last - t0) / passes if passes else now - t0
        passes, last = passes + 1, now


def cpu_share_round(timers: list[StageTimer], window_s: float, subset: int) -> tuple[float, float]:
    """How much slower this rank's stages run with other ranks computing at once than alone: each rank repeats its
    stages for ``window_s`` alone (one rank at a time), then ranks below ``subset`` together, then all together
    (:func:`passes_s`); every rank calls it. Returns (slowdown among the subset, or NaN on a rank outside it or when
    the subset is every rank; slowdown with all). Fixed windows keep every rank computing through the whole window,
    so each ratio is full contention: the ranks' share of the cores, context switches and cache misses included
    (:func:`shared_cores`)."""
    alone_s = max(one_rank_at_a_time(lambda: passes_s(timers, window_s)), 1e-9)
    some = math.nan
    if subset < dist.get_world_size():
        dist.barrier()
        if dist.get_rank() < subset:
            some = passes_s(timers, window_s) / alone_s
    dist.barrier()
    return some, passes_s(timers, window_s) / alone_s


def shared_cores(pp_size: int, subset: int, slowdowns: list[tuple[float, float]]) -> tuple[tuple[float, float], ...]:
    """The cores the ranks effectively have, as the stream model's points (ranks computing at once, cores): ``subset``
    ranks over their median slowdown among themselves (when fewer than ``pp_size``), ``pp_size`` over the median with
    all (``slowdowns``: every rank's :func:`cpu_share_round`); each within [1, ranks] and never more than this
    process may use (:func:`available_cores`)."""
    cap = float(available_cores())

    def point(ranks: int, slowdown: float) -> tuple[float, float]:
        return float(ranks), min(max(ranks / max(slowdown, 1e-9), 1.0), float(ranks), cap)

    everyone = point(pp_size, statistics.median(s[1] for s in slowdowns))
    if subset >= pp_size:
        return (everyone,)
    return point(subset, statistics.median(s[0] for s in slowdowns[:subset])), everyone


def p2p_round(send_bytes: int, reps: int) -> tuple[float, float]:
    """Rank 0 sends ``reps`` messages to rank 1 back to back, of 4 bytes and then of ``send_bytes``; every rank
    calls it. Returns the seconds per message of each size on this rank's clock (the receiver's is the one to use:
    a send may return before its bytes arrive)."""
    rank, out = dist.get_rank(), []
    for nbytes in (SMALL_BYTES, send_bytes):
        buf = torch.zeros(max(nbytes // 4, 1), dtype=torch.float32)
        dist.barrier()
        t0 = time.perf_counter()
        for _ in range(reps):
            if rank == 0:
                dist.send(buf, 1)
            elif rank == 1:
                dist.recv(buf, 0)
        out.append((time.perf_counter() - t0) / reps)
    return out[0], out[1]


# ---------------------------------------------------------------------------------------------------- prediction
def p2p_hardware(profile: str, world: int, p2p: P2PCalibration):
    """``profile`` (a name or path) with one ``simple`` protocol and an intra-node link that the collective model's
    ``sendrecv`` times as measured (``latency_s + bytes / bytes_per_s``), all ``world`` ranks in one node."""
    from commsched.hardware import for_graph
    from commsched.hardware.profile import Protocol

    hw = for_graph(profile, world_size=world)
    hw = hw.with_nodes(1, max(world, hw.gpus_per_node))
    link = dataclasses.replace(hw.intra_node, link_bandwidth_bytes_per_s=p2p.bytes_per_s, ring_efficiency=1.0)
    simple = Protocol(name="simple", bandwidth_fraction=1.0, max_bus_bandwidth_bytes_per_s=math.inf,
                      base_latency_s=p2p.latency_s, intra_hop_latency_s=0.0, inter_hop_latency_s=0.0)  # fmt: skip
    return dataclasses.replace(hw, name=f"{hw.name} + measured P2P", intra_node=link, protocols=(simple,))


def medians(samples: list[tuple[float, ...]]) -> tuple[float, ...]:
    """The median of each position over ``samples``."""
    return tuple(statistics.median(col) for col in zip(*samples, strict=True))

"""Replay profiler traces: read, apply what-ifs, simulate, and put the measured and replayed numbers side by side.

The step is device work only: from the first work item's start to the last one's end (measured: the trace's
timestamps; replayed: the simulator's times). Exposed communication and the overlap ratio are Holistic Trace
Analysis' (:func:`commsched.sim.result.comm_overlap_ns`): the time communication runs while no computation does,
and the time both run over the time communication runs. Two naive estimates frame the replay's error: the sum of
all work (everything serial) and the busiest stream's work (perfect overlap, no dependencies).

Several ranks: each is replayed alone (its own streams and dependencies; ranks are not coupled), then aligned by
collective sequence, the k-th communication item of every rank being one collective, each rank's times counted from
its own step start: the rank that reaches a collective last is its straggler, and a rank's lag is the median over
collectives of how long after the first rank it got there.
"""

from __future__ import annotations

import os
from collections import Counter
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np

from commsched.replay.graph import simulate_replay
from commsched.replay.kineto import DEFAULT_COMM_PATTERNS, read_trace
from commsched.replay.whatif import Scale, apply_scales, check_scales, recost_collectives
from commsched.replay.work import COMM, COMPUTE, GAP, ReplayTrace
from commsched.sim.result import SimResult, comm_overlap_ns

REPLAY_FORMAT, REPLAY_VERSION = "commsched.replay", 1


@dataclass(frozen=True)
class Timing:
    """Step metrics of one timeline (measured or replayed); seconds."""

    step_s: float
    exposed_comm_s: float
    overlap_ratio: float
    stream_busy_s: dict[str, float]
    label_span_s: dict[str, float]
    """per user annotation (the innermost around the work's launch, or the op on a CPU trace): first start to last
    end of its device work"""


def timing(trace: ReplayTrace, start_ns: np.ndarray, dur_ns: np.ndarray) -> Timing:
    """The metrics of the module docstring for items running at ``start_ns`` for ``dur_ns``."""
    work, end_ns = trace.work, start_ns + dur_ns
    step_ns = int(end_ns[work].max() - start_ns[work].min()) if work.any() else 0
    comp, comm = trace.role == COMPUTE, trace.role == COMM
    both_ns, comm_ns = comm_overlap_ns(start_ns[comp], end_ns[comp], start_ns[comm], end_ns[comm])
    busy = np.bincount(trace.stream[work], weights=dur_ns[work], minlength=len(trace.streams))
    streams = {name: float(busy[s]) * 1e-9 for s, name in enumerate(trace.streams) if trace.device[s]}
    labels = np.asarray(trace.labels, dtype=object)
    labelled = work & (labels != "")
    keys, inverse = np.unique(labels[labelled].astype(str), return_inverse=True)
    first = np.full(len(keys), np.iinfo(np.int64).max)
    last = np.full(len(keys), np.iinfo(np.int64).min)
    np.minimum.at(first, inverse, start_ns[labelled])
    np.maximum.at(last, inverse, end_ns[labelled])
    spans = {str(k): float(b - a) * 1e-9 for k, a, b in zip(keys, first, last, strict=True)}
    overlap = both_ns / comm_ns if comm_ns else 0.0
    return Timing(step_ns * 1e-9, (comm_ns - both_ns) * 1e-9, overlap, streams, spans)


def exposed_per_item_ns(trace: ReplayTrace, start_ns: np.ndarray, end_ns: np.ndarray) -> np.ndarray:
    """Per item: the time a communication item runs while no computation does (0 for every other item). Their sum
    can pass :class:`Timing`'s exposed communication, where communication items overlap each other. O(N log N)."""
    comp, comm = trace.role == COMPUTE, np.flatnonzero(trace.role == COMM)
    out = np.zeros(len(trace), np.int64)
    order = np.argsort(start_ns[comp], kind="stable")
    a, b = start_ns[comp][order], end_ns[comp][order]
    if len(a):
        b = np.maximum.accumulate(b)
    begins = np.flatnonzero(np.r_[True, a[1:] > b[:-1]]) if len(a) else np.zeros(0, np.int64)
    lo, hi = a[begins], b[np.r_[begins[1:] - 1, len(a) - 1]] if len(a) else a  # the union of compute, disjoint
    before = np.r_[0, np.cumsum(hi - lo)]  # compute time in the blocks before each block

    def covered(t: np.ndarray) -> np.ndarray:
        """Compute time up to each ``t``."""
        k = np.searchsorted(lo, t, side="right") - 1
        kk = np.maximum(k, 0)
        return np.where(k >= 0, before[kk] + np.minimum(t, hi[kk]) - lo[kk], 0) if len(lo) else np.zeros_like(t)

    s, e = start_ns[comm], end_ns[comm]
    out[comm] = (e - s) - (covered(e) - covered(s))
    return out


@dataclass(frozen=True)
class ReplayReport:
    """One trace: measured and replayed timings, the naive estimates, what was changed; ``sim`` for renderers."""

    trace: ReplayTrace
    measured: Timing
    replayed: Timing
    sum_of_work_s: float
    longest_stream_s: float
    scales: tuple[Scale, ...]
    hardware: str | None
    recosted: int
    sim: SimResult = field(repr=False)

    @property
    def error(self) -> float:
        """(replayed - measured) / measured step."""
        m = self.measured.step_s
        return (self.replayed.step_s - m) / m if m else 0.0

    def to_dict(self) -> dict[str, Any]:
        t = self.trace
        return {
            "trace": str(t.path), "rank": t.rank, "mode": t.mode, "events": t.events, "items": len(t),
            "work_items": int(t.work.sum()), "collectives": len(t.collectives),
            "communication_items": int((t.role == COMM).sum()),
            "event_dependencies": t.event_edges, "inferred_dependencies": t.inferred_edges,
            "measured_step_s": self.measured.step_s, "replayed_step_s": self.replayed.step_s,
            "error": self.error, "sum_of_work_s": self.sum_of_work_s, "longest_stream_s": self.longest_stream_s,
            "exposed_comm_s": self.replayed.exposed_comm_s, "measured_exposed_comm_s": self.measured.exposed_comm_s,
            "overlap_ratio": self.replayed.overlap_ratio, "measured_overlap_ratio": self.measured.overlap_ratio,
            "stream_busy_s": self.replayed.stream_busy_s, "measured_stream_busy_s": self.measured.stream_busy_s,
            "scales": [s.text for s in self.scales],
            "hardware": self.hardware, "recosted_collectives": self.recosted, "labels": self.label_rows(),
        }  # fmt: skip

    def label_rows(self, k: int = 20) -> dict[str, dict[str, float]]:
        """The ``k`` user annotations with the longest measured span: measured and replayed span."""
        top = sorted(self.measured.label_span_s.items(), key=lambda kv: -kv[1])[:k]
        replayed = self.replayed.label_span_s
        return {name: {"measured_span_s": span, "replayed_span_s": replayed[name]} for name, span in top}


def replay(
    trace: ReplayTrace, scales: list[Scale] | tuple[Scale, ...] = (), hardware: str | None = None,
    *, keep_gaps: bool = True,
) -> ReplayReport:  # fmt: skip
    """Replay one read trace with what-ifs (``hardware`` first, then ``scales``). ``keep_gaps=False`` drops every
    residual gap (launch and queueing latencies): the dependencies alone, for the benchmark's ablation."""
    check_scales(trace, list(scales))
    dur, recosted = (trace.dur_ns, 0) if hardware is None else recost_collectives(trace, trace.dur_ns, hardware)
    dur = apply_scales(trace, dur, list(scales))
    if not keep_gaps:
        dur = np.where(trace.role == GAP, 0, dur)
    try:
        sim = simulate_replay(trace, dur)
    except ValueError as exc:  # a step past the simulator's horizon: name the file
        raise ValueError(f"{trace.path}: {exc}") from None
    measured = timing(trace, trace.start_ns, trace.dur_ns)
    work = trace.work
    busy = measured.stream_busy_s.values()
    return ReplayReport(
        trace, measured, timing(trace, sim.start_ns, sim.end_ns - sim.start_ns),
        float(trace.dur_ns[work].sum()) * 1e-9, max(busy, default=0.0), tuple(scales), hardware, recosted, sim,
    )  # fmt: skip


@dataclass(frozen=True)
class MultiReplay:
    """Every rank's replay, the slowest rank, and per rank how many aligned collectives it reached last and its
    median lag behind the first rank to reach one."""

    reports: list[ReplayReport]
    aligned_collectives: int
    last_arrivals: dict[int, int]
    median_lag_s: dict[int, float]
    warnings: list[str]

    @property
    def slowest(self) -> ReplayReport:
        return max(self.reports, key=lambda r: r.replayed.step_s)

    def to_dict(self) -> dict[str, Any]:
        out = {"format": REPLAY_FORMAT, "version": REPLAY_VERSION}
        out.update({k: v for k, v in self.slowest.to_dict().items() if k.endswith(("_s", "ratio", "error"))})
        out["slowest_rank"] = self.slowest.trace.rank
        out["ranks"] = [r.to_dict() for r in self.reports]
        out["aligned_collectives"] = self.aligned_collectives
        out["last_arrivals"] = {str(k): v for k, v in self.last_arrivals.items()}
        out["median_lag_s"] = {str(k): v for k, v in self.median_lag_s.items()}
        out["warnings"] = self.warnings
        return out


def align_ranks(reports: list[ReplayReport]) -> tuple[int, dict[int, int], dict[int, float], list[str]]:
    """(collectives aligned, last arrivals per rank, median lag per rank in s, warnings) by collective sequence."""
    seqs = []
    for r in reports:
        t, sim = r.trace, r.sim
        comm = np.flatnonzero(t.role == COMM)
        origin = sim.start_ns[t.work].min()
        order = comm[np.argsort(t.start_ns[comm], kind="stable")]
        seqs.append((sim.start_ns[order] - origin, [t.names[i] for i in order]))
    n = min(len(s[0]) for s in seqs)
    warnings = []
    if len({len(s[0]) for s in seqs}) > 1:
        counts = ", ".join(f"rank {r.trace.rank}: {len(s[0])}" for r, s in zip(reports, seqs, strict=True))
        warnings.append(f"the ranks ran different numbers of communication items ({counts}); aligned the first {n}")
    ranks = [r.trace.rank for r in reports]
    last = Counter({rank: 0 for rank in ranks})
    arrivals = np.stack([s[0][:n] for s in seqs]) if n else np.zeros((len(ranks), 0), np.int64)
    for k in range(n):
        last[ranks[int(np.argmax(arrivals[:, k]))]] += 1
    lag = arrivals - arrivals.min(axis=0, initial=np.iinfo(np.int64).max) if n else arrivals
    median_lag = {rank: float(np.median(lag[j])) * 1e-9 if n else 0.0 for j, rank in enumerate(ranks)}
    return n, dict(last), median_lag, warnings


def replay_traces(
    paths: list[str | os.PathLike[str]], scales: list[Scale] | tuple[Scale, ...] = (), hardware: str | None = None,
    comm_patterns: tuple[str, ...] | list[str] = DEFAULT_COMM_PATTERNS,
) -> MultiReplay:  # fmt: skip
    """Read and replay each trace (one per rank; a folder: its ``*.json`` / ``*.json.gz``, as ``calibrate --trace``
    takes them; ranks numbered by ``distributedInfo.rank``, else by position), align them; ValueError (one line,
    naming the file) for a bad trace or two traces of one rank."""
    from commsched.cost.trace_calibrate import trace_paths

    reports, seen = [], {}
    for j, p in enumerate(trace_paths(paths)):
        t = read_trace(Path(p), comm_patterns)
        rank = t.rank if t.rank is not None else j
        if rank in seen:
            raise ValueError(f"{p}: rank {rank} again (also {seen[rank]}): expected one trace per rank")
        seen[rank] = p
        if t.rank is None:
            t = _with_rank(t, rank)
        reports.append(replay(t, scales, hardware))
    if len(reports) == 1:
        return MultiReplay(reports, 0, {}, {}, [])
    n, last, wait, warnings = align_ranks(reports)
    return MultiReplay(reports, n, last, wait, warnings)


def _with_rank(t: ReplayTrace, rank: int) -> ReplayTrace:
    from dataclasses import replace

    return replace(t, rank=rank)

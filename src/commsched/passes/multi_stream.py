"""``multi_stream``: HEFT-style assignment of nodes to CUDA streams, applied only when the simulator predicts a gain.

Each node gets a role (:mod:`commsched.passes.multi_stream_policy`): compute kernels run on one of the compute
streams, collectives are issued from the comm stream (one stream, so every rank issues them in one order), and
hybrid kernels (fused matmul + collective) need a compute stream and the interconnect at once. If the input
already meets a lower bound no stream assignment can beat (critical path, a group's communication), it is returned
at once. Otherwise
  1. every node gets an upward rank: its time plus the longest path to the end of the step, a cross-stream edge
     costing the stream sync overhead and a collective's transfer counting towards its waits and the next
     collective of its group (:func:`~commsched.passes.multi_stream_heft.upward_ranks`);
  2. nodes are placed, by decreasing rank (HEFT) and, as a second candidate, in the input order, each on the allowed
     stream where it finishes first under the stream model with interference
     (:func:`~commsched.passes.multi_stream_heft.place`); views then follow their first consumer. With the default
     role map, two more maps are tried for each: collectives issued from compute stream 0, and one compute stream;
  3. each candidate is simulated with the full simulator (link sharing, compute slowdown while collectives are in
     flight) plus a contention charge for compute kernels that overlap on different streams
     (``compute_interference`` x the overlapped time: the simulator runs concurrent kernels at full speed each), its
     order is re-sorted by simulated start time (so the memory profile follows time) and checked against the memory
     budget;
  4. the best candidate that fits is applied only if its predicted makespan beats the input's; otherwise the input
     is returned unchanged and the stats say why.

Keeps every group's collective order (SPMD-safe) and the ordering constraints of earlier passes; the collectives'
global issue order is forced by the comm stream's program, as ``check_schedule`` requires for multi-stream
schedules. ``commsched.runtime.streams.lower_streams`` turns the result into an FX graph with stream anchors.
"""

from __future__ import annotations

import dataclasses
import itertools
from collections.abc import Mapping
from dataclasses import dataclass

import numpy as np

from commsched.cost.model import CostEstimate
from commsched.ir import Graph, OpKind
from commsched.memory import memory_profile
from commsched.passes.budget import MemoryBudget
from commsched.passes.multi_stream_heft import (
    follow_consumers,
    make_plan,
    order_by_start,
    place,
    rank_priority,
    upward_ranks,
)
from commsched.passes.multi_stream_policy import DEFAULT_HYBRID_TARGETS, node_roles, resolve_stream_map
from commsched.passes.registry import PassConfig, PassContext, PassResult, PassStats, register_pass
from commsched.sim import SimResult, simulate_costs
from commsched.sim.model import StreamModel, durations_ns, seconds_to_ns

_KERNELS = (OpKind.COMPUTE, OpKind.OTHER)


MAX_COMPUTE_STREAMS = 64
"""the most compute streams the pass plans for (a GPU runs a handful usefully)"""


@dataclass(frozen=True, kw_only=True)
class MultiStreamConfig(PassConfig):
    """Knobs of the ``multi_stream`` pass."""

    compute_streams: int = 2
    """number of compute streams (ids 0..n-1); collectives are issued from stream n unless ``role_streams`` says"""
    role_streams: Mapping[str, tuple[int, ...]] | None = None
    """role -> stream ids, overriding the default for any of "compute", "comm" (exactly one id), "hybrid"
    (default: like compute)"""
    stream_sync_s: float | None = None
    """cross-stream sync overhead the planner assumes (None: the cost estimate's); the verdict always uses the
    estimate's"""
    memory_budget: MemoryBudget = MemoryBudget(ratio=1.05)
    """hard peak-memory budget: a multiple of the input order's peak and / or bytes (the smaller applies)"""
    interference: bool = True
    """plan with the compute slowdown under communication and the contention of concurrent kernels, and charge that
    contention in the verdict; off: concurrent kernels on different streams are assumed not to slow each other"""
    compute_interference: float = 1.0
    """share of the time two kernels overlap on different streams that is lost to contention (1: they share the SMs
    and memory bandwidth fully, as large GEMMs do; lower for small kernels that leave the GPU partly idle)"""
    hybrid_targets: tuple[str, ...] = DEFAULT_HYBRID_TARGETS
    """target-name prefixes of hybrid (fused compute + communication) kernels"""

    def __post_init__(self) -> None:
        super().__post_init__()
        if not 1 <= self.compute_streams <= MAX_COMPUTE_STREAMS:
            raise ValueError(f"knob compute_streams={self.compute_streams}: expected 1..{MAX_COMPUTE_STREAMS}")
        if self.stream_sync_s is not None and not 0.0 <= self.stream_sync_s <= 1.0:
            raise ValueError(f"knob stream_sync_s={self.stream_sync_s}: expected seconds in [0, 1] (or None)")
        if not 0.0 <= self.compute_interference <= 1.0:
            raise ValueError(f"knob compute_interference={self.compute_interference}: expected a share in [0, 1]")


@dataclass
class Evaluation:
    """A candidate judged by the simulator: its time-sorted order, streams and predicted makespan."""

    order: np.ndarray
    streams: np.ndarray
    sim: SimResult
    contention_ns: int
    peak_bytes: int

    @property
    def predicted_ns(self) -> int:
        return self.sim.makespan_ns + self.contention_ns


def contention_ns(sim: SimResult, g: Graph) -> int:
    """Total time, summed over extra kernels, during which more than one compute kernel runs: sum over time of
    max(0, running kernels - 1). O(K log K) for K kernels."""
    kern = np.flatnonzero(
        np.isin(g.kinds, _KERNELS) & (sim.end_ns > sim.start_ns) & (sim.stream < sim.num_compute_streams)
    )
    if len(kern) < 2 or sim.num_compute_streams < 2:
        return 0
    times = np.concatenate([sim.start_ns[kern], sim.end_ns[kern]])
    delta = np.concatenate([np.ones(len(kern), np.int64), -np.ones(len(kern), np.int64)])
    o = np.lexsort((delta, times))  # ends before starts at the same instant
    times, running = times[o], np.cumsum(delta[o])
    extra = np.maximum(running[:-1] - 1, 0)
    return int((extra * np.diff(times)).sum())


def evaluate(
    g: Graph, costs: CostEstimate, order: np.ndarray, streams: np.ndarray | None, compute_interference: float
) -> Evaluation:
    """Simulate ``order`` on ``streams``; the returned order is re-sorted by simulated start (issue time for a
    collective), which keeps every stream's program and so the timing, and makes the memory profile follow time."""
    sim = simulate_costs(g, costs, order, streams)
    if streams is None:
        return Evaluation(order, np.zeros(len(g), np.int32), sim, 0, sim.peak_memory_bytes)
    t = np.where(sim.issue_ns >= 0, sim.issue_ns, sim.start_ns)
    pos = np.empty(len(g), np.int64)
    pos[order] = np.arange(len(g))
    by_time = np.lexsort((pos, t)).astype(np.int32)
    peak = sim.peak_memory_bytes if np.array_equal(by_time, order) else memory_profile(g, by_time).peak_bytes
    penalty = round(compute_interference * contention_ns(sim, g)) if compute_interference > 0 else 0
    return Evaluation(by_time, np.asarray(streams, np.int32), sim, penalty, peak)


@register_pass("multi_stream", MultiStreamConfig)
def multi_stream(g: Graph, order: np.ndarray, ctx: PassContext) -> PassResult:
    """HEFT multi-stream scheduling: nodes placed by upward rank on the compute / comm stream where they finish
    first, with sync overhead, interference and a memory budget; applied only if the simulator predicts a shorter
    step than the input's, else the input is returned unchanged. O((N + E) * S) per candidate plus simulation."""
    cfg: MultiStreamConfig = ctx.config  # type: ignore[assignment]
    stats = PassStats("multi_stream")
    smap = resolve_stream_map(cfg.compute_streams, cfg.role_streams)
    if cfg.compute_interference < 0:
        raise ValueError(f"compute_interference={cfg.compute_interference}: expected >= 0")
    if cfg.stream_sync_s is not None and cfg.stream_sync_s < 0:
        raise ValueError(f"stream_sync_s={cfg.stream_sync_s}: expected seconds >= 0")
    costs = ctx.costs
    alpha = cfg.compute_interference if cfg.interference else 0.0
    base = evaluate(g, costs, order, ctx.streams, alpha)
    base_peak = memory_profile(g, order).peak_bytes
    budget = cfg.memory_budget.limit_bytes(base_peak)

    floor_ns = _floor_ns(base.sim, alpha)
    if base.predicted_ns <= floor_ns:
        stats.notes.append(
            f"not applied: the input ({base.predicted_ns * 1e-9:.6f} s) already meets a lower bound no stream "
            f"assignment can beat ({floor_ns * 1e-9:.6f} s: critical path, a group's communication"
            + (", or all compute work at full contention)" if alpha >= 1 else ")")
        )
        return PassResult(order, stats)
    label, ev = _best_candidate(g, order, ctx, cfg, smap, alpha, budget, stats)
    base_note = f"input {base.predicted_ns * 1e-9:.6f} s (peak {base_peak} B, budget {budget} B)"
    if ev is None:
        stats.notes.append(f"not applied: no candidate fits the memory budget; {base_note}")
        return PassResult(order, stats)
    if ev.predicted_ns >= base.predicted_ns:
        stats.refuse("not faster")
        stats.notes.append(
            f"not applied: best candidate ({label}) predicts {ev.predicted_ns * 1e-9:.6f} s, not faster than the "
            f"{base_note}"
        )
        return PassResult(order, stats)
    stats.notes.append(
        f"applied {label}: predicted {ev.predicted_ns * 1e-9:.6f} s (simulated {ev.sim.makespan_s:.6f} s + "
        f"contention {ev.contention_ns * 1e-9:.6f} s) vs {base_note}; peak {ev.peak_bytes} B"
    )
    return PassResult(ev.order, stats, streams=ev.streams)


def _best_candidate(g, order, ctx: PassContext, cfg: MultiStreamConfig, smap, alpha: float, budget: int, stats):
    """Place the graph under every (priority, stream map) candidate, simulate each and return (label, evaluation)
    of the fastest predicted one that fits the budget; (None, None) if none does."""
    costs = ctx.costs
    roles = node_roles(g, cfg.hybrid_targets)
    plan = make_plan(g, order, durations_ns(g, costs), roles, ctx.extra_src, ctx.extra_dst)
    model = StreamModel.from_costs(costs)
    model = dataclasses.replace(
        model,
        compute_slowdown=model.compute_slowdown if cfg.interference else 1.0,
        sync_ns=model.sync_ns if cfg.stream_sync_s is None else seconds_to_ns(cfg.stream_sync_s),
    )
    inputs = g.kinds == OpKind.INPUT
    maps = {"": smap}
    if cfg.role_streams is None and cfg.compute_streams > 1:
        # collectives issued from the first compute stream: in its program order, as late as the input issues them
        # (a stream of their own issues each as soon as its inputs exist, which can raise the memory peak)
        maps[", comm on stream 0"] = resolve_stream_map(cfg.compute_streams, {"comm": (0,)})
        # one compute stream and the comm stream: no kernels overlap, so no contention to pay
        maps[", 1 compute stream"] = resolve_stream_map(1, None)
    priorities = {
        "upward rank": _inputs_first(rank_priority(plan, upward_ranks(plan, order, smap, model.sync_ns)), inputs),
        "input order": _inputs_first(order.astype(np.int64), inputs),
    }
    best: tuple[str | None, Evaluation | None] = (None, None)
    seen: set[bytes] = set()
    for (plabel, priority), (mlabel, mp) in itertools.product(priorities.items(), maps.items()):
        placed = place(plan, priority, mp, model, alpha)
        follow_consumers(plan, placed, priority)
        cand_order = order_by_start(placed.start_ns, priority)
        key = cand_order.tobytes() + placed.stream.tobytes()
        if key in seen:  # small graphs often give several candidates the same schedule
            continue
        seen.add(key)
        ev = evaluate(g, costs, cand_order, placed.stream, alpha)
        if not _keeps_constraints(ev.order, ctx.extra_src, ctx.extra_dst):
            # the simulator only orders what the graph orders; constraints between streams would not hold
            stats.refuse("ordering constraint across streams")
            continue
        stats.rows.append(_candidate_row(g, plabel + mlabel, placed, ev, ev.peak_bytes <= budget))
        if ev.peak_bytes > budget:
            stats.refuse("memory budget")
            continue
        if best[1] is None or (ev.predicted_ns, ev.peak_bytes) < (best[1].predicted_ns, best[1].peak_bytes):
            best = (plabel + mlabel, ev)
    return best


def _candidate_row(g: Graph, label: str, placed, ev: Evaluation, fits: bool) -> dict:
    return {
        "candidate": label,
        "model_makespan_s": placed.makespan_ns * 1e-9,
        "makespan_s": ev.sim.makespan_s,
        "contention_s": ev.contention_ns * 1e-9,
        "predicted_s": ev.predicted_ns * 1e-9,
        "peak_bytes": ev.peak_bytes,
        "fits": fits,
        "streams_used": len(np.unique(ev.streams)),
        "cross_stream_edges": _cross_edges(g, ev.streams),
    }


def _floor_ns(sim: SimResult, alpha: float) -> int:
    """A makespan no stream assignment beats: the critical path and each group's communication bound every
    schedule; with full contention (alpha >= 1) so does the sum of all kernel work, since overlapping kernels are
    charged their whole overlap."""
    b = sim.bound
    terms = [b.critical_path_s, max(b.comm_s.values(), default=0.0)]
    if alpha >= 1 and sim.num_compute_streams == 1:
        terms.append(b.compute_s)  # one compute stream: compute_s is all the kernel work
    return int(max(terms) * 1e9 + 0.5)  # the terms are whole nanoseconds


def _inputs_first(priority: np.ndarray, is_input: np.ndarray) -> np.ndarray:
    """Graph inputs first (they then sit at time 0 on the first stream), the rest in ``priority`` order."""
    first = is_input[priority]
    return np.concatenate([priority[first], priority[~first]])


def _keeps_constraints(order: np.ndarray, src: np.ndarray, dst: np.ndarray) -> bool:
    if not len(src):
        return True
    pos = np.empty(len(order), np.int64)
    pos[order] = np.arange(len(order))
    return bool((pos[src] < pos[dst]).all())


def _cross_edges(g: Graph, streams: np.ndarray) -> int:
    """Dependencies between nodes on different streams (each is an event record + wait), graph inputs excluded."""
    ptr, idx = g.predecessors_csr()
    dst = np.repeat(np.arange(len(g)), np.diff(ptr))
    real = g.kinds[idx] != OpKind.INPUT
    return int(((streams[idx] != streams[dst]) & real).sum())

"""The stream model: the timing rules of one step, written once. The simulator (:mod:`commsched.sim.engine`,
:mod:`commsched.sim.comm`), the ``overlap`` pass's list scheduler and the ``multi_stream`` pass's HEFT planner all
call these functions; change a rule here and all three see it.

* **Time** is int nanoseconds inside (ties are exact): :func:`durations_ns` converts a :class:`CostEstimate`.
  Kernels (COMPUTE, OTHER) and collectives take ``rint(node_s * 1e9)``; inputs, views, waits and the output take no
  time. A collective's latency part is ``min(rint(latency * 1e9), duration)``; the rest is bandwidth-bound.
* **Streams.** Every node sits on a compute stream, in program order. A collective is issued from its stream and
  queued on its process group's FIFO comm stream (one per group): it starts at :meth:`StreamModel.comm_start_ns`,
  no earlier than ``issue + sync_ns`` and not before the group's previous collective ends. A wait unblocks its stream
  at :meth:`StreamModel.wait_release_ns` (``sync_ns`` after its collective ends). A predecessor on another compute
  stream is available ``sync_ns`` later (graph inputs exist on every stream).
* **Interference, compute side.** A kernel progresses at rate ``1 / compute_slowdown`` while any collective that
  takes SMs is in flight (either phase), at rate 1 otherwise: :meth:`StreamModel.kernel_wall_ns` (wall time for
  some work) and :meth:`StreamModel.kernel_work_ns` (work done in some wall time) are the only statement of this
  rule, and :func:`takes_sms` the only statement of which collectives count: every one but a copy-engine transfer
  (``CostEstimate.copy_engine``: async TP's symmetric-memory copies run on the copy engines, NCCL's on SMs).
* **Interference, comm side.** A collective's bandwidth-bound part progresses at rate ``1 / divisor`` with
  :meth:`StreamModel.comm_divisor`: ``k`` collectives of different groups in their bandwidth phase on the same link
  class share it (processor sharing), and while a kernel runs it is ``comm_slowdown`` times slower still (a CPU run:
  gloo's threads compete with compute). Planners that do not track running kernels plan collectives at their
  slowed speed (:meth:`StreamModel.planning_comm_ns`), which is what a good schedule makes them run at.
* **Shared host cores** (a CPU harness whose ranks outnumber its cores; the pipeline engine only): while ``k``
  ranks compute at once they have ``cores(k)`` cores between them, each kernel running ``max(1, k / cores(k))``
  times slower (processor sharing, :func:`shared_cores_rule`) on top of the communication slowdown
  (:meth:`StreamModel.kernel_factor`). ``cores(k)`` interpolates linearly through (1, 1) and the measured points
  ``host_cores`` ((ranks, cores) pairs, ranks increasing), flat past the last; no points on GPUs: every rank has its
  own.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np

from commsched.cost.model import CostEstimate
from commsched.ir.graph import Graph, OpKind

INF_NS = 1 << 62
"""a time after every event"""
HORIZON_NS = 1 << 53
"""the latest time a step may reach (about 104 days): below it the float work counters are exact integers, so no
time wraps, rounds to a neighbour or reaches INF_NS; costs that could pass it are an error (:func:`durations_ns`)"""
EPS_NS = 1e-6
"""ns of (float) work below which a kernel or a bandwidth phase counts as done"""

TIMED_KINDS = (OpKind.COMPUTE, OpKind.OTHER, OpKind.COLLECTIVE)
"""the node kinds that take time; every other kind is instantaneous"""


def seconds_to_ns(seconds: float) -> int:
    """One interval in seconds as int nanoseconds (how every configured overhead enters the model)."""
    return round(seconds * 1e9)


def durations_ns(g: Graph, costs: CostEstimate) -> np.ndarray:
    """Per node: its standalone duration in int64 ns (0 for the kinds that take no time). ValueError when the step
    could pass :data:`HORIZON_NS` (see :func:`check_horizon`). O(N)."""
    timed = np.isin(g.kinds, TIMED_KINDS)
    with np.errstate(over="ignore"):  # 1e300 s becomes inf ns here and an error below
        dur = np.where(timed, np.rint(np.asarray(costs.node_s, np.float64) * 1e9), 0.0)
    check_horizon(g, costs, dur)
    return dur.astype(np.int64)


def check_horizon(g: Graph, costs: CostEstimate, dur_ns: np.ndarray) -> None:
    """ValueError naming the longest node unless every run of the step ends before :data:`HORIZON_NS`: all work
    serialised at its slowest rate (kernels ``compute_slowdown`` x, collectives ``comm_slowdown`` x; link sharing
    conserves work) plus two syncs and a rounding ns per node bounds any makespan. Float sums: nothing wraps."""
    is_coll = g.coll_type >= 0
    sync_ns = float(costs.stream_sync_s) * 1e9
    worst = float(
        np.sum(np.where(is_coll, dur_ns * float(costs.comm_slowdown), dur_ns * float(costs.compute_slowdown)))
    )
    worst += len(dur_ns) * (2.0 * sync_ns + 2.0)
    if worst < HORIZON_NS:
        return
    longest = int(np.argmax(dur_ns)) if len(dur_ns) else 0
    raise ValueError(
        f"node {g.names[longest]!r} takes {float(costs.node_s[longest]):.3g} s and the step up to {worst * 1e-9:.3g} s "
        f"(stream_sync_s={float(costs.stream_sync_s):.3g}); expected a step under {HORIZON_NS * 1e-9:.3g} s: "
        "check the hardware profile's bandwidths and the graph's sizes and flops"
    )


def takes_sms(g: Graph, costs: CostEstimate) -> np.ndarray:
    """Per node: a collective whose transfer occupies SMs, so that compute slows while it is in flight (every
    collective but a copy-engine transfer, ``costs.copy_engine``). The one statement of which collectives the
    compute-side interference rule counts."""
    is_coll = g.coll_type >= 0
    if costs.copy_engine is None:
        return is_coll
    return is_coll & ~np.asarray(costs.copy_engine, bool)


def latency_ns(g: Graph, costs: CostEstimate, dur_ns: np.ndarray) -> np.ndarray:
    """Per node: the latency (not bandwidth-bound) part of a collective's duration in int64 ns; 0 for others."""
    lat = np.minimum(np.rint(np.asarray(costs.coll_latency_s) * 1e9).astype(np.int64), dur_ns)
    return np.where(g.coll_type >= 0, lat, 0)


# The scalar rules, as plain functions of numbers: the methods of :class:`StreamModel` call them, and the compiled
# loops (:mod:`commsched.sim.jit`) compile these same functions, so each rule is still written once.
def comm_start_rule(issue_ns: int, group_free_ns: int, sync_ns: int) -> int:
    """See :meth:`StreamModel.comm_start_ns`."""
    ready = issue_ns + sync_ns
    return ready if ready > group_free_ns else group_free_ns


def latest_issue_rule(comm_start_ns: int, sync_ns: int) -> int:
    """See :meth:`StreamModel.latest_issue_ns`."""
    return comm_start_ns - sync_ns


def wait_release_rule(coll_end_ns: int, sync_ns: int) -> int:
    """See :meth:`StreamModel.wait_release_ns`."""
    return coll_end_ns + sync_ns


def kernel_wall_rule(work_ns: float, comm_in_flight: bool, compute_slowdown: float) -> float:
    """See :meth:`StreamModel.kernel_wall_ns`."""
    return work_ns * compute_slowdown if comm_in_flight else work_ns


def kernel_work_rule(wall_ns: float, comm_in_flight: bool, compute_slowdown: float) -> float:
    """See :meth:`StreamModel.kernel_work_ns`."""
    return wall_ns / compute_slowdown if comm_in_flight else wall_ns


def kernel_end_rule(t_ns: int, wall_ns: float) -> int:
    """See :meth:`StreamModel.kernel_end_ns` (``wall_ns``: :func:`kernel_wall_rule` of the work left)."""
    return t_ns + math.ceil(wall_ns - EPS_NS)


def shared_cores_rule(computing: int, host_cores: tuple[tuple[float, float], ...]) -> float:
    """See :meth:`StreamModel.kernel_factor`: the slowdown of ``computing`` ranks sharing the cores that
    ``host_cores`` measures (module docstring)."""
    if not host_cores or computing <= 1:
        return 1.0
    k0, c0 = 1.0, 1.0
    for k1, c1 in host_cores:
        if computing <= k1:
            cores = c0 + (c1 - c0) * (computing - k0) / (k1 - k0)
            return max(1.0, computing / cores)
        k0, c0 = k1, c1
    return max(1.0, computing / c0)


def cores_points(host_cores: float | tuple[tuple[float, float], ...]) -> tuple[tuple[float, float], ...]:
    """``host_cores`` as :attr:`StreamModel.host_cores` points: a number ``c`` is ``((c, c),)`` (up to ``c`` ranks
    each have a core, more share ``c``), infinity none."""
    if isinstance(host_cores, tuple):
        return host_cores
    return () if math.isinf(host_cores) else ((float(host_cores), float(host_cores)),)


def comm_divisor_rule(sharing: int, kernel_running: bool, comm_slowdown: float) -> float:
    """See :meth:`StreamModel.comm_divisor`."""
    return sharing * comm_slowdown if kernel_running else float(sharing)


@dataclass(frozen=True)
class StreamModel:
    """The rules of the module docstring with one cost estimate's parameters."""

    compute_slowdown: float = 1.0
    """a kernel runs this many times slower while any collective is in flight"""
    comm_slowdown: float = 1.0
    """a collective's bandwidth-bound part runs this many times slower while a kernel runs"""
    sync_ns: int = 0
    """one cross-stream dependency (event record + wait)"""
    host_cores: tuple[tuple[float, float], ...] = ()
    """(ranks computing at once, the cores they have between them) as measured on a CPU harness, ranks increasing
    (:func:`shared_cores_rule`); empty: a processor per rank"""

    @classmethod
    def from_costs(cls, costs: CostEstimate) -> StreamModel:
        return cls(float(costs.compute_slowdown), float(costs.comm_slowdown), seconds_to_ns(costs.stream_sync_s))

    # ---------------------------------------------------------------- streams and FIFO order
    def comm_start_ns(self, issue_ns: int, group_free_ns: int) -> int:
        """When a collective issued at ``issue_ns`` starts on its group's comm stream, which is free from
        ``group_free_ns`` (the end of the group's previous collective)."""
        return comm_start_rule(issue_ns, group_free_ns, self.sync_ns)

    def latest_issue_ns(self, comm_start_ns: int) -> int:
        """The latest issue time at which a collective can still start at ``comm_start_ns``."""
        return latest_issue_rule(comm_start_ns, self.sync_ns)

    def wait_release_ns(self, coll_end_ns: int) -> int:
        """When a wait on a collective that ends at ``coll_end_ns`` unblocks its stream."""
        return wait_release_rule(coll_end_ns, self.sync_ns)

    def available_ns(self, avail_ns: int, other_stream: bool) -> int:
        """When a node available at ``avail_ns`` may be used by a node on another (or the same) compute stream."""
        return avail_ns + self.sync_ns if other_stream else avail_ns

    # ---------------------------------------------------------------- interference
    @property
    def kernels_see_comm(self) -> bool:
        """Whether a kernel's rate depends on communication in flight (else kernels take their duration)."""
        return self.compute_slowdown != 1.0

    @property
    def comm_sees_kernels(self) -> bool:
        """Whether a bandwidth phase's rate depends on a kernel running."""
        return self.comm_slowdown != 1.0

    def kernel_wall_ns(self, work_ns: float, comm_in_flight: bool) -> float:
        """Wall time a kernel needs for ``work_ns`` of its work at the current rate."""
        return kernel_wall_rule(work_ns, comm_in_flight, self.compute_slowdown)

    def kernel_work_ns(self, wall_ns: float, comm_in_flight: bool) -> float:
        """Work a kernel does in ``wall_ns`` of wall time at the current rate."""
        return kernel_work_rule(wall_ns, comm_in_flight, self.compute_slowdown)

    def kernel_factor(self, comm_in_flight: bool, computing: int = 1) -> float:
        """Wall time per unit of a kernel's work while ``computing`` ranks compute at once (its own included)."""
        comm = kernel_wall_rule(1.0, comm_in_flight, self.compute_slowdown)
        return comm * shared_cores_rule(computing, self.host_cores)

    def kernel_end_ns(self, t_ns: int, work_ns: float, comm_in_flight: bool) -> int:
        """End of ``work_ns`` of kernel work started at ``t_ns`` if the rate stays as it is."""
        return kernel_end_rule(t_ns, self.kernel_wall_ns(work_ns, comm_in_flight))

    def comm_divisor(self, sharing: int, kernel_running: bool) -> float:
        """Wall time per unit of a bandwidth phase's work: ``sharing`` collectives share its link."""
        return comm_divisor_rule(sharing, kernel_running, self.comm_slowdown)

    def planning_comm_ns(self, dur_ns: np.ndarray, is_coll: np.ndarray) -> np.ndarray:
        """Durations for a planner without kernel-driven comm rates: collectives at their slowed speed."""
        if self.comm_slowdown == 1.0:
            return dur_ns
        return np.where(is_coll, np.rint(dur_ns * self.comm_slowdown).astype(np.int64), dur_ns)

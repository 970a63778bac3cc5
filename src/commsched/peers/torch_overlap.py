"""Run torch's own overlap scheduler on a commsched-traced FX graph, with our costs, on a CPU-only build.

:func:`run_torch_overlap_scheduler` deep-copies the GraphModule, calls
``torch._inductor.fx_passes.overlap_scheduling.schedule_overlap_bucketing`` (which builds and runs
``OverlapScheduler``) under temporary patches, and maps the FX order torch leaves back to our node ids by name.
It is the peer our schedulers are compared against (``commsched compare``, benchmarks/RESULTS.md), so everything
below exists to make the comparison one of *schedulers*, not of cost models or hardware.

Knobs we set (and why)
----------------------
* ``custom_runtime_estimation``: our :class:`~commsched.cost.model.CostEstimate`, converted to ms (torch's unit),
  for every node: compute, "other" (pointwise, copies: torch also uses those to hide collectives), collectives,
  waits and views (0). See :mod:`commsched.peers.torch_costs`. Callers may not pass their own.
* ``compute_estimator="analytical"``, ``collective_estimator="analytical"``: "benchmark" runs kernels / NCCL on a
  GPU. Analytical also skips torch's cross-rank ``all_gather_object`` of estimates.
* ``enable_fusion_regions=False``: fusion-region costs would overwrite our per-node costs (torch's default here).
* ``compute_overlap_multipler = 1 / costs.compute_slowdown`` unless given: torch's knob for "compute runs slower
  while a collective is in flight", our ``compute_slowdown``.
* ``bucket=False`` -> ``collective_bucketing=False, pre_bucketing_fsdp_collectives=False`` (no node is added or
  removed: the order is a permutation of our graph). ``bucket=True`` -> both on, and the pre-bucketing cap
  ``pre_bucketing_fsdp_collectives_bucket_cap_mb`` is derived from our costs (the all_gather size at 90 % bandwidth
  efficiency, as torch derives it from its NCCL profiles) unless given.
* ``config.test_configs.assume_bucketing_reduces_latency = bucket``: with it on (torch's default) the scheduler
  subtracts one collective latency whenever a same-key collective is already in flight, assuming they will be
  bucketed; without bucketing that saving never happens, so it is only on when bucketing is.
* Everything else keeps ``schedule_overlap_bucketing``'s defaults and can be overridden through ``**torch_knobs``:
  ``max_in_flight_gb=5``, ``max_compute_pre_fetch=200``, ``max_coll_distance=200``, ``max_memory_increase_gb=1.0``,
  ``max_memory_increase_ratio=0.05``, ``max_off_bucket_gb=0.5``, ``prioritize_bucketing_during_scheduling=True``.

What we patch (all through ``unittest.mock.patch``, undone when the call returns or raises)
--------------------------------------------------------------------------------------------
* ``overlap_scheduling.estimate_roofline_runtime_ms`` and ``comm_analysis.estimate_nccl_collective_runtime_from_fx_
  node``: answered from our costs (torch still calls the roofline for every compute node while "aligning"
  estimates, and would need the device numbers below).
* ``torch.utils._runtime_estimation.get_device_tflops`` / ``get_gpu_dram_gbps`` (and their ``torch._inductor.utils``
  originals): without CUDA the first returns 0 and the second imports triton. ``comm_analysis.get_gpu_type``: would
  run ``nvidia-smi`` and fall back to AMPERE. All three return fixed H100 numbers and are *counted*
  (``stats['questions']['device_query']``); with every node covered by our costs they are never reached.
* ``overlap_scheduling.MemoryTracker``: torch's tracker ignores CPU tensors (every fake tensor here is CPU, so its
  peak would be 0 and the memory budget dead). Ours counts every device, and treats graph inputs as persistent
  (torch frees any input whose name does not start with ``primals``; make_fx names them ``arg0_1``), which is the
  commsched memory contract.
* ``overlap_scheduling.OverlapScheduler``: a subclass that records the instance (stats), times ``__init__`` and
  ``run`` separately, and applies ``memory_budget``.
* ``fsdp.pre_bucket_fsdp_collectives`` (``bucket=True`` only): wrapped to time it and to count nodes it leaves
  before one of their inputs. It does: users of the original all_gather waits (e.g. ``view``) stay in place while
  the bucket's per-parameter outputs they now read are inserted after the bucket's wait, further down.
  ``OverlapScheduler`` runs ``stable_topological_sort`` before anything else, so its schedule is unaffected; we sort
  right away too and report the count in ``stats['prebucket_out_of_order']``.
* ``node_runtime_estimation._log_compute_estimations`` / ``_log_collective_benchmarks``: tlparse diagnostics that
  torch computes eagerly even with tracing off (they rerun torch's own estimators for every node); not scheduling.
* torch's global ``counters['inductor']`` (the deltas go to ``stats['counters']``) and the
  ``get_group_name`` cache (it would keep every copied graph alive) are restored / cleared after the call.
* Process groups: the scheduler calls ``dist.get_world_size()`` and bucketing resolves groups by name. When no
  process group is initialised, the call runs in a fake world (size: the largest ``size * stride`` of the graph's
  groups) where each of the graph's groups is recreated as rank 0's group and registered under its traced name;
  all of it is destroyed on return. When one is initialised (e.g. the caller is still inside the
  ``fake_process_group`` it traced in), it is used as is and must resolve the graph's group names.

Behaviour of torch's scheduler that matters for a fair comparison
-----------------------------------------------------------------
* Memory budget: peak allowed = its own baseline peak (the input order) + max(1 GiB, 5 %); for graphs of a few
  hundred MB that is effectively unlimited. ``memory_budget`` (bytes, an absolute peak in torch's accounting,
  which counts storages like ours) replaces that limit; ``max_in_flight_gb=5`` also caps collective bytes in flight.
  The limit is soft: it is checked before prefetching a collective and when deferring an exposed wait, not at
  every node (fsdp_mlp with the budget set to the input order's peak still peaked 1-7 % above it).
* It models one FIFO stream per process group (waiting on a collective forces the waits of every earlier
  collective of its group) and lets collectives of different groups overlap the same compute fully (no shared link
  bandwidth); it knows no per-group ordering rule of its own, so it *may* reorder collectives of one group
  relative to the input order (``stats['reordered_group_collectives']``); every rank makes the same decision, so
  the result is SPMD-consistent, and ``valid`` is checked with ``allow_collective_reorder=True``.
* It only tracks collectives it can classify and that end in a ``wait_tensor``: broadcast and synchronous
  collectives are ordinary zero-cost nodes to it (never hidden, never hiding).
* It sees data edges only: control dependencies of our graph (in-place writes) are invisible to it. We check the
  order against our graph (``valid`` / ``invalid_reason``) and never repair it.
* Only ``stats['questions']`` counts answers that did not come from our costs.
"""

from __future__ import annotations

import contextlib
import copy
import inspect
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any
from unittest import mock

import numpy as np
import torch
import torch.fx as fx

from commsched.cost.model import CostEstimate
from commsched.ir import Graph
from commsched.peers.torch_costs import TorchCostInjector

# knobs the harness owns or that need a GPU
_FORCED_KNOBS: dict[str, Any] = {
    "compute_estimator": "analytical",
    "collective_estimator": "analytical",
    "enable_fusion_regions": False,
}
_OWNED_KNOBS = frozenset({"custom_runtime_estimation", "pge_profile_path", "gm"})


@dataclass(frozen=True, eq=False)
class TorchPeerResult:
    """What torch's overlap scheduler did to a copy of the graph.

    ``order``: int32 ids of ``graph``'s nodes in the order torch left the FX graph (by name). A permutation of all
    ids when ``new_nodes`` and ``removed_nodes`` are empty (always with ``bucket=False``); otherwise only the nodes
    that survived bucketing, and ``gm`` is the graph to re-import with ``from_fx`` to see the whole schedule.
    ``wall_s``: seconds inside ``schedule_overlap_bucketing`` (pre-bucketing, scheduler construction, scheduling,
    finalisation); the split is in ``stats['time_s']``. ``valid``: the order passes ``check_schedule`` on ``graph``
    (collective reordering allowed; only checked when no node was added or removed, else None).
    ``torch_*_bytes``: torch's memory accounting (baseline = input order, peak = its schedule, limit = the budget it
    enforced). ``torch_estimates_s``: the per-node times torch's scheduler used (seconds, by node name).
    ``torch_exposed_comm_s``: torch's own estimate of the collective time left exposed.
    """

    order: np.ndarray
    wall_s: float
    gm: fx.GraphModule
    new_nodes: tuple[str, ...]
    removed_nodes: tuple[str, ...]
    valid: bool | None
    invalid_reason: str | None
    torch_baseline_peak_memory_bytes: int
    torch_peak_memory_bytes: int
    torch_memory_limit_bytes: int
    torch_exposed_comm_s: float
    torch_estimates_s: dict[str, float]
    knobs: dict[str, Any]
    stats: dict[str, Any] = field(default_factory=dict)
    notes: tuple[str, ...] = ()


@dataclass
class _Record:
    scheduler: Any = None
    init_s: float = 0.0
    run_s: float = 0.0
    prebucket_s: float = 0.0
    prebucket_out_of_order: int | None = None


def _knob_names() -> frozenset[str]:
    from torch._inductor.fx_passes import overlap_scheduling as osch

    return frozenset(inspect.signature(osch.schedule_overlap_bucketing).parameters)


def resolve_knobs(costs: CostEstimate, bucket: bool, torch_knobs: dict[str, Any]) -> dict[str, Any]:
    """The keyword arguments passed to ``schedule_overlap_bucketing``; ValueError names a bad knob."""
    allowed = _knob_names() - _OWNED_KNOBS
    for name, value in torch_knobs.items():
        if name in _OWNED_KNOBS:
            raise ValueError(f"torch knob {name!r} is set by the harness (our costs); do not pass it")
        if name not in allowed and name != "assume_bucketing_reduces_latency":
            raise ValueError(
                f"unknown torch knob {name!r}: expected one of {sorted(allowed | {'assume_bucketing_reduces_latency'})}"
            )
        if name in _FORCED_KNOBS and value != _FORCED_KNOBS[name]:
            raise ValueError(
                f"torch knob {name}={value!r} is not supported: expected {_FORCED_KNOBS[name]!r} "
                "(benchmark estimators need a GPU; fusion regions would replace our costs)"
            )
    knobs: dict[str, Any] = {
        "collective_bucketing": bucket,
        "pre_bucketing_fsdp_collectives": bucket,
        "compute_overlap_multipler": 1.0 / costs.compute_slowdown,
        "assume_bucketing_reduces_latency": bucket,
        **_FORCED_KNOBS,
    }
    knobs.update(torch_knobs)
    return knobs


@contextlib.contextmanager
def _process_group(graph: Graph) -> Iterator[list[str]]:
    """A process group for the call: the caller's if one is initialised, else a fake one (world = the largest
    ``size * stride`` of the graph's groups) in which every group of the graph is created again as the group of
    rank 0 (ranks 0, stride, 2 * stride, ...) and registered under the graph's name, so that torch's bucketing can
    resolve it. Yields notes."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        yield ["process group: the caller's"]
        return
    from torch._C._distributed_c10d import _register_process_group, _unregister_process_group
    from torch.distributed.distributed_c10d import _resolve_process_group

    from commsched.frontends.fake_pg import fake_process_group

    world = max((grp.size * grp.stride for grp in graph.groups), default=1)
    with fake_process_group(max(world, 1)):
        made = []
        for grp in graph.groups:
            try:
                _resolve_process_group(grp.name)
                continue
            except RuntimeError:
                pass
            made.append((grp.name, dist.new_group(list(range(0, grp.size * grp.stride, grp.stride)))))
        # new_group registers auto names ("1", "2", ...) that may be names the graph needs for other groups
        for _, pg in made:
            with contextlib.suppress(RuntimeError):
                _unregister_process_group(pg.group_name)
        for name, pg in made:
            _register_process_group(name, pg)
        # destroying the fake world (on exit) unregisters every group
        yield [f"process group: fake, world {world}, {len(made)} groups recreated from the graph"]


@contextlib.contextmanager
def _restored_counters() -> Iterator[dict[str, int]]:
    from torch._dynamo.utils import counters

    before = dict(counters["inductor"])
    delta: dict[str, int] = {}
    try:
        yield delta
    finally:
        after = dict(counters["inductor"])
        delta.update({k: v - before.get(k, 0) for k, v in after.items() if v != before.get(k, 0)})
        counters["inductor"].clear()
        counters["inductor"].update(before)


def _persistent_inputs(node: fx.Node) -> bool:
    # commsched contract: graph inputs (parameters, batch) persist for the whole step
    return node.op not in ("placeholder", "get_attr")


def _every_device(device: torch.device) -> bool:
    return True


def _out_of_order(graph: fx.Graph) -> int:
    seen: set[fx.Node] = set()
    bad = 0
    for node in graph.nodes:
        bad += any(i not in seen for i in node.all_input_nodes)
        seen.add(node)
    return bad


@contextlib.contextmanager
def torch_patches(injector: TorchCostInjector, record: _Record, memory_budget: int | None) -> Iterator[list[str]]:
    """Every patch the harness applies, as one context manager; yields the list of notes describing them."""
    import torch._inductor.comm_analysis as comm_analysis
    import torch._inductor.utils as inductor_utils
    import torch.utils._runtime_estimation as runtime_estimation
    from torch._inductor.fx_passes import fsdp, memory_estimator, node_runtime_estimation
    from torch._inductor.fx_passes import overlap_scheduling as osch

    base_scheduler = osch.OverlapScheduler
    base_tracker = memory_estimator.MemoryTracker
    base_prebucket = fsdp.pre_bucket_fsdp_collectives

    class RecordingScheduler(base_scheduler):  # type: ignore[misc, valid-type]
        def __init__(self, *args: Any, **kwargs: Any) -> None:
            t0 = time.perf_counter()
            super().__init__(*args, **kwargs)
            if memory_budget is not None:
                self.allowed_peak_memory_bytes = int(memory_budget)
            record.init_s += time.perf_counter() - t0
            record.scheduler = self

        def run(self) -> fx.GraphModule:
            t0 = time.perf_counter()
            try:
                return super().run()
            finally:
                record.run_s += time.perf_counter() - t0

    def memory_tracker(graph: fx.Graph, is_releasable: Any = None, device_filter: Any = None) -> Any:
        return base_tracker(
            graph, is_releasable=is_releasable or _persistent_inputs, device_filter=device_filter or _every_device
        )

    def prebucket(gm: fx.GraphModule, *args: Any, **kwargs: Any) -> None:
        from torch._inductor.pattern_matcher import stable_topological_sort

        t0 = time.perf_counter()
        base_prebucket(gm, *args, **kwargs)
        record.prebucket_out_of_order = _out_of_order(gm.graph)
        if record.prebucket_out_of_order:
            stable_topological_sort(gm.graph)
        record.prebucket_s += time.perf_counter() - t0

    def no_log(*args: Any, **kwargs: Any) -> None:
        return None

    targets: list[tuple[Any, str, Any, str]] = [
        (osch, "OverlapScheduler", RecordingScheduler, "OverlapScheduler: recording subclass (stats, timing, budget)"),
        (osch, "MemoryTracker", memory_tracker, "MemoryTracker: counts CPU tensors; graph inputs persist"),
        (osch, "estimate_roofline_runtime_ms", injector.roofline_ms, "estimate_roofline_runtime_ms: our costs"),
        (
            comm_analysis,
            "estimate_nccl_collective_runtime_from_fx_node",
            injector.nccl_ms,
            "estimate_nccl_collective_runtime_from_fx_node: our costs (linear in size)",
        ),
        (comm_analysis, "get_gpu_type", injector.gpu_type, "comm_analysis.get_gpu_type: HOPPER (counted)"),
        (runtime_estimation, "get_device_tflops", injector.device_tflops, "get_device_tflops: 989 (counted)"),
        (runtime_estimation, "get_gpu_dram_gbps", injector.dram_gbps, "get_gpu_dram_gbps: 3350 (counted)"),
        (inductor_utils, "get_device_tflops", injector.device_tflops, ""),
        (inductor_utils, "get_gpu_dram_gbps", injector.dram_gbps, ""),
        (fsdp, "pre_bucket_fsdp_collectives", prebucket, "pre_bucket_fsdp_collectives: timed, topological fix"),
        (node_runtime_estimation, "_log_compute_estimations", no_log, "tlparse estimate logging: off"),
        (node_runtime_estimation, "_log_collective_benchmarks", no_log, ""),
    ]
    notes = [note for *_, note in targets if note]
    with contextlib.ExitStack() as stack:
        for module, name, new, _ in targets:
            stack.enter_context(mock.patch.object(module, name, new))
        yield notes


def _scheduler_stats(sched: Any) -> dict[str, Any]:
    infos = list(sched.collective_info.values())
    return {
        "num_collectives": len(infos),
        "num_compute_nodes": len(sched.compute_nodes),
        "exposed_collectives": sum(1 for c in infos if c.exposed_time_ms > 0),
        "fully_exposed_collectives": sum(1 for c in infos if c.exposed_time_ms == c.estimated_time_ms),
        "collective_s": sum(c.estimated_time_ms for c in infos) / 1e3,
        "wasted_compute_s": float(sched.wasted_compute) / 1e3,
        "collective_estimates_s": {c.start_node.name: c.estimated_time_ms / 1e3 for c in infos},
        "collective_exposed_s": {c.start_node.name: c.exposed_time_ms / 1e3 for c in infos},
    }


def _reordered_group_collectives(graph: Graph, order: np.ndarray) -> bool:
    from commsched.ir.order import collective_chains

    ref = collective_chains(graph, np.arange(len(graph), dtype=np.int32))
    got = collective_chains(graph, order)
    return any(not np.array_equal(ref[k], got.get(k, ref[k][:0])) for k in ref)


def run_torch_overlap_scheduler(
    gm: fx.GraphModule,
    graph: Graph,
    costs: CostEstimate,
    *,
    memory_budget: int | None = None,
    bucket: bool = False,
    **torch_knobs: Any,
) -> TorchPeerResult:
    """Schedule a copy of ``gm`` with torch's ``schedule_overlap_bucketing`` / ``OverlapScheduler``, seeing ``costs``.

    Requires ``graph = from_fx(gm)`` (node names are the link) and ``costs`` for ``graph``. ``memory_budget`` is an
    absolute peak in bytes (torch's default limit otherwise, see the module docstring); ``bucket`` turns torch's
    collective bucketing on; ``torch_knobs`` override ``schedule_overlap_bucketing`` arguments. ``gm`` is not
    modified and no patch outlives the call. Raises ValueError on a bad knob or mismatched inputs.
    """
    from torch._inductor import config as inductor_config
    from torch._inductor.fx_passes import overlap_scheduling as osch

    from commsched.passes.check import ScheduleError, check_schedule

    if len(costs.node_s) != len(graph):
        raise ValueError(f"costs cover {len(costs.node_s)} nodes but the graph has {len(graph)}")
    fx_names = [n.name for n in gm.graph.nodes]
    if len(fx_names) != len(graph) or any(n not in graph.index for n in fx_names):
        missing = next((n for n in fx_names if n not in graph.index), None)
        raise ValueError(
            f"graph does not match gm: {len(graph)} nodes vs {len(fx_names)} FX nodes"
            + (f"; FX node {missing!r} is not in the graph" if missing else "")
            + " (expected graph = commsched.from_fx(gm))"
        )
    if memory_budget is not None and memory_budget <= 0:
        raise ValueError(f"memory_budget={memory_budget}: expected a positive number of bytes or None")
    knobs = resolve_knobs(costs, bucket, torch_knobs)
    tracked = (
        knobs.get("max_memory_increase_gb", 1.0) is not None or knobs.get("max_memory_increase_ratio", 0.05) is not None
    )
    if not tracked:
        # torch's scheduler dereferences its memory tracker unconditionally; it cannot run without one
        raise ValueError("max_memory_increase_gb and max_memory_increase_ratio cannot both be None (use memory_budget)")
    assume_bucketing = bool(knobs.pop("assume_bucketing_reduces_latency"))

    work = copy.deepcopy(gm)
    injector = TorchCostInjector(work, graph, costs)
    if knobs["pre_bucketing_fsdp_collectives"] and knobs.get("pre_bucketing_fsdp_collectives_bucket_cap_mb") is None:
        dist_opts = inductor_config.aten_distributed_optimizations
        knobs["pre_bucketing_fsdp_collectives_bucket_cap_mb"] = injector.saturation_bucket_cap_mb(
            dist_opts.pre_bucketing_fsdp_collectives_min_bucket_cap_mb,
            dist_opts.pre_bucketing_fsdp_collectives_max_bucket_cap_mb,
        )
    record = _Record()
    with (
        _process_group(graph) as pg_notes,
        _restored_counters() as counter_delta,
        inductor_config.patch({"test_configs.assume_bucketing_reduces_latency": assume_bucketing}),
        torch_patches(injector, record, memory_budget) as notes,
    ):
        try:
            t0 = time.perf_counter()
            out = osch.schedule_overlap_bucketing(
                work, custom_runtime_estimation=injector.custom_runtime_estimation, **knobs
            )
            wall_s = time.perf_counter() - t0
        finally:
            osch.get_group_name.cache_clear()
    sched = record.scheduler
    if sched is None:  # torch returns early when the graph has no wait_tensor
        raise ValueError("torch's overlap scheduler did not run: the graph has no wait_tensor (no collective)")

    names = [n.name for n in out.graph.nodes]
    index = graph.index
    order = np.fromiter((index[n] for n in names if n in index), np.int32)
    new_nodes = tuple(n for n in names if n not in index)
    kept = set(names)
    removed = tuple(n for n in graph.names if n not in kept)
    valid: bool | None = None
    reason: str | None = None
    reordered: bool | None = None
    if not new_nodes and not removed:
        try:
            check_schedule(graph, order, allow_collective_reorder=True)
            valid = True
        except ScheduleError as exc:
            valid, reason = False, str(exc)
        reordered = _reordered_group_collectives(graph, order)

    estimates_s = {n.name: float(v) / 1e3 for n, v in sched.node_estimations.items()}
    stats = _scheduler_stats(sched)
    exposed_s = sum(c.exposed_time_ms for c in sched.collective_info.values()) / 1e3
    stats.update(
        time_s={"prebucket": record.prebucket_s, "init": record.init_s, "run": record.run_s, "total": wall_s},
        questions=dict(injector.questions),
        counters=counter_delta,
        reordered_group_collectives=reordered,
        prebucket_out_of_order=record.prebucket_out_of_order,
        num_fx_nodes_in=len(fx_names),
        num_fx_nodes_out=len(names),
    )
    knobs["assume_bucketing_reduces_latency"] = assume_bucketing
    return TorchPeerResult(
        order=order,
        wall_s=wall_s,
        gm=out,
        new_nodes=new_nodes,
        removed_nodes=removed,
        valid=valid,
        invalid_reason=reason,
        torch_baseline_peak_memory_bytes=int(sched.original_peak_memory),
        torch_peak_memory_bytes=int(sched.memory_tracker.peak_memory),
        torch_memory_limit_bytes=int(sched.allowed_peak_memory_bytes),
        torch_exposed_comm_s=exposed_s,
        torch_estimates_s=estimates_s,
        knobs=knobs,
        stats=stats,
        notes=tuple(pg_notes + notes),
    )

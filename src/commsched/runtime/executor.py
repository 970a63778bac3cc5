"""The real executor: one rank's part of a run (SPMD: every rank calls :func:`run_rank` with the same config).

Each rank traces its own step (the zoo's ``StepProgram`` on its real process groups, under FakeTensorMode, so the
collectives name the real groups and rank-specific constants are its own), checks that its FX node names and
targets are rank 0's, calibrates the link and its ops, receives every variant's order from rank 0 (which imports
its graph, estimates costs, schedules and predicts), applies each order to a copy of its graph, and runs all
variants on real tensors: warm-up, then ``iters`` rounds in rotating variant order, each step between barriers.
Every output of every step is compared bit for bit with the original order's first output. The ``optimize``
variant runs a rewritten program instead of an order (``runtime.optimize_run``); where it bucketed reductions, its
outputs are compared within a tolerance (``runtime.numerics``).
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
import os
import statistics
import sys
import threading
import time
from collections.abc import Callable, Iterator, Mapping
from typing import TYPE_CHECKING, Any

import numpy as np
import torch
import torch.distributed as dist
import torch.fx

from commsched.passes.budget import MemoryBudget
from commsched.report.run_report import (
    CollectiveTiming,
    CostTotals,
    GraphInfo,
    InterferenceProbe,
    LinkCalibration,
    OrderResult,
    PhaseTimes,
    Prediction,
    ProgramChange,
    RunReport,
    StepTimes,
)
from commsched.report.run_verdict import judge_speedup, relative_spread, run_warnings
from commsched.runtime.apply import apply_schedule, check_same_graph, copy_graph_module
from commsched.runtime.numerics import SAME, OutputDiff, compare_outputs
from commsched.runtime.profile import profile_variants
from commsched.runtime.profile import sync_device as _sync
from commsched.workloads.program import StepProgram, WorkloadSpec

if TYPE_CHECKING:
    from commsched.runtime.optimize_run import OptimizedRun


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunConfig:
    """What a real run does (picklable: it travels to every rank)."""

    spec: WorkloadSpec
    variants: tuple[str, ...] = ("original", "overlap", "torch")
    """orders to run: "original", "overlap" (ours), "torch" (torch's OverlapScheduler), "optimize" (the program
    ``commsched.optimize`` keeps on the ``hardware`` profile; needs "original", which its outputs are compared
    with) or names in ``orders``"""
    orders: Mapping[str, tuple[str, ...]] | None = None
    """explicit orders (FX node names) for variants; they override the built-in ones"""
    iters: int = 10
    """timed steps per variant"""
    warmup: int = 2
    """untimed steps per variant first"""
    seed: int = 0
    """parameters and batch (``StepProgram.real_inputs``)"""
    hardware: str = "cpu-local"
    """profile for the ``profile`` cost source (name or TOML path)"""
    costs: str = "measured"
    """cost source the schedulers see: "measured" (each op's measured time) or "profile" (the roofline)"""
    passes: str | tuple[str, ...] = "default"
    """our scheduler: a pass preset or pass list"""
    knobs: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """pass options (``commsched.passes.schedule(**knobs)``); see ``plan_orders`` for the defaults"""
    memory_budget: MemoryBudget | float | str | None = None
    """memory limit of both schedulers (a MemoryBudget or its knob spelling: ``1.1`` is 1.1 x the input order's peak,
    ``"40GiB"`` absolute); None: torch's default rule"""
    threads: int = 1
    """intra-op threads per rank (1: deterministic reductions, and ranks do not fight over cores)"""
    gloo_threads: int = 1
    """gloo worker threads per process group: 1 runs a group's collectives one at a time in issue order, like
    NCCL's stream per communicator and like the schedulers' model; gloo's default (2) runs two at once"""
    compute_nice: int = 10
    """increment to the niceness of each rank's compute thread on a CPU run (Linux), applied once its process
    groups (and so gloo's worker threads) exist: the scheduler then favours a communication thread that wakes over
    compute, much as NCCL's kernels get SMs of their own on a GPU, and the cores' time is shared the way the
    simulator's two slowdown factors describe. Without it a woken gloo thread may wait a scheduler slice behind
    the compute of both ranks, and how long depends on the moment. Intra-op threads started later inherit it; on
    a shared machine, compute also yields to other jobs at the default niceness. 0 leaves the thread as it is"""
    check_reference: bool = True
    """also compare the original order's outputs with the unsharded model (tolerance 1e-4)"""
    calibrate_reps: int = 5
    """timed repetitions of each distinct collective on the link"""
    op_reps: int = 3
    """op-by-op runs to time every compute op"""
    profile_dir: str | None = None
    """after the timed steps, run one more step of each variant under the PyTorch profiler (CPU activities, plus
    CUDA on a GPU) and write ``{profile_dir}/{variant}-rank{r}.json.gz`` (what ``commsched replay`` reads)"""
    comm_slowdown: bool = True
    """let the prediction charge communication's slowdown while compute runs (measured by the interference probe;
    on a CPU run gloo competes with compute for the cores); False: communication runs at its calibrated speed"""

    def __post_init__(self) -> None:
        from commsched.runtime.plan import COST_SOURCES

        if self.iters < 1 or self.warmup < 0:
            raise ValueError(f"iters={self.iters} must be >= 1 and warmup={self.warmup} >= 0")
        if self.costs not in COST_SOURCES:
            raise ValueError(f"costs={self.costs!r}: expected one of {', '.join(COST_SOURCES)}")
        if not self.variants or len(set(self.variants)) != len(self.variants):
            raise ValueError(f"variants={self.variants}: expected distinct names, at least one")
        if self.threads < 1 or self.gloo_threads < 1:
            raise ValueError(f"threads={self.threads}, gloo_threads={self.gloo_threads}: expected >= 1")
        if not 0 <= self.compute_nice <= 19:
            raise ValueError(f"compute_nice={self.compute_nice}: expected 0 to 19 (a niceness increment)")
        from commsched.passes import check_knobs
        from commsched.runtime.plan import BUILTIN_VARIANTS

        unknown = [v for v in self.variants if v not in BUILTIN_VARIANTS and v not in (self.orders or {})]
        if unknown:
            raise ValueError(
                f"variants {unknown}: expected {', '.join(BUILTIN_VARIANTS)} or a name given an order in `orders`"
            )

        if self.runs_optimize and "original" not in self.variants:
            raise ValueError(
                f"variants={self.variants}: 'optimize' runs a rewritten program whose outputs are compared with the "
                "original order's: run 'original' too"
            )
        if "overlap" in self.variants:
            check_knobs(self.passes, self.knobs)
        if self.memory_budget is not None:
            object.__setattr__(self, "memory_budget", MemoryBudget.parse(self.memory_budget, "memory_budget"))

    @property
    def runs_optimize(self) -> bool:
        """True when the ``optimize`` variant runs the program ``commsched.optimize`` keeps (not a given order)."""
        from commsched.runtime.plan import OPTIMIZE

        return OPTIMIZE in self.variants and OPTIMIZE not in (self.orders or {})


def gloo_backend(threads: int) -> str:
    """The name of a gloo backend whose process groups run ``threads`` worker threads, registered on first use
    (torch's own "gloo" always starts 2, and ``init_process_group`` passes gloo no options)."""
    name = f"gloo_threads{threads}"
    if name not in dist.Backend.backend_list:
        from torch.distributed import ProcessGroupGloo

        def create(store, rank: int, size: int, timeout) -> ProcessGroupGloo:
            opts = ProcessGroupGloo._Options()
            opts._timeout = timeout
            opts._threads = threads
            opts._devices = [ProcessGroupGloo.create_default_device()]
            return ProcessGroupGloo(store, rank, size, opts)

        dist.Backend.register_backend(name, create, devices=["cpu"])
    return name


@contextlib.contextmanager
def niced_compute_thread(increment: int) -> Iterator[None]:
    """Raise this thread's niceness by ``increment`` for the block (Linux only, where niceness is per thread);
    threads started before keep theirs, threads this one starts inside the block inherit it. Lowering it again
    needs CAP_SYS_NICE: where that is refused the thread stays niced; where raising it is refused, nothing
    changes."""
    if increment <= 0 or not sys.platform.startswith("linux"):
        yield
        return
    tid = threading.get_native_id()
    old = os.getpriority(os.PRIO_PROCESS, tid)
    try:
        os.setpriority(os.PRIO_PROCESS, tid, min(19, old + increment))
    except PermissionError:  # a sandbox that forbids it: run as is
        yield
        return
    try:
        yield
    finally:
        with contextlib.suppress(PermissionError):
            os.setpriority(os.PRIO_PROCESS, tid, old)


def rank_device(backend: str) -> torch.device:
    if backend == "nccl":
        local = int(os.environ.get("LOCAL_RANK", dist.get_rank() % max(torch.cuda.device_count(), 1)))
        torch.cuda.set_device(local)
        return torch.device("cuda", local)
    return torch.device("cpu")


def trace_rank(spec: WorkloadSpec, groups: Mapping[str, Any], rank: int, device: torch.device):
    """(StepProgram, GraphModule) of this rank's step, traced on fake tensors with its real process groups."""
    from commsched.workloads.trace import trace_step

    program = StepProgram(spec, groups, rank)
    return program, trace_step(program, device)


@dataclasses.dataclass(frozen=True)
class _Plan:
    """What rank 0 plans and hands every rank (picklable): the orders, and its part of the report."""

    orders: dict[str, list[str]]
    """FX node names of each variant's order"""
    graph: GraphInfo
    hardware: str
    cost_totals: dict[str, CostTotals]
    predicted: dict[str, dict[str, Prediction]]
    """by variant, then cost source"""
    moved_nodes: dict[str, int]
    skipped: dict[str, str]
    plan_s: float
    programs: dict[str, ProgramChange] = dataclasses.field(default_factory=dict)
    """variants that run a rewritten program: what it is"""


def _plan_on_rank0(
    cfg: RunConfig, gm, graph, rows, interference: InterferenceProbe, op_times, optimized: OptimizedRun | None
) -> _Plan:
    """Rank 0: build both cost sources, plan the orders, predict (``optimized``: its program, on the same cost
    sources with its own collectives' calibration and new ops' times)."""
    from commsched import hardware as hw_mod
    from commsched.runtime.plan import OPTIMIZE, cost_sources, cost_summary, link_table, plan_orders, predict

    hw = hw_mod.for_graph(cfg.hardware, graph)
    slowdown = interference.compute_slowdown
    comm_slowdown = interference.comm_slowdown if cfg.comm_slowdown else 1.0
    every = cost_sources(graph, hw, link_table(rows), op_times, slowdown, comm_slowdown)
    costs = {k: every[k] for k in ("measured", "profile")}
    given = {k: tuple(v) for k, v in (cfg.orders or {}).items()}
    t0 = time.perf_counter()
    orders, skipped = plan_orders(
        gm,
        graph,
        costs[cfg.costs],
        [v for v in cfg.variants if v != OPTIMIZE or not cfg.runs_optimize],
        passes=cfg.passes,
        knobs=cfg.knobs,
        memory_budget=cfg.memory_budget,
        given=given,
    )
    plan_s = time.perf_counter() - t0
    plan = _Plan(
        orders={k: [graph.names[i] for i in o.tolist()] for k, o in orders.items()},
        graph=GraphInfo(nodes=len(graph), collectives=len(graph.collectives), meta=graph.meta.get("workload")),
        hardware=hw.name,
        cost_totals={k: cost_summary(graph, c) for k, c in costs.items()},
        predicted=predict(graph, every, orders),
        moved_nodes={k: int(np.count_nonzero(o != np.arange(len(o)))) for k, o in orders.items()},
        skipped=skipped,
        plan_s=plan_s,
    )
    if optimized is not None:
        og, order = optimized.optimized.graph, np.asarray(optimized.optimized.schedule.order)
        table = link_table([*rows, *optimized.rows])
        opt_costs = cost_sources(og, hw, table, {**optimized.op_times_s, **op_times}, slowdown, comm_slowdown)
        plan.predicted[OPTIMIZE] = predict(og, opt_costs, {OPTIMIZE: order})[OPTIMIZE]
        plan.moved_nodes[OPTIMIZE] = optimized.moved_nodes(graph)
        plan.programs[OPTIMIZE] = optimized.change()
    return plan


def _variant_modules(
    cfg: RunConfig, gm: torch.fx.GraphModule, plan: _Plan, optimized: OptimizedRun | None
) -> tuple[dict[str, torch.fx.GraphModule], dict[str, float]]:
    """The module each variant runs (a copy of ``gm`` in its order, or the optimized program), and the relative
    tolerance of each rewritten program's outputs (the others must be bit-identical)."""
    modules, rtols = {}, {}
    for name in cfg.variants:
        if name in plan.orders:
            modules[name] = apply_schedule(copy_graph_module(gm), plan.orders[name])
        elif name in plan.programs and optimized is not None:
            modules[name], rtols[name] = optimized.optimized.gm, optimized.rtol
    return modules, rtols


def _outputs(out: Any) -> list[torch.Tensor]:
    return [t.detach() for t in (out if isinstance(out, (list, tuple)) else [out]) if isinstance(t, torch.Tensor)]


def _identical(a: list[torch.Tensor], b: list[torch.Tensor]) -> bool:
    return len(a) == len(b) and all(x.dtype == y.dtype and torch.equal(x, y) for x, y in zip(a, b))


def _reference_error(cfg: RunConfig, rank: int, outputs: list[torch.Tensor]) -> float:
    from commsched.workloads.real import expected_rank_outputs, reference_outputs

    expected = expected_rank_outputs(cfg.spec, rank, reference_outputs(cfg.spec, seed=cfg.seed))
    if len(expected) != len(outputs):
        return math.inf
    err = 0.0
    for got, want in zip(outputs, expected):
        scale = max(want.abs().max().item(), 1e-30)
        err = max(err, (got.cpu().to(want.dtype) - want).abs().max().item() / scale)
    return err


def _time_variants(
    cfg: RunConfig,
    modules: dict[str, torch.fx.GraphModule],
    inputs: list[torch.Tensor],
    device: torch.device,
    rtols: Mapping[str, float] | None = None,
    on_step: Callable[[int, int], None] | None = None,
) -> tuple[dict[str, list[float]], dict[str, bool], dict[str, OutputDiff], list[torch.Tensor]]:
    """Per variant: step seconds of each timed iteration on this rank, and whether every output of every step was
    bit-identical to the original order's first output; for the variants in ``rtols`` (rewritten programs), also
    how far their outputs were from it, within that relative tolerance (``numerics.compare_outputs``). Also
    returns that first output. ``on_step(done, total)`` after each step of every variant."""
    names = list(modules)
    first_name = "original" if "original" in modules else names[0]
    times: dict[str, list[float]] = {v: [] for v in names}
    rtols = rtols or {}
    diffs = {v: SAME for v in names if v in rtols}
    with torch.no_grad():
        reference = _outputs(modules[first_name](*inputs))
        identical = {v: True for v in names}
        for it in range(cfg.warmup + cfg.iters):
            k = it % len(names)
            for v in names[k:] + names[:k]:  # rotate: no variant always runs right after the same one
                dist.barrier()
                _sync(device)
                t0 = time.perf_counter()
                out = modules[v](*inputs)
                _sync(device)
                dt = time.perf_counter() - t0
                if it >= cfg.warmup:
                    times[v].append(dt)
                identical[v] = identical[v] and _identical(_outputs(out), reference)
                if v in diffs:
                    diffs[v] = diffs[v].merge(compare_outputs(_outputs(out), reference, rtols[v]))
            if on_step is not None:
                on_step(it + 1, cfg.warmup + cfg.iters)
    return times, identical, diffs, reference


def step_times(samples: list[float]) -> StepTimes:
    s = sorted(samples)
    q = np.quantile(np.asarray(s), [0.25, 0.75]) if s else [math.nan, math.nan]
    return StepTimes(
        median_s=statistics.median(s), p25_s=float(q[0]), p75_s=float(q[1]), min_s=s[0], max_s=s[-1], samples_s=tuple(s)
    )


@dataclasses.dataclass(frozen=True)
class _RankResult:
    """One rank's measurements, gathered on rank 0."""

    times_s: dict[str, list[float]]
    """per variant, every timed step on this rank"""
    identical: dict[str, bool]
    reference_error: float | None
    diffs: dict[str, OutputDiff] = dataclasses.field(default_factory=dict)
    """rewritten programs' outputs against the original order's (``numerics.compare_outputs``)"""


def run_rank(
    cfg: RunConfig,
    *,
    backend: str | None = None,
    on_report: Callable[[RunReport], None] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> RunReport | None:
    """This rank's part of a run; rank 0 returns the report, the others None.

    Initialises torch.distributed from the environment (env://: MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE, as
    torchrun sets them) unless it already is, and then destroys it again. ``backend``: "gloo" or "nccl" (default:
    NCCL when CUDA is available, else gloo). ``on_report``: called on rank 0 with the report once every rank has
    finished, before the process groups are torn down (a teardown that fails cannot lose the results).
    ``on_progress``: called on rank 0 with one line at each phase and after each step."""
    import datetime

    from commsched.frontends.fx import from_fx
    from commsched.runtime.measure import (
        measure_graph_collectives,
        measure_interference,
        measure_op_times,
        step_comm_s,
    )
    from commsched.workloads.mesh import create_groups
    from commsched.workloads.trace import workload_meta

    own_pg = not dist.is_initialized()
    if own_pg:
        backend = backend or ("nccl" if torch.cuda.is_available() else "gloo")
        if backend == "gloo" and cfg.gloo_threads != 2:
            backend = gloo_backend(cfg.gloo_threads)
        dist.init_process_group(backend, init_method="env://", timeout=datetime.timedelta(seconds=600))
    backend = dist.get_backend()
    niced = contextlib.ExitStack()
    say = on_progress if on_progress is not None and dist.get_rank() == 0 else (lambda _text: None)
    try:
        torch.set_num_threads(cfg.threads)
        rank, world = dist.get_rank(), dist.get_world_size()
        if world != cfg.spec.plan.world_size:
            raise ValueError(f"the run has {world} ranks; the workload was resolved for {cfg.spec.plan.world_size}")
        device = rank_device(backend)
        say(f"{world} ranks started; tracing the step")
        t_start = time.perf_counter()
        groups = create_groups(cfg.spec.plan, rank)
        # after every process group exists: their communication threads keep the default priority
        niced.enter_context(niced_compute_thread(cfg.compute_nice if device.type == "cpu" else 0))
        program, gm = trace_rank(cfg.spec, groups, rank, device)
        check_same_graph(gm)
        trace_s = time.perf_counter() - t_start
        inputs = [t.detach().to(device) for t in program.real_inputs(seed=cfg.seed)]
        say(f"traced in {trace_s:.1f} s; measuring collectives and kernels")

        # calibration: every rank measures, rank 0 plans
        graph = from_fx(gm, meta=workload_meta(program, groups))
        rows = measure_graph_collectives(gm, graph, reps=cfg.calibrate_reps, device=device)
        # the probe replays the step's own first kernels, as many as the step's collectives take to run
        replay: list[Any] = []
        comm_s = step_comm_s(graph, rows)
        op_times = measure_op_times(gm, graph, inputs, reps=cfg.op_reps, device=device, record=replay, record_s=comm_s)
        interference = measure_interference(gm, graph, device=device, compute_calls=replay)
        del replay
        all_ops: list[Any] = [None] * world
        dist.all_gather_object(all_ops, op_times)
        op_median = {k: statistics.median(d.get(k, v) for d in all_ops) for k, v in op_times.items()}
        calib_s = time.perf_counter() - t_start - trace_s
        optimized, optimize_s = None, None
        if cfg.runs_optimize:  # every rank: the same search on its own step, checked the same, then calibrated
            from commsched.runtime.optimize_run import build_optimized

            optimized = build_optimized(gm, graph, cfg, inputs, rows, op_median, device)
            optimize_s = time.perf_counter() - t_start - trace_s - calib_s

        say("planning the orders")
        plan_box: list[Any] = [None]
        failure: Exception | None = None
        if rank == 0:
            try:
                plan_box[0] = _plan_on_rank0(cfg, gm, graph, rows, interference, op_median, optimized)
            except Exception as exc:  # every rank must leave the broadcast, then all raise
                failure, plan_box[0] = exc, f"{type(exc).__name__}: {exc}"
        dist.broadcast_object_list(plan_box, src=0)
        if failure is not None:
            raise failure
        if isinstance(plan_box[0], str):
            raise RuntimeError(f"rank 0 could not plan the orders: {plan_box[0]}")
        plan: _Plan = plan_box[0]

        modules, rtols = _variant_modules(cfg, gm, plan, optimized)

        def step_done(done: int, total: int) -> None:
            say(f"step {done}/{total} ({cfg.warmup} warm-up) of {len(modules)} orders")

        times, identical, diffs, first = _time_variants(cfg, modules, inputs, device, rtols, step_done)
        if cfg.profile_dir is not None:
            profile_variants(cfg.profile_dir, modules, inputs, device, rank)
        ref_err = _reference_error(cfg, rank, first) if cfg.check_reference else None

        gathered: list[Any] = [None] * world
        dist.all_gather_object(gathered, _RankResult(times, identical, ref_err, diffs))
        report = None
        if rank == 0:
            timed = [*rows, *(optimized.rows if optimized is not None else [])]  # optimize's: its bucketed sizes
            link = LinkCalibration(collectives=tuple(CollectiveTiming(*r) for r in timed), interference=interference)
            phases = PhaseTimes(trace=trace_s, calibrate=calib_s, plan=plan.plan_s, optimize=optimize_s)
            report = _report(cfg, backend, world, plan, gathered, link, phases, optimized)
        if report is not None and on_report is not None:
            on_report(report)  # saved before the barrier: no rank starts tearing down until it is
        if own_pg:
            # all ranks tear down together: a rank that closes its sockets while a peer's gloo loop still reads
            # them can make that peer abort
            dist.barrier()
        return report
    finally:
        niced.close()
        if own_pg:
            dist.destroy_process_group()


def _order_result(
    cfg: RunConfig, name: str, plan: _Plan, gathered: list[_RankResult], optimized: OptimizedRun | None = None
) -> OrderResult:
    """One variant's measurements from every rank, next to rank 0's predictions (speedups are added later); a
    rewritten program's (``optimized``) with what it is and how its outputs compared."""
    outputs = None
    if name in plan.programs and optimized is not None:
        diff = SAME
        for g in gathered:
            diff = diff.merge(g.diffs[name])
        outputs = optimized.output_check(diff)
    measured = step_times(_steps_s(gathered, name))
    chosen = plan.predicted[name][cfg.costs]
    return OrderResult(
        measured=measured,
        predicted={src: p.makespan_s for src, p in plan.predicted[name].items()},
        predicted_exposed_comm_s=chosen.exposed_comm_s,
        lower_bound_s=chosen.lower_bound_s,
        peak_memory_bytes=chosen.peak_memory_bytes,
        bit_identical=all(g.identical[name] for g in gathered),
        moved_nodes=plan.moved_nodes[name],
        # the calibration keeps medians; the fastest step shows what other jobs on a shared machine cost
        prediction_error=chosen.makespan_s / measured.median_s - 1.0,
        prediction_error_vs_min=chosen.makespan_s / measured.min_s - 1.0,
        program=plan.programs.get(name),
        outputs=outputs,
    )


def _steps_s(gathered: list[_RankResult], name: str) -> list[float]:
    """Variant ``name``'s step times in run order: a step ends when its slowest rank does."""
    return [max(ts) for ts in zip(*(g.times_s[name] for g in gathered))]


def _with_speedups(v: OrderResult, base: OrderResult, costs: str, steps_s: list[float], base_steps_s: list[float]):
    """``v`` with its speedups over ``base`` (the original order) and, but for the original itself, their verdict
    (``steps_s`` / ``base_steps_s``: both orders' step times in run order)."""
    predicted = base.predicted[costs] / v.predicted[costs]
    check = None
    if v is not base:
        spread = max(relative_spread(v.measured), relative_spread(base.measured))
        check = judge_speedup(base_steps_s, steps_s, predicted, spread)
    return dataclasses.replace(
        v,
        speedup_measured=base.measured.median_s / v.measured.median_s,
        speedup_measured_min=base.measured.min_s / v.measured.min_s,
        speedup_predicted=predicted,
        speedup_check=check,
    )


def _report(
    cfg: RunConfig,
    backend: str,
    world: int,
    plan: _Plan,
    gathered: list[_RankResult],
    link,
    phases,
    optimized: OptimizedRun | None = None,
) -> RunReport:
    ran = [n for n in cfg.variants if n in gathered[0].times_s]
    variants = {n: _order_result(cfg, n, plan, gathered, optimized) for n in ran}
    base = variants.get("original")
    if base is not None:
        steps = {n: _steps_s(gathered, n) for n in ran}
        variants = {n: _with_speedups(v, base, cfg.costs, steps[n], steps["original"]) for n, v in variants.items()}
    errs = [g.reference_error for g in gathered if g.reference_error is not None]
    spec = cfg.spec
    report = RunReport(
        workload=plan.graph.meta,
        preset=spec.model.name,
        parallel=spec.plan.parallel,
        world_size=world,
        seq_len=spec.seq_len,
        batch=spec.batch,
        dtype=str(spec.dtype).removeprefix("torch."),
        backend=backend,
        threads=cfg.threads,
        gloo_threads=cfg.gloo_threads,
        compute_nice=cfg.compute_nice,
        iters=cfg.iters,
        warmup=cfg.warmup,
        graph=plan.graph,
        hardware=plan.hardware,
        costs=cfg.costs,
        cost_totals=plan.cost_totals,
        link=link,
        variants=variants,
        skipped=plan.skipped,
        reference_max_rel_error=max(errs) if errs else None,
        timings_s=phases,
    )
    return dataclasses.replace(report, warnings=run_warnings(report))

"""Real pipeline runs: torch.distributed.pipelining's schedules on gloo ranks, measured against the prediction.

A zoo decoder (unsharded, one replica: pure PP) is split over P x V stages by torchtitan's rule
(:func:`commsched.pipeline.split.stages_of`); each rank builds the stages torch's schedule puts on it
(``PipelineProgram.stage_to_rank``) as ``torch.distributed.pipelining.PipelineStage`` s of
:class:`~commsched.runtime.pipeline_stage.ZooStage` modules, and runs torch's schedule class
(``get_schedule_class``) for M micro-batches. ``warmup`` + ``iters`` rounds: each measures what the prediction needs
(:mod:`commsched.runtime.pipeline_calibrate`: the stages' forward and backward, the P2P link, the cores the ranks
share), then runs one step of every schedule in rotating order and one of its twin over empty stages (torch's
runtime alone); a step ends when its slowest rank does. Rank 0 simulates torch's lowered schedule with the medians
(:func:`predict`); the launcher adds the hardware profile's roofline prediction (:func:`profile_prediction`, which
traces). The first step's loss (the mean over the micro-batches) and gradients (scaled by 1/M, torch's
``scale_grads``) are checked against the unpipelined model's (:func:`commsched.workloads.real.reference_outputs`).
Tested with GPipe, 1F1B and Interleaved1F1B.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import math
import pickle
import statistics
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist

from commsched.pipeline.actions import MULTI_STAGE, SCHEDULES, PipelineProgram, lower_schedule
from commsched.pipeline.split import stages_of
from commsched.runtime.executor import niced_compute_thread, step_times
from commsched.runtime.netns import ShapedNetwork
from commsched.runtime.pipeline_calibrate import (
    P2PCalibration,
    PipelineRunReport,
    ScheduleRun,
    StageCost,
    StageTimer,
    available_cores,
    cpu_share_round,
    medians,
    one_rank_at_a_time,
    p2p_hardware,
    p2p_round,
    shared_cores,
)
from commsched.runtime.pipeline_stage import EmptyStage, ZooStage, empty_loss, stage_loss
from commsched.workloads.program import WorkloadSpec

SHARE_PASSES = 5
"""the cores' probe window holds at least this many passes of a rank's stages (alone)"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineRunConfig:
    """What a real pipeline run does (picklable: it travels to every rank)."""

    spec: WorkloadSpec
    """the whole model on one rank (parallel "none"); ``batch``: the sequences of one step, split into micro-batches"""
    pp_size: int
    schedules: tuple[str, ...]
    """torch's schedule names, run in rotation"""
    microbatches: int
    stages_per_rank: int | None = None
    """V of the multi-stage schedules (None: torch's 2); the single-stage ones run one stage per rank"""
    iters: int = 10
    warmup: int = 2
    seed: int = 0
    threads: int = 1
    """intra-op threads per rank"""
    compute_nice: int = 0
    """niceness increment of each rank's compute thread after its process group exists (``RunConfig.compute_nice``:
    gloo's threads first); on a machine other jobs load, a niced compute thread also yields to them"""
    p2p_reps: int = 5
    """messages of each size per round of the P2P probe"""
    share_window_s: float = 0.2
    """the cores' probe repeats a rank's stages this long alone and all together (at least SHARE_PASSES passes)"""
    hardware: str = "cpu-local"
    """the profile of the roofline prediction (its link replaced by the measured P2P)"""

    def __post_init__(self) -> None:
        if self.spec.plan.world_size != 1 or not self.spec.train:
            raise ValueError("spec: expected the unsharded model (parallel 'none', world 1) in training")
        if isinstance(self.pp_size, bool) or not isinstance(self.pp_size, int) or self.pp_size < 2:
            raise ValueError(f"pp_size={self.pp_size!r}: a pipeline run needs at least 2 ranks")
        if not self.schedules or len(set(self.schedules)) != len(self.schedules):
            raise ValueError(f"pp_schedule={','.join(self.schedules)}: expected distinct names, at least one")
        if self.spec.batch % self.microbatches:
            raise ValueError(f"batch={self.spec.batch}: expected a multiple of microbatches={self.microbatches} "
                             "(torch splits the batch into equal micro-batches)")  # fmt: skip
        if not self.share_window_s > 0:
            raise ValueError(f"share_window_s={self.share_window_s}: expected seconds > 0")
        if self.iters < 1 or self.warmup < 1 or self.p2p_reps < 1 or self.threads < 1:
            raise ValueError(f"iters={self.iters}, warmup={self.warmup}, p2p_reps={self.p2p_reps}, threads="
                             f"{self.threads}: expected >= 1 each (the first step checks the numerics)")  # fmt: skip
        for name in self.schedules:
            self.program(name)  # torch's own checks (unknown name, V, M), as one-line ValueErrors
            stages_of(self.num_stages(name), self.spec.model.n_layers)  # torchtitan's split must work

    def stages_for(self, schedule: str) -> int | None:
        return self.stages_per_rank if schedule in MULTI_STAGE else None

    def program(self, schedule: str) -> PipelineProgram:
        """torch's ``schedule`` lowered for this run (:func:`commsched.pipeline.lower_schedule`)."""
        if schedule not in SCHEDULES:
            raise ValueError(f"pp_schedule={schedule!r}: expected one of {', '.join(SCHEDULES)}")
        return lower_schedule(schedule, self.pp_size, self.microbatches, self.stages_for(schedule))

    def num_stages(self, schedule: str) -> int:
        return self.program(schedule).num_stages

    @property
    def microbatch(self) -> int:
        """Sequences per micro-batch."""
        return self.spec.batch // self.microbatches

    @property
    def send_bytes(self) -> int:
        """The hidden state one stage sends the next per micro-batch (its gradient comes back the same size)."""
        return self.microbatch * self.spec.seq_len * self.spec.model.dim * self.spec.dtype.itemsize


# ---------------------------------------------------------------------------------------------------- one rank
@dataclasses.dataclass(eq=False)
class _Built:
    """One schedule on this rank: its program, stage modules, torch's schedule object."""

    program: PipelineProgram
    modules: list[ZooStage] | list[EmptyStage]
    schedule: Any

    @property
    def first(self) -> bool:
        return any(m.stage.first for m in self.modules)

    @property
    def last(self) -> bool:
        return any(m.stage.last for m in self.modules)

    def step(self, tokens: torch.Tensor, labels: torch.Tensor) -> list[torch.Tensor]:
        """One pipelined step (gradients zeroed first); the last stage's micro-batch losses."""
        for m in self.modules:
            m.zero_grad(set_to_none=True)
        losses: list[torch.Tensor] = []
        args = (tokens,) if self.first else ()
        kwargs = {"target": labels, "losses": losses} if self.last else {}
        self.schedule.step(*args, **kwargs)
        return losses


def _build(cfg: PipelineRunConfig, name: str, rank: int, full: dict[str, torch.Tensor] | None) -> _Built:
    """Schedule ``name`` on this rank: its stages of the model (``full``: its parameters), or empty stages."""
    from torch.distributed.pipelining import PipelineStage
    from torch.distributed.pipelining.schedules import get_schedule_class

    program = cfg.program(name)
    stages = stages_of(program.num_stages, cfg.spec.model.n_layers)
    mine = [s for s in stages if program.stage_to_rank[s.index] == rank]
    if full is None:
        modules, loss = [EmptyStage(cfg.spec, s, cfg.microbatch) for s in mine], empty_loss
    else:
        modules, loss = [ZooStage(cfg.spec, s, full, cfg.microbatch) for s in mine], stage_loss
    cpu = torch.device("cpu")
    pipe = [PipelineStage(m, m.stage.index, program.num_stages, cpu) for m in modules]
    cls = get_schedule_class(name)
    schedule = cls(pipe if name in MULTI_STAGE else pipe[0], cfg.microbatches, loss_fn=loss)
    return _Built(program, modules, schedule)


@dataclasses.dataclass
class _Samples:
    """This rank's samples over the timed rounds."""

    steps_s: dict[str, list[float]]  # per schedule
    empty_s: dict[str, list[float]]  # per schedule, its twin of empty stages
    stages_s: dict[int, list[list[tuple[float, float]]]]  # per split (stages): per round, (F, B) of each own stage
    p2p_s: list[tuple[float, float]]  # per round: (small, hidden state) seconds per message
    share: list[tuple[float, float]]  # per round: its stages' slowdown among a subset, and with all (cpu_share_round)
    first: dict[str, tuple[list[float], dict[str, torch.Tensor]]]  # per schedule: first step's losses, gradients


@dataclasses.dataclass(frozen=True)
class _RankSummary:
    """What each rank hands rank 0 (picklable)."""

    steps_s: dict[str, list[float]]  # per schedule, every timed step
    empty_s: dict[str, list[float]]  # per schedule, every timed step of its twin of empty stages
    stage_medians_s: dict[int, tuple[float, ...]]  # per split: F, B, F, B ... of its own stages (module order)
    p2p_medians_s: tuple[float, ...]  # (small, hidden state) seconds per message
    numerics: dict[str, tuple[float | None, float]]  # per schedule: (loss on the last stage's rank, grad error)
    slowdown: tuple[float, float]  # the medians of its stages' slowdowns among a subset and with all (cpu_share_round)


def _run_rounds(cfg: PipelineRunConfig, built: dict[str, _Built], empty: dict[str, _Built], tokens, labels,
                say) -> _Samples:  # fmt: skip
    """``warmup`` + ``iters`` rounds; each times every own stage once (per split), the P2P probe, the cores'
    share, one step of every schedule in rotating order, then one of each ``empty`` twin; the warm-up rounds are
    not kept, but for each schedule's first step's numerics."""
    names = list(built)
    timers: dict[int, list[StageTimer]] = {}
    for b in built.values():
        timers.setdefault(b.program.num_stages, [StageTimer(m, labels[: cfg.microbatch]) for m in b.modules])
    out = _Samples({n: [] for n in names}, {n: [] for n in names}, {n: [] for n in timers}, [], [], {})
    for it in range(cfg.warmup + cfg.iters):
        kept = it >= cfg.warmup
        rows = {split: one_rank_at_a_time(lambda ts=ts: [t.time_once(sync=False) for t in ts])
                for split, ts in timers.items()}  # fmt: skip
        first_split = next(iter(timers))
        pass_s = sum(map(sum, rows[first_split]))
        window_s = max(cfg.share_window_s, SHARE_PASSES * pass_s)
        share = cpu_share_round(timers[first_split], window_s, min(cfg.pp_size, available_cores()))
        p2p = p2p_round(cfg.send_bytes, cfg.p2p_reps)
        if kept:
            for split, row in rows.items():
                out.stages_s[split].append(row)
            out.p2p_s.append(p2p)
            out.share.append(share)
        k = it % len(names)
        for name in names[k:] + names[:k]:  # rotate: no schedule always runs right after the same one
            dist.barrier()
            t0 = time.perf_counter()
            losses = built[name].step(tokens, labels)
            dt = time.perf_counter() - t0
            if kept:
                out.steps_s[name].append(dt)
            if name not in out.first:
                grads = {n: w.grad.detach().clone() for m in built[name].modules
                         for n, w in zip(m.names, m.weights, strict=True)}  # fmt: skip
                out.first[name] = ([float(x.detach()) for x in losses], grads)
        for name, twin in empty.items():
            dist.barrier()
            t0 = time.perf_counter()
            twin.step(tokens, labels)
            if kept:
                out.empty_s[name].append(time.perf_counter() - t0)
        say(f"round {it + 1}/{cfg.warmup + cfg.iters} ({cfg.warmup} warm-up) of {len(names)} schedules")
    return out


def _numerics(first: tuple[list[float], dict], reference: dict) -> tuple[float | None, float]:
    """(the step's loss: the mean of its micro-batches', on the last stage's rank, else None; the largest relative
    gradient error of this rank's parameters against the unpipelined step's)."""
    losses, grads = first
    err = 0.0
    for name, g in grads.items():
        want = reference["grads"][name]
        err = max(err, (g - want).abs().max().item() / max(want.abs().max().item(), 1e-30))
    return (statistics.fmean(losses) if losses else None), err


def run_pipeline_rank(
    cfg: PipelineRunConfig,
    *,
    on_report: Callable[[PipelineRunReport], None] | None = None,
    on_progress: Callable[[str], None] | None = None,
) -> PipelineRunReport | None:
    """This rank's part of a run; rank 0 returns the report (without the profile predictions, which trace), the
    others None. Initialises a gloo process group from the environment (env://) unless one exists, and destroys it
    after. ``on_report``: called on rank 0 before teardown."""
    from commsched.workloads.params import init_full_params
    from commsched.workloads.program import StepProgram
    from commsched.workloads.real import reference_outputs

    own_pg = not dist.is_initialized()
    if own_pg:
        dist.init_process_group("gloo", init_method="env://", timeout=datetime.timedelta(seconds=600))
    rank, world = dist.get_rank(), dist.get_world_size()
    say = on_progress if on_progress is not None and rank == 0 else (lambda _text: None)
    niced = contextlib.ExitStack()
    try:
        # after the process group exists: gloo's threads keep the default priority (see RunConfig.compute_nice)
        niced.enter_context(niced_compute_thread(cfg.compute_nice))
        torch.set_num_threads(cfg.threads)
        if world != cfg.pp_size:
            raise ValueError(f"the run has {world} ranks; pp_size={cfg.pp_size}")
        full = init_full_params(cfg.spec.model, seed=cfg.seed)
        program = StepProgram(cfg.spec, {}, 0)
        inputs = dict(zip(program.input_names, program.real_inputs(seed=cfg.seed, full_params=full), strict=False))
        built = {name: _build(cfg, name, rank, full) for name in cfg.schedules}
        empty = {name: _build(cfg, name, rank, None) for name in cfg.schedules}
        say(f"{world} ranks built {len(built)} schedules")
        samples = _run_rounds(cfg, built, empty, inputs["tokens"], inputs["labels"], say)
        reference = reference_outputs(cfg.spec, seed=cfg.seed)
        stage_medians = {n: medians([tuple(x for fb in row for x in fb) for row in rows])
                         for n, rows in samples.stages_s.items()}  # fmt: skip
        mine = _RankSummary(samples.steps_s, samples.empty_s, stage_medians, medians(samples.p2p_s),
                            {n: _numerics(samples.first[n], reference) for n in built},
                            medians(samples.share))  # fmt: skip
        every: list[Any] = [None] * world
        dist.all_gather_object(every, mine)
        report = None
        if rank == 0:
            report = _report(cfg, built, every, float(reference["losses"][0]))
            if on_report is not None:
                on_report(report)
        dist.barrier()  # every rank tears down together (a peer's closed socket can abort gloo)
        return report
    finally:
        niced.close()
        if own_pg:
            dist.destroy_process_group()


def _stage_costs(cfg: PipelineRunConfig, built: dict[str, _Built], every: list[_RankSummary]) -> dict[int, list]:
    """Per split, every stage's medians, from each rank's (F, B) medians of its stages in its modules' order."""
    out = {}
    for b in built.values():
        n = b.program.num_stages
        stages = stages_of(n, cfg.spec.model.n_layers)
        costs = []
        for rank, summary in enumerate(every):
            per_split = summary.stage_medians_s
            own = [s for s in stages if b.program.stage_to_rank[s.index] == rank]
            for j, st in enumerate(own):
                send = 0 if st.last else cfg.send_bytes
                costs.append(StageCost(stage=st.index, rank=rank, layers=len(st.layers), forward_s=per_split[n][2 * j],
                                       backward_s=per_split[n][2 * j + 1], send_bytes=send))  # fmt: skip
        out[n] = sorted(costs, key=lambda c: c.stage)
    return out


def _report(cfg: PipelineRunConfig, built: dict[str, _Built], every: list[_RankSummary], reference_loss: float):
    """Rank 0's report from every rank's (step samples, stage medians, P2P medians, numerics)."""
    costs = _stage_costs(cfg, built, every)
    p2p = P2PCalibration.fit(cfg.send_bytes, *every[1].p2p_medians_s)  # the receiver's clock
    points = shared_cores(cfg.pp_size, min(cfg.pp_size, available_cores()), [r.slowdown for r in every])
    runs = {}
    for name, b in built.items():
        steps = [max(ts) for ts in zip(*(r.steps_s[name] for r in every), strict=True)]  # the slowest rank ends it
        loss = next(r.numerics[name][0] for r in every if r.numerics[name][0] is not None)
        empty_s = statistics.median(max(ts) for ts in zip(*(r.empty_s[name] for r in every), strict=True))
        overhead_s = action_overhead_s(cfg, name, costs[b.program.num_stages], p2p, points, empty_s)
        step_s, dedicated_s, bubble = predict(cfg, name, costs[b.program.num_stages], p2p, points, overhead_s)
        runs[name] = ScheduleRun(schedule=name, stages_per_rank=b.program.stages_per_rank, measured=step_times(steps),
                                 predicted_s=step_s, predicted_dedicated_s=dedicated_s, empty_step_s=empty_s,
                                 action_overhead_s=overhead_s,
                                 predicted_bubble_fraction=bubble, predicted_profile_s=None,
                                 stages=tuple(costs[b.program.num_stages]), loss=loss, reference_loss=reference_loss,
                                 max_grad_error=max(r.numerics[name][1] for r in every),
                                 round_steps_s=tuple(steps))  # fmt: skip
    spec = cfg.spec
    return PipelineRunReport(preset=spec.model.name, layers=spec.model.n_layers, seq_len=spec.seq_len,
                             batch=spec.batch, dtype=str(spec.dtype).removeprefix("torch."), pp_size=cfg.pp_size,
                             microbatches=cfg.microbatches, iters=cfg.iters, warmup=cfg.warmup, threads=cfg.threads,
                             hardware=cfg.hardware, p2p=p2p, cores=points[-1][1], core_points=points,
                             schedules=runs)  # fmt: skip


def predict(cfg: PipelineRunConfig, name: str, costs: list[StageCost], p2p: P2PCalibration, cores: tuple,
            overhead_s: float = 0.0) -> tuple[float, float, float]:  # fmt: skip
    """(step seconds on the shared cores measured, ``cores``: :func:`shared_cores`'s points; the simulated step with
    a processor per rank; its bubble fraction) of torch's ``name`` simulated with the measured stage costs (each rank
    timed alone), each F and B ``overhead_s`` longer (torch's runtime per action: :func:`action_overhead_s`), and the
    measured link."""
    res = _simulated(cfg, name, costs, p2p, math.inf, overhead_s)
    return _simulated(cfg, name, costs, p2p, cores, overhead_s).step_s, res.step_s, res.bubble_fraction


def _simulated(cfg: PipelineRunConfig, name: str, costs: list[StageCost], p2p: P2PCalibration,
               cores: tuple | float, overhead_s: float) -> Any:  # fmt: skip
    """torch's ``name`` simulated as :func:`predict` describes, its ranks' compute on ``cores``."""
    from commsched.pipeline import StageCosts, simulate_program

    stage_costs = StageCosts(forward_s=[c.forward_s + overhead_s for c in costs],
                             backward_s=[c.backward_s + overhead_s for c in costs],
                             send_bytes=[c.send_bytes for c in costs])  # fmt: skip
    hw = p2p_hardware(cfg.hardware, cfg.pp_size, p2p)
    return simulate_program(cfg.program(name), stage_costs, hw, host_cores=cores)


def action_overhead_s(cfg: PipelineRunConfig, name: str, costs: list[StageCost], p2p: P2PCalibration, cores: tuple,
                      empty_step_s: float) -> float:  # fmt: skip
    """The seconds torch's runtime adds to each F and B action: the overhead with which the twin schedule of empty
    stages (no compute, the same P2P) is predicted to take its measured step ``empty_step_s`` (bisection; 0 when
    the link alone accounts for it)."""
    zero = [dataclasses.replace(c, forward_s=0.0, backward_s=0.0) for c in costs]
    low, high = 0.0, empty_step_s
    if _simulated(cfg, name, zero, p2p, cores, 0.0).step_s >= empty_step_s:
        return 0.0
    for _ in range(40):  # the predicted step grows with the overhead: 40 halvings reach ns
        mid = (low + high) / 2
        low, high = (mid, high) if _simulated(cfg, name, zero, p2p, cores, mid).step_s < empty_step_s else (low, mid)
    return (low + high) / 2


def profile_prediction(cfg: PipelineRunConfig, name: str, p2p: P2PCalibration) -> float:
    """The step of ``name`` simulated from the hardware profile's roofline of its traced stages
    (:func:`commsched.pipeline.job.simulate_job`), the link as measured. Traces on fake process groups: call it in a
    process without a real one (the launcher's)."""
    from commsched.pipeline.job import PipelineJob, simulate_job

    spec = cfg.spec
    job = PipelineJob(preset=spec.model.name, parallel="none", world_size=cfg.pp_size, pp_size=cfg.pp_size,
                      schedule=name, microbatches=cfg.microbatches, stages_per_rank=cfg.stages_for(name),
                      layers=spec.model.n_layers, seq_len=spec.seq_len, batch=spec.batch,
                      dtype=str(spec.dtype).removeprefix("torch."))  # fmt: skip
    return simulate_job(job, p2p_hardware(cfg.hardware, cfg.pp_size, p2p)).step_s


# ---------------------------------------------------------------------------------------------------- launching
def _entry(rank: int, world: int, port: int, cfg: PipelineRunConfig, net, out: str) -> None:
    from commsched.io import atomic_write_bytes, atomic_write_text
    from commsched.runtime.launch import enter_rank

    enter_rank(rank, world, port, net)

    def save(report: PipelineRunReport) -> None:
        atomic_write_bytes(Path(out) / "report.pkl", pickle.dumps(report))

    def progress(text: str) -> None:
        atomic_write_text(Path(out) / "progress.txt", text)

    run_pipeline_rank(cfg, on_report=save, on_progress=progress)


def run_pipeline_local(
    cfg: PipelineRunConfig,
    *,
    network: ShapedNetwork | None = None,
    profile: bool = True,
    progress: Callable[[str], None] | None = None,
) -> PipelineRunReport:
    """Run ``cfg`` on ``pp_size`` spawned local gloo ranks (inside ``network`` when given) and return rank 0's
    report; ``profile``: with the roofline predictions too (``pipeline_calibrate.profile_prediction``).
    RuntimeError when a rank fails (its traceback in the message)."""
    import torch.multiprocessing as mp

    from commsched.io import free_port
    from commsched.runtime.launch import join_ranks, quiet_cpp_warnings

    with tempfile.TemporaryDirectory(prefix="commsched-pprun-") as d, quiet_cpp_warnings():
        args = (cfg.pp_size, free_port(), cfg, network, d)
        context = mp.start_processes(_entry, args=args, nprocs=cfg.pp_size, start_method="spawn", join=False)
        try:
            join_ranks(context, Path(d), progress)
        except (mp.ProcessRaisedException, mp.ProcessExitedException) as exc:
            raise RuntimeError(f"a rank failed:\n{exc}") from None
        path = Path(d) / "report.pkl"
        if not path.exists():
            raise RuntimeError("rank 0 finished without writing its report")
        report = pickle.loads(path.read_bytes())  # our own rank 0 wrote it just now
    report = dataclasses.replace(report, network=network.describe() if network is not None else None)
    if not profile:
        return report
    runs = {n: dataclasses.replace(r, predicted_profile_s=profile_prediction(cfg, n, report.p2p))
            for n, r in report.schedules.items()}  # fmt: skip
    return dataclasses.replace(report, schedules=runs)

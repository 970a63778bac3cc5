"""Predicted step throughput against published training runs (issue #38): tokens per second per GPU, and MFU where
the source reports it.

Usage: python benchmarks/bench_published.py [--layers-scale K | --full] [--only ID,...] [--json PATH]
       [--check-extrapolation RUN_ID] [--list]

Each run of ``benchmarks/data/published_runs.toml`` is mapped to a :class:`commsched.experiments.predict.StepConfig`
and a hardware profile (:func:`plan_run`), or listed with the reason it cannot be predicted yet (context parallelism,
gradient accumulation, a model not in the zoo, Megatron-Core's program: ``predict`` models torch's FSDP2 / DDP step,
an option the pipeline path does not take yet). Nothing is fitted here: the cost model and the profiles are what they
are, the errors are reported.

Pipeline-parallel runs (``pp`` > 1) are predicted as ``predict --pp-size`` predicts them
(:func:`commsched.experiments.predict_pipeline.predict_pipeline`: torch's schedule simulated rank by rank, each
distinct stage traced once), with the schedule, V and micro-batch size the source states or :data:`ASSUMED` says.

Speed: a step of L layers is, to first order, embedding + L x block + head, so by default each run is traced with K
and 2K layers and its step extrapolated linearly to the model's depth, ``step(L) = step(K) + (L - K) / K x (step(2K)
- step(K))`` (:func:`extrapolate`; the model FLOPs per token and the peak memory likewise), K = ``--layers-scale``
(2); ``--full`` traces every layer. The table says which. A pipeline run is always traced at its full depth: each
distinct stage (at most four shapes: first, middle, a middle one layer longer, last) is traced once and holds only
layers / (P x V) blocks, so the whole model costs about what K = layers / (P x V) does without PP, and a K-layer model
could not be split over the P x V stages (torchtitan's split needs layers + 2 >= P x V).

Groups: the torchtitan docs numbers (docs/performance.md at 3faaa1a, Aug 2024; never torchtitan's ``benchmarks/``,
which is held out) are a group of their own, reported apart so that they can be counted or left out; the statistics
are given per group, over all reliable predicted runs and over them without that group. Reliable: the TOML does not
mark the number unreliable and the mapping assumed no step-shaping setting the source leaves out (:data:`ASSUMED`).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import math
import os
import platform
import re
import statistics
import sys
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "src"))

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

from commsched.experiments.predict import StepConfig  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "published_runs.toml"
TT_DOCS = "torchtitan docs (Aug 2024)"

GROUPS: tuple[tuple[str, str, str], ...] = (
    ("tt2408", TT_DOCS, "torchtitan docs @3faaa1a"),
    ("tt2404", TT_DOCS, "torchtitan docs @3faaa1a"),
    ("torchao", "torchao float8 README (torchtitan runs)", "torchao float8 README @710f52b"),
    ("fmsfsdp", "fms-fsdp README (torch FSDP1)", "fms-fsdp README @5a296af"),
    ("llama3paper", "Llama 3 paper", "arXiv 2407.21783 Table 4"),
    ("nemo", "Megatron-Bridge (NeMo)", "Megatron-Bridge perf archive @067f987"),
    ("automodel", "NeMo AutoModel", "AutoModel perf summary @36044ad"),
    ("megatron-", "Megatron-LM", "Megatron-LM README @d514c6f"),
    ("mosaic", "llm-foundry (MPT)", "llm-foundry benchmarking README @8c8dd48"),
)
"""run id prefix -> (group, short source)"""

MODELS = {
    "Llama 3 8B": "llama3-8b",
    "Llama 3 70B": "llama3-70b",
    "Llama 3.1 70B": "llama3-70b",
    "Llama 3 405B": "llama3-405b",
    "Llama 3.1 405B": "llama3-405b",
    "Llama 2 7B": "llama2-7b",
    "Llama 2 13B": "llama2-13b",
    "Llama 2 70B": "llama2-70b",
    "Mixtral 8x7B": "mixtral-8x7b",
}
"""the TOML's model (before any parenthesis) -> zoo preset; absent: not in the zoo"""

SOURCE_PEAK_TFLOPS = {"a100-sxm-80g": 312.0, "h100-sxm": 989.0, "h100-sxm-96g": 989.0}
"""the bf16 peak the sources' MFU divides by (torchtitan: 989 for every H100, its HBM2e part included, 312 for A100;
fms-fsdp the same), by our profile"""


@dataclass(frozen=True)
class Assumption:
    """A setting the source leaves out, assumed for one run. ``reliable=False``: the assumed setting shapes the step
    enough that the run is kept out of the statistics."""

    note: str
    compile: bool | None = None
    ac: str | None = None
    reliable: bool = True
    pp_schedule: str | None = None  # torch's schedule of a pipeline run
    stages_per_rank: int | None = None  # its V
    micro_batch: int | None = None  # its sequences per micro-batch


ASSUMED: dict[str, Assumption] = {
    "tt2408-llama31-405b-h100hbm2e-128-tp8-bf16": Assumption(
        "compile not stated (row 'Optimizations: None'; the 405B preset enables it): eager assumed", compile=False
    ),
    "tt2408-llama31-405b-h100hbm2e-128-tp8-fp8": Assumption(
        "compile not stated (row 'Optimizations: Float8'): compiled assumed, as the next row's async TP needs it and "
        "torchtitan's float8 docs of the time ran float8 compiled",
        compile=True,
        reliable=False,
    ),
    "fmsfsdp-llama2-70b-a100-128-fsdp-sac-compile": Assumption(
        "selective-AC fraction not stated: full assumed (published HFU/MFU 0.74/0.55 = 1.35, full recompute's 8/6)",
        ac="full",
        reliable=False,
    ),
    "fmsfsdp-llama2-70b-h100-96-fsdp-sac-compile": Assumption(
        "selective-AC fraction not stated: full assumed (published HFU/MFU 0.47/0.38 = 1.24: ~70 % of blocks)",
        ac="full",
        reliable=False,
    ),
    **{
        f"llama3paper-405b-h100-{gpus}": Assumption(
            "Meta's stack, not torch's pipelining: traced as torchtitan runs FSDP + TP/SP + PP; the paper's "
            "'interleaved schedule' as torch's Interleaved1F1B with V = 2 (torchtitan's default; V not stated), "
            "micro-batches of 1 sequence (not stated), no AC (not stated for this table; the paper trains 8K "
            "sequences without activation checkpointing, recalled, not checked in the corpora), eager",
            compile=False,
            ac="none",
            reliable=False,
            pp_schedule="Interleaved1F1B",
            stages_per_rank=2,
            micro_batch=1,
        )
        for gpus in ("8192-tp8-pp16-dp64", "16384-tp8-pp16-dp128", "16384-tp8-cp16-pp16-dp8-128k")
    },
}

VARIANTS = {"torchao-llama3-8b-h100": "h100-sxm-96g"}
"""id prefix -> the profile of a GPU variant the source does not name but its numbers identify (RUN_NOTES says how)"""

RUN_NOTES = {
    "torchao-llama3-8b-h100": "H100 variant not stated: the 95 GiB HBM2e part (h100-sxm-96g) inferred: the same job's "
    "bf16 + compile log in torchtitan commit 7a04053 (Meta-internal H100s, as torchao's) reads 'memory: 47.65GiB "
    "(50.16%)', torchao's own peak of 47.65 GB, i.e. 95.0 GiB of HBM",
    "fmsfsdp": "FSDP1 (one flat parameter per block), traced as FSDP2",
    "fmsfsdp-llama2-70b-a100": "the source's network, 400 Gb/s per node, is slower than the profile's",
    "fmsfsdp-llama2-70b-h100": "the source's network, 800 Gb/s per node, is slower than the profile's (3.2 Tb/s)",
}
"""id prefix -> a note every such predicted run carries"""

ALTERNATIVES = {"torchao-llama3-8b-h100": "h100-sxm"}
"""id prefix -> a second profile the run is also predicted on (a sensitivity, not counted): the GPU variant the
source does not name"""


# ---------------------------------------------------------------------------------------------------- the mapping
@dataclass(frozen=True)
class Plan:
    """One run mapped: the step to predict and its hardware, or the reasons it cannot be predicted yet."""

    run: dict[str, Any]
    group: str
    source: str
    config: StepConfig | None = None
    profile: str | None = None
    reasons: tuple[str, ...] = ()
    notes: tuple[str, ...] = ()
    reliable: bool = True

    @property
    def id(self) -> str:
        return self.run["id"]

    @property
    def supported(self) -> bool:
        return self.config is not None


def load_runs(path: Path = DATA) -> list[dict[str, Any]]:
    with open(path, "rb") as f:
        return tomllib.load(f)["run"]


def group_of(run_id: str) -> tuple[str, str]:
    for prefix, group, source in GROUPS:
        if run_id.startswith(prefix):
            return group, source
    raise ValueError(f"run {run_id!r}: no group for its id prefix")


def preset_of(run: dict[str, Any]) -> str | None:
    return MODELS.get(run["model"].split(" (")[0].strip())


def profile_of(run: dict[str, Any]) -> str:
    for prefix, profile in VARIANTS.items():
        if run["id"].startswith(prefix):
            return profile
    gpu = run["gpu"]
    for needle, profile in (("HBM2e", "h100-sxm-96g"), ("GB200", "gb200-nvl72"), ("B200", "b200"),
                            ("MI300X", "mi300x"), ("A100", "a100-sxm-80g"), ("H100", "h100-sxm")):  # fmt: skip
        if needle in gpu:
            return profile
    raise ValueError(f"run {run['id']!r}: no hardware profile for GPU {gpu!r}")


def parallel_of(run: dict[str, Any]) -> str:
    shard, replicate, tp = run["dp_shard"], run["dp_replicate"], run["tp"]
    if shard > 1:
        return "fsdp" if tp == 1 else "fsdp+tp+sp"  # torchtitan's llama TP plan shards the sequence too
    if replicate > 1 and tp == 1:
        return "ddp"
    return "tp+sp"


def unsupported_reasons(run: dict[str, Any], assumed: Assumption | None) -> list[str]:
    """Why the zoo cannot predict ``run`` yet (empty: it can)."""
    r: list[str] = []
    if run["framework"].startswith("Megatron"):
        r.append("Megatron-Core program (TE kernels, distributed optimizer / Megatron-FSDP), not torch's FSDP2 step")
    if run["pp"] > 1 and schedule_of(run, assumed) is None:
        r.append(f"pipeline schedule not stated (PP {run['pp']})")
    if run["ep"] > 1:
        r.append(f"MoE expert parallelism with PP (EP {run['ep']})")
    if preset_of(run) is None:
        r.append(f"model not in the zoo ({run['model'].split(' (')[0]})")
    micro = run.get("micro_batch", run["local_batch"])
    if micro < run["local_batch"] and run["pp"] == 1:
        r.append(f"gradient accumulation ({run['local_batch'] // micro} micro-batches of {micro})")
    if run["float8"] == "unknown":
        r.append("float8 setting not stated")
    if run["ac"] == "unknown" and not (assumed and assumed.ac):
        r.append("activation checkpointing not stated")
    if run["compile"] == "unknown" and not (assumed and assumed.compile is not None):
        r.append("torch.compile not stated")
    shard, replicate, tp = run["dp_shard"], run["dp_replicate"], run["tp"]
    if max(shard, 1) * max(replicate, 1) * tp * run["pp"] * run["cp"] != run["num_gpus"]:
        r.append("degrees do not multiply to the GPU count")
    return r


def plan_run(run: dict[str, Any]) -> Plan:
    """``run`` as a StepConfig and a profile, or the reasons it is not predicted."""
    group, source = group_of(run["id"])
    assumed = ASSUMED.get(run["id"])
    reliable = run.get("reliable", True) is not False
    reasons = unsupported_reasons(run, assumed)
    if reasons:
        return Plan(run, group, source, reasons=tuple(reasons), reliable=reliable)
    notes = [assumed.note] if assumed else []
    notes += [note for prefix, note in RUN_NOTES.items() if run["id"].startswith(prefix)]
    ac = assumed.ac if assumed and assumed.ac else run["ac"]
    compile_ = assumed.compile if assumed and assumed.compile is not None else run["compile"]
    parallel = parallel_of(run)
    float8 = run["float8"]
    gather = bool(run.get("fsdp_float8_all_gather", float8 == "tensorwise")) and "fsdp" in parallel
    config = StepConfig(
        preset=preset_of(run),
        parallel=parallel,
        world_size=run["num_gpus"],
        seq_len=run["seq_len"],
        batch=run["local_batch"],
        tp_size=run["tp"] if run["tp"] > 1 else None,
        ac=ac,
        compile=bool(compile_),
        float8=float8,
        float8_all_gather=gather,
        async_tp=run["async_tp"] is True,
        dp_replicate=run["dp_replicate"] if run["dp_shard"] > 1 else 1,  # HSDP; replicas alone are DDP
        extra=(("cp_size", run["cp"]),) if run["cp"] > 1 else (),
        source=run["id"],
    )
    if run["pp"] > 1:
        config = dataclasses.replace(config, **pipeline_fields(run, assumed))
        refusal = pipeline_refusal(config)
        if refusal:
            return Plan(run, group, source, reasons=(refusal,), reliable=reliable)
    return Plan(run, group, source, config=config, profile=profile_of(run), notes=tuple(notes),
                reliable=reliable and not (assumed and not assumed.reliable))  # fmt: skip


def _given(run: dict[str, Any], key: str, assumed: Assumption | None, attr: str) -> Any:
    """``run[key]`` if the TOML states it, else the assumed ``attr`` (None: neither)."""
    return run.get(key) or (getattr(assumed, attr) if assumed else None)


def schedule_of(run: dict[str, Any], assumed: Assumption | None) -> str | None:
    """A PP run's schedule: the TOML's ``pp_schedule``, else interleaved 1F1B where it states a VP > 1 (Megatron's
    virtual pipeline is its interleaved schedule), else :data:`ASSUMED`'s (None: not stated)."""
    if run.get("pp_schedule"):
        return run["pp_schedule"]
    return "Interleaved1F1B" if (run.get("vp") or 1) > 1 else _given(run, "pp_schedule", assumed, "pp_schedule")


def pipeline_fields(run: dict[str, Any], assumed: Assumption | None) -> dict[str, Any]:
    """The StepConfig's pipeline fields of a PP run: its schedule, V (the source's ``vp``) and M = local_batch /
    micro_batch, each from the TOML or else :data:`ASSUMED`."""
    micro = _given(run, "micro_batch", assumed, "micro_batch") or 1
    return {"pp_size": run["pp"], "pp_schedule": schedule_of(run, assumed),
            "stages_per_rank": _given(run, "vp", assumed, "stages_per_rank"),
            "microbatches": run["local_batch"] // micro}  # fmt: skip


def pipeline_refusal(config: StepConfig) -> str | None:
    """Why the pipeline path cannot take ``config`` yet (its one-line error, checked without tracing), or None."""
    from commsched.experiments.predict_pipeline import pipeline_job

    try:
        pipeline_job(config)[0].resolve()
    except ValueError as exc:
        return f"under PP {config.pp_size}: {exc}"
    return None


# ---------------------------------------------------------------------------------------------------- prediction
def short(warning: str) -> str:
    """A step warning in a few words for the table."""
    if "network is not fitted" in warning:
        return "inter-node network: NCCL's constants (the profile has no fitted network)"
    return warning.split(":")[0]


def extrapolate(y_k: float, y_2k: float, k: int, layers: int) -> float:
    """``y`` at ``layers`` from ``y`` at ``k`` and ``2k`` layers, linear in the layer count."""
    return y_k + (layers - k) / k * (y_2k - y_k)


@dataclass
class Estimate:
    """A predicted step at the model's full depth."""

    step_s: float
    tokens_per_s_per_gpu: float
    model_flops_per_token: float
    peak_memory_bytes: float
    exposed_comm_s: float
    hbm_bytes: float
    how: str
    warnings: list[str] = field(default_factory=list)
    wall_s: float = 0.0


class Predictor:
    """Predicts StepConfigs, tracing each (config, layers) once (runs on two GPUs share their traces)."""

    def __init__(self, log: Any = None) -> None:
        self._traces: dict[StepConfig, Any] = {}
        self.log = log or (lambda msg: print(msg, file=sys.stderr, flush=True))

    def one(self, config: StepConfig, profile: str, layers: int | None) -> Any:
        from commsched.experiments.predict import predict_workload, trace

        cfg = dataclasses.replace(config, layers=layers)
        key = dataclasses.replace(cfg, source="options")  # runs that differ only in their source share a trace
        t0 = time.perf_counter()
        if key not in self._traces:
            self._traces[key] = trace(cfg)
        p = predict_workload(self._traces[key], cfg, profile)
        self.log(f"  {config.source} on {profile}, {layers or 'all'} layers: step {p.step_s:.4f} s "
                 f"({time.perf_counter() - t0:.1f} s)")  # fmt: skip
        return p

    def estimate(self, config: StepConfig, profile: str, scale: int | None, depth: int | None = None) -> Estimate:
        """The step at ``depth`` layers (default: the model's): traced at every layer (``scale`` None) or
        extrapolated from ``scale`` and ``2 x scale`` layers (rounded up to a multiple of a selective-layer:N AC's
        N)."""
        from commsched.workloads import get_preset

        t0 = time.perf_counter()
        depth = depth or get_preset(config.preset).n_layers
        if config.pp_size > 1:  # every stage traced once at full depth (the module docstring says why)
            return self.pipeline(config, profile, depth, t0)
        k = scale
        if k is not None and config.ac.startswith("selective-layer:"):
            n = int(config.ac.partition(":")[2])
            k = -(-k // n) * n
        if k is None or 2 * k >= depth:
            p = self.one(config, profile, depth)
            step, flops, peak = p.step_s, p.model_flops_per_token, float(p.peak_memory_bytes)
            exposed = p.sim.exposed_comm_s
            how = f"all {depth} layers"
            warns = [short(w) for w in p.warnings if "HBM" not in w]
        else:
            a, b = self.one(config, profile, k), self.one(config, profile, 2 * k)
            step = extrapolate(a.step_s, b.step_s, k, depth)
            flops = extrapolate(a.model_flops_per_token, b.model_flops_per_token, k, depth)
            peak = extrapolate(a.peak_memory_bytes, b.peak_memory_bytes, k, depth)
            exposed = extrapolate(a.sim.exposed_comm_s, b.sim.exposed_comm_s, k, depth)
            how = f"{k} and {2 * k} layers extrapolated to {depth}"
            warns = [short(w) for w in a.warnings if "HBM" not in w]  # the capacity warning is the K-layer step's
            p = a
        hbm = float(p.hardware.compute.hbm_capacity_bytes)
        if peak > hbm:
            warns.append(f"peak memory {peak / 1e9:.0f} GB over the {hbm / 1e9:.0f} GB of HBM")
        tps = p.tokens_per_replica / step / (p.tp * p.cp)
        return Estimate(step, tps, flops, peak, exposed, hbm, how, warns, time.perf_counter() - t0)

    def pipeline(self, config: StepConfig, profile: str, depth: int, t0: float) -> Estimate:
        """A pipeline run at ``depth`` layers: :func:`predict_pipeline`, each distinct stage traced once."""
        from commsched.experiments.predict_pipeline import predict_pipeline

        p = predict_pipeline(dataclasses.replace(config, layers=depth), profile)
        self.log(f"  {config.source} on {profile}, PP {config.pp_size} {config.pp_schedule}: step {p.step_s:.4f} s "
                 f"({time.perf_counter() - t0:.1f} s)")  # fmt: skip
        exposed = max(r.exposed_comm_s for r in p.step.result.per_rank)
        how = f"all {depth} layers (PP: each distinct stage traced once), bubble {100 * p.bubble_fraction:.0f} %"
        warns = [short(w) for w in p.warnings if "HBM" not in w] + list(p.notes)
        hbm = float(p.hardware.compute.hbm_capacity_bytes)
        if p.peak_memory_bytes > hbm:
            warns.append(f"peak memory {p.peak_memory_bytes / 1e9:.0f} GB over the {hbm / 1e9:.0f} GB of HBM")
        return Estimate(p.step_s, p.tokens_per_s_per_gpu, p.model_flops_per_token, float(p.peak_memory_bytes),
                        exposed, hbm, how, warns, time.perf_counter() - t0)  # fmt: skip


# ---------------------------------------------------------------------------------------------------- comparison
def published_mfu(run: dict[str, Any]) -> float | None:
    """The MFU the source reports with its throughput (a fraction), if any."""
    if run["metric"] == "mfu":
        return float(run["value"])
    m = re.search(r"MFU (\d+(?:\.\d+)?)(%)?", run.get("also_reported", ""))
    if not m:
        return None
    value = float(m.group(1))
    return value / 100 if m.group(2) or value > 1 else value


def predicted_value(run: dict[str, Any], e: Estimate, profile: str) -> float:
    """Our number in the unit of the run's metric."""
    metric = run["metric"]
    if metric == "tokens_per_s_per_gpu":
        return e.tokens_per_s_per_gpu
    if metric == "step_s":
        return e.step_s
    if metric == "mfu":
        return e.model_flops_per_token * e.tokens_per_s_per_gpu / (SOURCE_PEAK_TFLOPS[profile] * 1e12)
    raise ValueError(f"run {run['id']!r}: unknown metric {metric!r}")


@dataclass
class Row:
    plan: Plan
    estimate: Estimate
    predicted: float
    error: float  # predicted / published - 1
    mfu_published: float | None
    mfu_predicted: float | None  # the source's MFU definition: its MFU scaled by our throughput over its own
    flops_gap: float | None  # the source's FLOPs per token (from its MFU, tokens/s and peak) / predict's - 1


def compare(plan: Plan, e: Estimate) -> Row:
    run = plan.run
    predicted = predicted_value(run, e, plan.profile)
    error = predicted / float(run["value"]) - 1
    mfu = published_mfu(run)
    mfu_pred = gap = None
    if mfu is not None and run["metric"] == "tokens_per_s_per_gpu":
        mfu_pred = mfu * e.tokens_per_s_per_gpu / float(run["value"])
        peak = SOURCE_PEAK_TFLOPS.get(plan.profile)
        if peak:
            gap = mfu * peak * 1e12 / float(run["value"]) / e.model_flops_per_token - 1
    return Row(plan, e, predicted, error, mfu, mfu_pred, gap)


def configuration(c: StepConfig) -> str:
    mesh = f"{c.parallel} {c.world_size}" + (f" (tp {c.tp_size})" if c.tp_size else "")
    if c.pp_size > 1:
        mesh += f", pp {c.pp_size} {c.pp_schedule} M{c.microbatches} V{c.stages_per_rank}"
    parts = [c.preset, mesh, f"b{c.batch}x{c.seq_len}", f"ac {c.ac}"]
    if c.float8 != "none":
        parts.append(f"fp8 {c.float8}" + (" (fp8 AG)" if c.float8_all_gather else ""))
    parts.append("compile" if c.compile else "eager")
    return ", ".join(parts)


def fmt_value(metric: str, v: float) -> str:
    if metric == "mfu":
        return f"{100 * v:.1f} % MFU"
    if metric == "step_s":
        return f"{v:.2f} s"
    return f"{v:,.0f}"


def stats(rows: list[Row]) -> str:
    if not rows:
        return "no reliable run"
    errs = [abs(r.error) for r in rows]
    worst = max(rows, key=lambda r: abs(r.error))
    median = 100 * statistics.median(errs)
    return f"median |error| {median:.1f} %, worst {100 * worst.error:+.1f} % ({worst.plan.id}), n = {len(rows)}"


def table(rows: list[Row]) -> list[str]:
    out = ["| run | source | configuration | profile | published | predicted | error | MFU published / predicted "
           "| comm exposed | how | notes |", "|---|---|---|---|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        p, metric = r.plan, r.plan.run["metric"]
        mfu = f"{100 * r.mfu_published:.1f} / {100 * r.mfu_predicted:.1f} %" if r.mfu_predicted is not None else "-"
        mark = "" if p.reliable else " (unreliable)"
        notes = "; ".join([*p.notes, *r.estimate.warnings]) or "-"
        out.append(f"| {p.id}{mark} | {p.source} | {configuration(p.config)} | {p.profile} | "
                   f"{fmt_value(metric, float(p.run['value']))} | {fmt_value(metric, r.predicted)} | "
                   f"{100 * r.error:+.1f} % | {mfu} | {100 * r.estimate.exposed_comm_s / r.estimate.step_s:.0f} % | "
                   f"{r.estimate.how} | {notes} |")  # fmt: skip
    return out


def report(rows: list[Row], unsupported: list[Plan], alternatives: list[Row] = ()) -> str:
    lines: list[str] = []
    groups = list(dict.fromkeys(r.plan.group for r in rows))
    for g in groups:
        grows = [r for r in rows if r.plan.group == g]
        lines += [f"**{g}** ({grows[0].plan.run['framework']})", "", *table(grows), ""]
    reliable = [r for r in rows if r.plan.reliable]
    lines.append("Error = predicted / published - 1 on the source's metric (tokens/s per GPU unless shown).")
    for g in groups:
        lines.append(f"- {g}: {stats([r for r in reliable if r.plan.group == g])}")
    lines.append(f"- all reliable predicted runs: {stats(reliable)}")
    lines.append(f"- without {TT_DOCS}: {stats([r for r in reliable if r.plan.group != TT_DOCS])}")
    gaps = [r for r in rows if r.flops_gap is not None]
    if gaps:
        by = {}
        for r in gaps:
            by.setdefault(r.plan.group, []).append(r.flops_gap)
        lines.append("- the sources' FLOPs per token (their MFU x peak / tokens/s) against predict's `mfu` formula: "
                     + "; ".join(f"{g} {100 * min(v):+.1f}..{100 * max(v):+.1f} %" for g, v in by.items()))  # fmt: skip
    if alternatives:
        lines += ["", "The same runs on another profile (a sensitivity, not counted above):", "",
                  "| run | profile | published | predicted | error |", "|---|---|---|---|---|"]  # fmt: skip
        for r in alternatives:
            metric = r.plan.run["metric"]
            lines.append(f"| {r.plan.id} | {r.plan.profile} | {fmt_value(metric, float(r.plan.run['value']))} | "
                         f"{fmt_value(metric, r.predicted)} | {100 * r.error:+.1f} % |")  # fmt: skip
    lines += ["", f"Not predicted ({len(unsupported)}):", "", "| run | framework | source | published | why not |",
              "|---|---|---|---|---|"]  # fmt: skip
    for p in unsupported:
        mark = "" if p.reliable else " (unreliable)"
        lines.append(f"| {p.id}{mark} | {p.run['framework']} | {p.source} | "
                     f"{fmt_value(p.run['metric'], float(p.run['value']))} | {'; '.join(p.reasons)} |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    depth = ap.add_mutually_exclusive_group()
    depth.add_argument("--layers-scale", type=int, default=2, metavar="K",
                       help="trace K and 2K layers and extrapolate to the model's depth (default 2)")  # fmt: skip
    depth.add_argument("--full", action="store_true", help="trace every layer")
    ap.add_argument("--only", default="", help="comma-separated run ids (or id prefixes) to predict")
    ap.add_argument("--json", type=Path, help="write the rows as JSON")
    ap.add_argument("--list", action="store_true", help="print the mapping only (no tracing)")
    ap.add_argument("--check-extrapolation", metavar="RUN_ID",
                    help="predict RUN_ID at full depth and extrapolated from K / 2K layers; print both")  # fmt: skip
    args = ap.parse_args(argv)
    if args.layers_scale < 1:
        ap.error("--layers-scale must be >= 1")
    scale = None if args.full else args.layers_scale
    plans = [plan_run(r) for r in load_runs()]
    load = os.getloadavg()[0] if hasattr(os, "getloadavg") else float("nan")
    print(f"machine: {platform.machine()}, {os.cpu_count()} CPUs (load {load:.1f}), Python {sys.version.split()[0]}; "
          f"{time.strftime('%Y-%m-%d')}")  # fmt: skip
    if args.check_extrapolation:
        plan = next(p for p in plans if p.id == args.check_extrapolation)
        pr = Predictor()
        full = pr.estimate(plan.config, plan.profile, None)
        ext = pr.estimate(plan.config, plan.profile, args.layers_scale)
        print(f"{plan.id} ({configuration(plan.config)}, {plan.profile})")
        for e in (full, ext):
            print(f"  {e.how}: step {e.step_s:.6f} s, {e.tokens_per_s_per_gpu:,.0f} tok/s/GPU, "
                  f"peak {e.peak_memory_bytes / 1e9:.1f} GB ({e.wall_s:.0f} s)")  # fmt: skip
        print(f"  extrapolated / full - 1: step {100 * (ext.step_s / full.step_s - 1):+.4f} %, "
              f"peak memory {100 * (ext.peak_memory_bytes / full.peak_memory_bytes - 1):+.4f} %")  # fmt: skip
        return
    wanted = [w for w in args.only.split(",") if w]
    supported = [p for p in plans if p.supported and (not wanted or any(p.id.startswith(w) for w in wanted))]
    unsupported = [p for p in plans if not p.supported]
    print(f"{len(plans)} runs: {sum(p.supported for p in plans)} predicted, {len(unsupported)} not; "
          + ("every layer traced" if scale is None else f"K = {scale}: {scale} and {2 * scale} layers traced, the step "
             "extrapolated linearly to the model's depth"))  # fmt: skip
    if args.list:
        for p in plans:
            what = f"{configuration(p.config)} on {p.profile}" if p.supported else "; ".join(p.reasons)
            print(f"{p.id}: {what}")
        return
    pr = Predictor()
    rows: list[Row] = []
    t0 = time.perf_counter()
    for p in supported:
        rows.append(compare(p, pr.estimate(p.config, p.profile, scale)))
    print(f"predicted {len(rows)} runs in {time.perf_counter() - t0:.0f} s\n")
    alternatives = []
    for r in rows:
        for prefix, profile in ALTERNATIVES.items():
            if r.plan.id.startswith(prefix):
                alt = dataclasses.replace(r.plan, profile=profile)
                alternatives.append(compare(alt, pr.estimate(alt.config, profile, scale)))
    print(report(rows, unsupported, alternatives))
    if args.json:
        args.json.write_text(json.dumps([
            {"id": r.plan.id, "group": r.plan.group, "reliable": r.plan.reliable, "profile": r.plan.profile,
             "config": r.plan.config.to_dict(), "metric": r.plan.run["metric"], "published": r.plan.run["value"],
             "predicted": r.predicted, "error": r.error, "step_s": r.estimate.step_s, "how": r.estimate.how,
             "exposed_comm_s": r.estimate.exposed_comm_s,
             "mfu_published": r.mfu_published, "mfu_predicted": r.mfu_predicted, "flops_gap": r.flops_gap,
             "peak_memory_bytes": r.estimate.peak_memory_bytes, "notes": list(r.plan.notes),
             "warnings": r.estimate.warnings} for r in [*rows, *alternatives]], indent=1))  # fmt: skip
    if any(math.isnan(r.error) for r in rows):
        sys.exit(1)


if __name__ == "__main__":
    main()

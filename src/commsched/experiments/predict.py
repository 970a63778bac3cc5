"""The step as the user's framework runs it: the number a user compares with a job's logs. Not our optimiser.

A zoo training step is traced as the framework runs it (FSDP: one all_gather / reduce_scatter per block, as
``fully_shard`` on each block groups them: :func:`commsched.experiments.references.framework_program`), ordered by
the ``framework`` pass (``passes/baselines/framework.py``: FSDP2's one-block prefetch in the forward and the backward
with its parameters resharded after the forward, DDP's gradient buckets all-reduced as they fill; HSDP's gradient
all_reduces on FSDP2's all_reduce stream) and simulated. A step is the whole iteration: forward, backward and the
optimizer step (by default AdamW as torchtitan runs it, ``fused=True``: :mod:`commsched.workloads.optimizer`).

* **eager** (default): every op is its own kernel (costs without fusion, ``estimate_costs(fusion=False)``).
* **compile** (``torch.compile``, as torchtitan applies it: each transformer block compiled): the kernels of a block
  fused as Inductor fuses them (``fusion=True``), and the collectives inside the compiled code (TP / SP) in
  torch.compile's default order, which runs no overlap pass (the traced order, as in eager); FSDP2's and DDP's hooks
  stay eager around the compiled blocks, so their prefetch and bucket overlap are the same as in eager.
* **async TP** (``async_tp``, torchtitan's ``enable_async_tensor_parallel``; compiled steps with TP only): Inductor's
  micro-pipelining as :mod:`commsched.rewrites.async_tp` applies it to the traced step (the blocks' all_gather ->
  matmul and matmul -> reduce_scatter become per-peer copy-engine transfers overlapped with partial matmuls), on
  profiles with NVLink symmetric-memory numbers (:mod:`commsched.cost.symm_mem`), refused in one line elsewhere.

Reported as torchtitan logs them: tokens per second per GPU are one data-parallel rank's tokens over the step,
divided by TP x CP (torchtitan's ``non_data_parallel_size``); MFU counts the model's FLOPs per token
(``6 x`` non-embedding parameters ``+ 12 x layers x heads x head_dim x seq``: torchtitan's
``get_nparams_and_flops``, no recompute) against the device's dense peak; HFU counts every traced FLOP, recomputed
ones included.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from commsched.hardware import Hardware
    from commsched.sim import SimResult
    from commsched.workloads import Workload, WorkloadSpec


@dataclass(frozen=True)
class StepConfig:
    """One training step to predict: a zoo preset, its parallelism and options (None: the preset's / the zoo's
    default), whether the model is compiled and runs async TP. ``extra``: more
    ``resolve`` keywords, passed as given (``ep_size``, options the zoo gains later). ``source``: ``"options"`` or
    the torchtitan config file it was read from."""

    preset: str
    parallel: str
    world_size: int
    layers: int | None = None
    seq_len: int | None = None
    batch: int | None = None
    dtype: str = "bfloat16"
    tp_size: int | None = None
    ac: str = "none"
    compile: bool = False
    float8: str = "none"  # torchtitan's float8 recipe ("tensorwise", "rowwise", ...); "none": bf16 linears
    float8_all_gather: bool = False  # FSDP2 all-gathers float8 weights (torchtitan's tensorwise recipe)
    async_tp: bool = False  # torchtitan's enable_async_tensor_parallel (symmetric memory; compiled TP steps)
    reshard_after_forward: bool = True  # FSDP2's; False: gathered parameters held to the backward (more memory)
    dp_replicate: int = 1  # HSDP: FSDP's shards replicated over this many groups (torchtitan's replicate degree)
    optimizer: str = "adamw-fused"  # the step's optimizer (torchtitan's default AdamW, fused); "none": no step
    max_norm: float | None = 1.0  # gradient clipping (torchtitan's training.max_norm default); None: not clipped
    pp_size: int = 1  # pipeline ranks (PP, the outermost mesh dimension); > 1: experiments/predict_pipeline.py
    pp_schedule: str = "1F1B"  # torch's schedule (torchtitan's pipeline_parallel_schedule default)
    microbatches: int | None = None  # M per step under PP; None: P x V (commsched pipeline's default)
    stages_per_rank: int | None = None  # V under PP; None: 1 for GPipe / 1F1B, else 2 (torchtitan's default)
    extra: tuple[tuple[str, Any], ...] = ()
    source: str = "options"
    notes: tuple[str, ...] = field(default=(), compare=False)

    def check(self) -> None:
        """A one-line ValueError for a float8 setting the zoo does not trace: it gathers a tensorwise step's weights
        in float8 under FSDP (torchtitan's ``enable_fsdp_float8_all_gather``), and torchao refuses that gather for
        any other recipe."""
        fsdp = "fsdp" in self.parallel.split("+")
        if self.float8 == "tensorwise" and fsdp and not self.float8_all_gather:
            raise ValueError("float8 (tensorwise) with FSDP gathering bf16 weights (enable_fsdp_float8_all_gather = "
                             "false) not yet supported: the zoo gathers tensorwise weights in float8")  # fmt: skip
        if self.float8_all_gather and self.float8 != "tensorwise":
            raise ValueError(f"float8 ({self.float8}) with enable_fsdp_float8_all_gather: torchao gathers only "
                             "tensorwise weights in float8")  # fmt: skip
        if self.async_tp and not self.compile:
            raise ValueError("async TP needs torch.compile (Inductor's micro-pipelining; torchtitan refuses it "
                             "without 'model' compiled): add --compile")  # fmt: skip
        if self.async_tp and not (self.tp_size or 0) > 1 and "tp" not in self.parallel.split("+"):
            raise ValueError(f"async TP needs tensor parallelism; {self.parallel} has none")

    def build_kwargs(self) -> dict[str, Any]:
        """``workloads.build`` keywords of the step (always training; FSDP's one-collective-per-block program is
        chosen by :func:`trace`)."""
        given = {"parallel": self.parallel, "world_size": self.world_size, "layers": self.layers,
                 "seq_len": self.seq_len, "batch": self.batch, "dtype": self.dtype, "tp_size": self.tp_size,
                 "ac": self.ac, "mode": "train", **dict(self.extra)}  # fmt: skip
        if self.float8 != "none":
            given["float8"] = self.float8
        if self.dp_replicate != 1:
            given["dp_replicate"] = self.dp_replicate
        if self.optimizer != "none":
            given["optimizer"] = self.optimizer
        if self.max_norm is not None:
            given["max_norm"] = self.max_norm
        if not self.reshard_after_forward:  # only when off: the default's trace-cache keys stay as they were
            given["reshard_after_forward"] = False
        return {k: v for k, v in given.items() if v is not None}

    def resolve(self) -> WorkloadSpec:
        """The zoo's resolved request (every default filled in, the mesh planned); ValueError for an impossible
        one."""
        from commsched.workloads import resolve

        self.check()
        if self.pp_size > 1:  # the pipeline ranks' specs: commsched.experiments.predict_pipeline.pipeline_job
            raise ValueError(f"pp_size={self.pp_size}: resolve the step with predict_pipeline.pipeline_job")
        kw = self.build_kwargs()
        return resolve(self.preset, parallel=kw.pop("parallel"), world_size=kw.pop("world_size"), **kw)

    def to_dict(self) -> dict[str, Any]:
        d = dataclasses.asdict(self)
        d["extra"] = dict(self.extra)
        d["notes"] = list(self.notes)
        return d


def trace(config: StepConfig, progress: Callable[[str], None] | None = None) -> Workload:
    """The step as the framework runs it, traced on fake tensors: with FSDP, one all_gather / reduce_scatter per
    block, the program ``fully_shard`` on each block runs (as
    :func:`commsched.experiments.references.framework_program` traces it). ``progress`` receives the trace's phase
    messages."""
    from commsched.workloads import build

    config.check()
    if config.pp_size > 1:  # one step per pipeline rank, not one program: predict_pipeline traces its stages
        raise ValueError(f"pp_size={config.pp_size}: a pipeline step is predicted by "
                         "commsched.experiments.predict_pipeline.predict_pipeline")  # fmt: skip
    return build(config.preset, **{**config.build_kwargs(), "fsdp_bucket": "block"}, progress=progress)


@dataclass(frozen=True)
class Prediction:
    """One predicted step: the configuration, the cluster, the simulation of the framework's order, how it was
    ordered (``order``) and costed (``kernels``), and the warnings of the step (peak over HBM, padding)."""

    config: StepConfig
    hardware: Hardware
    sim: SimResult
    order: str
    kernels: str
    order_note: str = ""
    warnings: tuple[str, ...] = ()

    @property
    def meta(self) -> dict[str, Any]:
        return self.sim.graph.meta

    @property
    def step_s(self) -> float:
        return self.sim.makespan_s

    @property
    def tp(self) -> int:
        return int(self.meta.get("tp", 1) or 1)

    @property
    def cp(self) -> int:
        """The step's context-parallel degree (the plan's ``cp``, 1 without CP): tokens/s per GPU divide by TP x it."""
        return int(self.meta.get("cp", 1) or 1)

    @property
    def tokens_per_replica(self) -> int:
        """Tokens of one data-parallel rank's batch (batch x sequence)."""
        return int(self.meta["tokens_per_replica"])

    @property
    def tokens_per_s_per_gpu(self) -> float:
        """torchtitan's ``tps``: one data-parallel rank's tokens over the step, divided by TP x CP."""
        return self.tokens_per_replica / self.step_s / (self.tp * self.cp)

    @property
    def model_flops_per_token(self) -> float:
        """torchtitan's FLOPs per token (``ModelConfig.model_flops_per_token``) of the traced layers."""
        from commsched.workloads import get_preset

        cfg = dataclasses.replace(get_preset(self.config.preset), n_layers=int(self.meta["layers"]))
        return cfg.model_flops_per_token(int(self.meta["seq_len"]))

    @property
    def peak_flops(self) -> float | None:
        """The device's dense peak for the step's dtype (None when the profile lists none)."""
        return dict(self.hardware.compute.peak_flops).get(str(self.meta.get("dtype")))

    @property
    def mfu(self) -> float | None:
        """Model FLOPs utilisation, as torchtitan logs it (no recompute counted)."""
        peak = self.peak_flops
        return None if not peak else self.model_flops_per_token * self.tokens_per_s_per_gpu / peak

    @property
    def hfu(self) -> float | None:
        """Every traced FLOP of the rank (AC's recompute included) over the step and the peak
        (:mod:`commsched.report.rates`)."""
        from commsched.report.rates import step_rates

        return step_rates(self.sim, self.hardware).mfu

    @property
    def peak_memory_bytes(self) -> int:
        return self.sim.peak_memory_bytes

    def configuration_line(self) -> str:
        """One line: preset, mesh, layers, batch x sequence, dtype, AC, eager / compiled, the source."""
        m = self.meta
        layers, most = int(m["layers"]), int(m.get("preset_layers", m["layers"]))
        sliced = f"all {most} layers" if layers == most else f"{layers} of {most} layers"
        mesh = " x ".join(f"{name} {size}" for name, size in m.get("mesh", {}).items())
        cp = f", cp {self.cp} {m['context_parallel']['rotate_method']}" if self.cp > 1 else ""
        parts = [str(m.get("preset")), f"{m.get('parallel')} ({mesh}{', sp' if m.get('sp') else ''}{cp})",
                 f"world {m.get('world_size')}", sliced,
                 f"batch {m.get('batch')} x seq {m.get('seq_len')}", str(m.get("dtype")), f"ac {m.get('ac', 'none')}",
                 f"optimizer {m.get('optimizer', 'none')}",
                 "torch.compile" if self.config.compile else "eager"]  # fmt: skip
        if self.config.async_tp:
            parts.append(f"async TP ({m.get('async_tp', {}).get('sites', 0)} fused sites)")
        line = " / ".join(parts)
        return line if self.config.source == "options" else f"{line} (from {self.config.source})"

    def hardware_line(self) -> str:
        hw = self.hardware
        peak = self.peak_flops
        rate = f"{peak / 1e12:g} TFLOP/s {self.meta.get('dtype')} peak, " if peak else ""
        return (f"{hw.name}: {hw.num_nodes} node(s) of {hw.gpus_per_node} GPUs ({rate}"
                f"{hw.compute.hbm_capacity_bytes / 1e9:g} GB HBM per GPU)")  # fmt: skip

    def to_dict(self) -> dict[str, Any]:
        """The ``--json`` record: the headline numbers, the configuration, the cluster and what bounds the step."""
        from commsched.report.bound_text import bound_summary

        hw, m = self.hardware, self.meta
        layout = {"layers": m["layers"], "preset_layers": m.get("preset_layers", m["layers"]), "mesh": m.get("mesh"),
                  "seq_len": m.get("seq_len"), "batch": m.get("batch")}  # fmt: skip
        cluster = {"name": hw.name, "num_nodes": hw.num_nodes, "gpus_per_node": hw.gpus_per_node,
                   "peak_flops": self.peak_flops, "hbm_capacity_bytes": hw.compute.hbm_capacity_bytes}  # fmt: skip
        return {
            "step_s": self.step_s,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "mfu": self.mfu,
            "hfu": self.hfu,
            "peak_memory_bytes": self.peak_memory_bytes,
            "exposed_comm_s": self.sim.exposed_comm_s,
            "lower_bound_s": self.sim.lower_bound_s,
            "tokens_per_replica": self.tokens_per_replica,
            "tp": self.tp,
            "cp": self.cp,
            "model_flops_per_token": self.model_flops_per_token,
            "order": self.order,
            "kernels": self.kernels,
            "order_note": self.order_note,
            "configuration_line": self.configuration_line(),
            "configuration": {**self.config.to_dict(), **layout},
            "hardware": cluster,
            "bound": bound_summary(self.sim, hw),
            "warnings": list(self.warnings),
            "notes": list(self.config.notes),
        }


def order_label(g: Any, compile: bool) -> str:
    """How the step is ordered: FSDP2 / DDP eager (their hooks run eagerly around compiled blocks too), else
    eager or torch.compile's default (both the traced order: collectives waited where they are used)."""
    from commsched.passes.baselines.framework import framework_label, framework_roles

    fsdp, ddp = framework_roles(g)
    if fsdp or ddp:
        return framework_label(g) + (" hooks around compiled blocks" if compile else "")
    return "torch.compile default (as traced)" if compile else "eager (as traced)"


def predict_workload(
    workload: Workload,
    config: StepConfig,
    hardware: str | Hardware = "h100-sxm",
    *,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
) -> Prediction:
    """Cost ``workload`` (from :func:`trace`) on ``hardware`` (a profile name, a ``.toml`` path or a Hardware; on
    ``num_nodes`` nodes, default: enough for its world), order it as the framework would and simulate it."""
    from commsched.cost import estimate_costs
    from commsched.hardware import for_graph
    from commsched.passes import schedule
    from commsched.report.capacity import step_warnings
    from commsched.sim import simulate_costs

    g = workload.graph
    hw = for_graph(hardware, g, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
    if config.float8 != "none" and "float8_e4m3fn" not in dict(hw.compute.peak_flops):
        # the cost model would charge the float8 matmuls at another dtype's rate: a number for a job that cannot run
        raise ValueError(f"float8 ({config.float8}): {hw.name} has no float8 tensor cores (no float8_e4m3fn peak)")
    if config.async_tp:
        g = async_tp_step(workload, hw)
    costs = estimate_costs(g, hw, fusion=config.compile)
    s = schedule(g, costs, "framework")
    sim = simulate_costs(g, costs, s.order)
    kernels = "Inductor-fused (torch.compile)" if config.compile else "eager (one kernel per op)"
    warnings = tuple(step_warnings(g.meta, hw, sim.peak_memory_bytes))
    return Prediction(config, hw, sim, order_label(g, config.compile), kernels,
                      "; ".join(s.stats[0].notes), warnings)  # fmt: skip


def async_tp_step(workload: Workload, hw: Hardware) -> Any:
    """The workload's graph with async TP applied (:mod:`commsched.rewrites.async_tp`): the TP group's fusable sites
    inside the blocks (the output projection is outside torchtitan's compiled blocks). ValueError (one line) without
    TP, or where ``hw`` cannot run symmetric-memory copies (:func:`commsched.cost.symm_mem.copy_engine_refusal`)."""
    from commsched.cost.symm_mem import copy_engine_refusal
    from commsched.rewrites.async_tp import async_tp_graph, async_tp_sites

    tp = workload.meta.get("groups", {}).get("tp")
    if tp is None or tp["size"] < 2:
        raise ValueError("async TP needs tensor parallelism (tp > 1)")
    why = copy_engine_refusal(hw, tp["size"], tp["stride"])
    if why is not None:
        raise ValueError(f"async TP: {why}")
    vocab = next(p for p in workload.spec.layout if p.key == "output").local_shape[0]
    sites = async_tp_sites(workload.graph_module, tp["name"], skip_columns=vocab)
    return async_tp_graph(workload.graph, sites).graph


def predict(
    config: StepConfig,
    hardware: str | Hardware = "h100-sxm",
    *,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
    progress: Callable[[str], None] | None = None,
) -> Prediction:
    """The step of ``config`` as the framework runs it on ``hardware``: :func:`trace` then
    :func:`predict_workload`. ``progress`` receives the trace's phase messages."""
    return predict_workload(trace(config, progress), config, hardware, num_nodes=num_nodes,
                            gpus_per_node=gpus_per_node)  # fmt: skip


def world_for_nodes(hardware: str | Hardware, num_nodes: int, gpus_per_node: int | None = None) -> int:
    """The world size of ``num_nodes`` full nodes of ``hardware`` (``gpus_per_node``: the profile's unless given)."""
    from commsched.hardware import Hardware, get

    gpn = gpus_per_node or (hardware.gpus_per_node if isinstance(hardware, Hardware) else get(hardware).gpus_per_node)
    return num_nodes * gpn

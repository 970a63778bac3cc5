"""A torchtitan job config (TOML) read as the step it trains (:class:`commsched.experiments.predict.StepConfig`).

The keys and their defaults are torchtitan's ``torchtitan/config/job_config.py`` at commit 4a950ea (2026-04-13), the
last with TOML train configs (``tests/data/torchtitan/SOURCE.txt``); the older names of the same keys (2024-2025:
``[training] batch_size``, ``data_parallel_degree``, ``compile``, ``[experimental] pipeline_parallel_degree``,
``[float8] enable_float8_linear``, ...) are read too. What is read:

* ``[model] name`` / ``flavor``: llama3 8B / 70B / 405B -> the presets llama3-8b / llama3-70b / llama3-405b;
* ``[parallelism]`` degrees: ``data_parallel_shard_degree`` (-1: the rest of the world) is FSDP,
  ``data_parallel_replicate_degree`` is DDP when the shard degree is 1 and HSDP (the zoo's ``dp_replicate``) when
  both are > 1 (with context parallelism too: FSDP shards over dp_shard x cp inside each replica),
  ``tensor_parallel_degree`` is TP with sequence parallelism (torchtitan's llama3 plan),
  ``context_parallel_degree`` is the zoo's ``cp_size`` (FSDP then shards over dp_shard x cp, as torchtitan's
  ``fsdp`` mesh dimension does) with ``context_parallel_rotate_method`` (default ``"allgather"``) and the
  ``"headtail"`` load balancer (the only one the zoo models);
  ``enable_async_tensor_parallel`` is async TP (symmetric memory; with TP and ``[compile]`` only, as torchtitan
  requires: :func:`commsched.experiments.predict.async_tp_step`);
* pipeline parallelism (``pipeline_parallel_degree`` > 1, the outermost mesh dimension): ``pipeline_parallel_schedule``
  (default ``"1F1B"``), M = ``local_batch_size / pipeline_parallel_microbatch_size`` (default 1) micro-batches
  (the 2024 ``[experimental] pipeline_parallel_microbatches``: M itself), V from
  ``pipeline_parallel_layers_per_stage`` as torchtitan's ``pipeline_llm`` derives it (unset: 1 for GPipe / 1F1B,
  else 2), predicted by :mod:`commsched.experiments.predict_pipeline`; a custom split
  (``module_fqns_per_model_part``, ``*_stage_less_layers`` other than 1, the 2024 ``split_points``) or a CSV
  schedule is refused;
* ``[training] local_batch_size`` (sequences per data-parallel rank), ``seq_len``, ``mixed_precision_param``,
  ``max_norm`` (gradient clipping, default 1.0);
  ``global_batch_size`` other than the data-parallel batch (gradient accumulation) is refused;
* ``[activation_checkpoint] mode`` (+ ``selective_ac_option``: ``"op"`` -> selective-op, N -> selective-layer:N);
* ``[compile] enable`` (with ``"model"`` in ``components``);
* ``[optimizer] name`` (AdamW) and ``implementation`` (default ``"fused"``: the zoo's ``adamw-fused``; ``"foreach"``:
  ``adamw``; the 2024 ``fused = true / false``: fused / foreach), the step's optimizer; ``"for-loop"``, Adam and
  ``early_step_in_backward`` are refused;
* ``[model] converters`` with ``"float8"`` and ``[quantize.linear.float8]``: the recipe (none given: tensorwise) and
  ``enable_fsdp_float8_all_gather``, traced as the zoo's ``float8`` where it models them
  (:meth:`commsched.experiments.predict.StepConfig.check` says where not).

The world size comes from the degrees when none is -1, else from the caller (``--world-size`` / ``--num-nodes``).
Every error is one line naming the file and the key. Unknown sections, unknown keys in the sections that shape the
step and values of the wrong type are refused (torchtitan refuses unknown keys too).
"""

from __future__ import annotations

import dataclasses
import sys
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from commsched.experiments.predict import StepConfig
from commsched.io import read_input_text

if sys.version_info >= (3, 11):
    import tomllib
else:  # pragma: no cover - Python 3.10
    import tomli as tomllib

FLAVORS = {("llama3", "8B"): "llama3-8b", ("llama3", "70B"): "llama3-70b", ("llama3", "405B"): "llama3-405b"}
"""torchtitan (model name, flavor) -> zoo preset"""

_OLD_TRAINING = ("batch_size", "warmup_steps", "data_parallel_degree", "data_parallel_shard_degree",
                 "data_parallel_replicate_degree", "tensor_parallel_degree", "enable_loss_parallel",
                 "disable_loss_parallel", "data_parallel_type", "compile", "deterministic", "seed",
                 "fsdp_reshard_after_forward")  # fmt: skip
KEYS: dict[str, tuple[str, ...] | None] = {
    "job": None, "profiling": None, "metrics": None, "lr_scheduler": None, "checkpoint": None,
    "optimizer": ("name", "lr", "beta1", "beta2", "eps", "weight_decay", "implementation", "early_step_in_backward",
                  "fused"),
    "comm": None, "memory_estimation": None, "fault_tolerance": None, "validation": None, "debug": None,
    "model": ("name", "flavor", "hf_assets_path", "tokenizer_path", "converters", "print_after_conversion",
              "norm_type", "use_flex_attn", "attn_mask_type"),
    "training": ("dataset", "dataset_path", "local_batch_size", "global_batch_size", "seq_len", "max_norm", "steps",
                 "enable_cpu_offload", "dtype", "mixed_precision_param", "mixed_precision_reduce", "gc_freq",
                 "gc_debug", "dataloader", *_OLD_TRAINING),
    "parallelism": ("data_parallel_replicate_degree", "data_parallel_shard_degree", "fsdp_reshard_after_forward",
                    "tensor_parallel_degree", "disable_loss_parallel", "enable_async_tensor_parallel",
                    "pipeline_parallel_degree", "module_fqns_per_model_part",
                    "pipeline_parallel_first_stage_less_layers", "pipeline_parallel_last_stage_less_layers",
                    "pipeline_parallel_layers_per_stage", "pipeline_parallel_schedule",
                    "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatch_size",
                    "pipeline_parallel_expert_parallel_overlap", "context_parallel_degree",
                    "context_parallel_load_balancer", "context_parallel_rotate_method", "expert_parallel_degree",
                    "expert_tensor_parallel_degree", "expert_parallel_comm_backend", "enable_compiled_autograd",
                    "pipeline_parallel_split_points", "pipeline_parallel_microbatches"),
    "activation_checkpoint": ("mode", "selective_ac_option", "per_op_sac_force_recompute_mm_shapes_by_fqns",
                              "early_stop", "memory_budget", "visualize_memory_budget_pareto", "preserve_rng_state",
                              "determinism_check", "debug"),
    "compile": ("enable", "components", "backend"),
    "quantize": ("linear", "grouped_mm"),
    "quantize.linear": ("float8", "mx"),
    "quantize.grouped_mm": ("float8", "mx"),
    "quantize.linear.float8": ("enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
                               "recipe_name", "filter_fqns", "emulate"),
    "quantize.linear.mx": ("mxfp8_dim1_cast_kernel_choice", "recipe_name", "filter_fqns"),
    "quantize.grouped_mm.float8": ("fqns",),
    "quantize.grouped_mm.mx": ("recipe_name", "fqns"),
    "experimental": ("custom_import", "custom_args_module", "custom_model_path", "enable_async_tensor_parallel",
                     "enable_compiled_autograd", "pipeline_parallel_degree", "pipeline_parallel_split_points",
                     "pipeline_parallel_schedule", "pipeline_parallel_schedule_csv", "pipeline_parallel_microbatches",
                     "context_parallel_degree", "context_parallel_rotate_method"),
    "float8": ("enable_float8_linear", "enable_fsdp_float8_all_gather", "precompute_float8_dynamic_scale_for_fsdp",
               "scaling_type_input", "scaling_type_weight", "scaling_type_grad_output", "recipe_name", "filter_fqns",
               "force_recompute_fp8_weight_in_bwd"),
}  # fmt: skip
"""section (dotted for sub-tables) -> its keys (None: keys not checked, the section does not shape the step)"""

_INT, _BOOL, _STR, _STRS, _NUM = "an integer", "true or false", "a string", "a list of strings", "a number"
TYPES: dict[str, str] = {
    "model.name": _STR, "model.flavor": _STR, "model.converters": _STRS,
    "training.local_batch_size": _INT, "training.batch_size": _INT, "training.global_batch_size": _INT,
    "training.seq_len": _INT, "training.max_norm": _NUM, "training.mixed_precision_param": _STR,
    "training.enable_cpu_offload": _BOOL,
    "training.compile": _BOOL, "compile.enable": _BOOL, "compile.components": _STRS,
    "activation_checkpoint.mode": _STR, "parallelism.fsdp_reshard_after_forward": _STR,
    "quantize.linear.float8.enable_fsdp_float8_all_gather": _BOOL, "quantize.linear.float8.recipe_name": _STR,
    "float8.enable_float8_linear": _BOOL, "float8.enable_fsdp_float8_all_gather": _BOOL,
    "float8.recipe_name": _STR,
    **{f"{s}.context_parallel_rotate_method": _STR for s in ("parallelism", "experimental")},
    "parallelism.context_parallel_load_balancer": _STR,
    "optimizer.name": _STR, "optimizer.implementation": _STR, "optimizer.fused": _BOOL,
    "optimizer.early_step_in_backward": _BOOL,
    **{f"{s}.{k}": _INT for s in ("parallelism", "training", "experimental") for k in
       ("data_parallel_replicate_degree", "data_parallel_shard_degree", "data_parallel_degree",
        "tensor_parallel_degree", "pipeline_parallel_degree", "context_parallel_degree", "expert_parallel_degree")},
    **{f"{s}.enable_async_tensor_parallel": _BOOL for s in ("parallelism", "experimental")},
    **{f"{s}.pipeline_parallel_{k}": kind for s in ("parallelism", "experimental") for k, kind in
       (("schedule", _STR), ("schedule_csv", _STR), ("microbatches", _INT))},
    **{f"parallelism.pipeline_parallel_{k}": _INT for k in ("microbatch_size", "layers_per_stage",
                                                            "first_stage_less_layers", "last_stage_less_layers")},
}  # fmt: skip
"""dotted key -> the type it must have (the keys read; ``selective_ac_option`` is a string or an integer)"""


def _type_ok(value: Any, kind: str) -> bool:
    if kind == _INT:
        return isinstance(value, int) and not isinstance(value, bool)
    if kind == _BOOL:
        return isinstance(value, bool)
    if kind == _NUM:
        return isinstance(value, int | float) and not isinstance(value, bool)
    if kind == _STR:
        return isinstance(value, str)
    return isinstance(value, list) and all(isinstance(v, str) for v in value)


class _Config:
    """The parsed TOML with its path, for lookups and one-line errors naming the file and the key."""

    def __init__(self, path: Path, data: dict[str, Any]) -> None:
        self.path, self.data = path, data

    def error(self, key: str, message: str) -> ValueError:
        section, _, name = key.rpartition(".")
        where = f"[{section}] {name}" if section else f"[{name}]"
        return ValueError(f"{self.path}: {where}: {message}")

    def get(self, *keys: str, default: Any = None) -> Any:
        """The value of the first of ``keys`` (dotted, older names after the current one) the file sets."""
        for key in keys:
            node: Any = self.data
            for part in key.split("."):
                node = node.get(part) if isinstance(node, dict) else None
            if node is not None:
                return node
        return default

    def given(self, *keys: str) -> str | None:
        """The first of ``keys`` the file sets (None: none)."""
        return next((k for k in keys if self.get(k) is not None), None)

    def validate(self) -> None:
        """Unknown sections and keys, and read keys of the wrong type, as one-line errors."""
        custom = self.get("job.custom_config_module") or self.get("experimental.custom_args_module")
        for section, body in self.data.items():
            if section not in KEYS:
                if custom:  # torchtitan merges the sections a custom config module adds
                    continue
                raise self.error(section, f"unknown section (torchtitan's: {', '.join(sorted(KEYS))})")
            if not isinstance(body, dict):
                raise self.error(section, f"expected a table, got {body!r}")
            self._validate_table(section, body)

    def _validate_table(self, section: str, body: dict[str, Any]) -> None:
        known = KEYS.get(section)
        if known is None:
            return
        for key, value in body.items():
            dotted = f"{section}.{key}"
            if key not in known:
                raise self.error(dotted, "unknown key (not a torchtitan job config key)")
            if dotted in KEYS:
                if not isinstance(value, dict):
                    raise self.error(dotted, f"expected a table, got {value!r}")
                self._validate_table(dotted, value)
            elif dotted in TYPES and not _type_ok(value, TYPES[dotted]):
                raise self.error(dotted, f"expected {TYPES[dotted]}, got {value!r}")
            elif key == "selective_ac_option" and (isinstance(value, bool) or not isinstance(value, (str, int))):
                raise self.error(dotted, f"expected 'op' or an integer, got {value!r}")


def read_config(path: str | Path) -> _Config:
    """``path`` parsed and validated (one-line ValueError / FileNotFoundError naming the file)."""
    path = Path(path)
    if not path.is_file():
        raise FileNotFoundError(f"{path}: no such torchtitan config file")
    try:
        data = tomllib.loads(read_input_text(path, "torchtitan config"))
    except tomllib.TOMLDecodeError as exc:
        raise ValueError(f"{path}: not valid TOML: {exc}") from None
    cfg = _Config(path, data)
    cfg.validate()
    return cfg


@dataclass(frozen=True)
class Degrees:
    """torchtitan's parallel degrees (``shard`` -1: the rest of the world)."""

    replicate: int
    shard: int
    tp: int
    cp: int
    pp: int
    ep: int

    def world(self) -> int | None:
        """The world the degrees fix (None when the shard degree takes the rest)."""
        return None if self.shard == -1 else self.replicate * self.shard * self.tp * self.cp * self.pp


def _degrees(cfg: _Config) -> Degrees:
    def degree(name: str, older: tuple[str, ...], lowest: int = 1) -> int:
        keys = (f"parallelism.{name}", *(f"{s}.{name}" for s in older))
        value = cfg.get(*keys, default=-1 if lowest == -1 else 1)
        if value < 1 and value != lowest:
            rest = " or -1 (the rest of the world)" if lowest == -1 else ""
            raise cfg.error(cfg.given(*keys) or keys[0], f"{value}: expected >= 1{rest}")
        return value

    shard = degree("data_parallel_shard_degree", ("training",), lowest=-1)
    if cfg.get("parallelism.data_parallel_shard_degree", "training.data_parallel_shard_degree") is None:
        shard = cfg.get("training.data_parallel_degree", default=shard)  # the 2024 name
    return Degrees(
        replicate=degree("data_parallel_replicate_degree", ("training",)),
        shard=shard,
        tp=degree("tensor_parallel_degree", ("training",)),
        cp=degree("context_parallel_degree", ("experimental",)),
        pp=degree("pipeline_parallel_degree", ("experimental",)),
        ep=degree("expert_parallel_degree", ()),
    )


def _plan(cfg: _Config, d: Degrees, world_size: int | None) -> tuple[str, int, int | None, int]:
    """(zoo parallelism, world size, tp_size, dp_replicate) of the degrees; one-line errors for what the zoo lacks."""
    if d.ep > 1:
        raise cfg.error("parallelism.expert_parallel_degree", f"{d.ep}: expert parallelism (llama3 is dense) is not "
                        "yet supported by the zoo")  # fmt: skip
    fixed = d.world()
    if world_size is None and fixed is None:
        raise cfg.error("parallelism.data_parallel_shard_degree", "-1 (the rest of the world) needs the world size, "
                        "which the config does not say: give --world-size or --num-nodes")  # fmt: skip
    world = world_size if world_size is not None else fixed
    assert world is not None
    others = d.replicate * d.tp * d.cp * d.pp
    shard = d.shard
    if shard == -1:
        if world % others:
            raise cfg.error("parallelism.data_parallel_shard_degree", f"-1: world size {world} is not a multiple of "
                            f"replicate {d.replicate} x tp {d.tp} x cp {d.cp} x pp {d.pp} = {others}")  # fmt: skip
        shard = world // others
    elif fixed != world:
        raise ValueError(f"{cfg.path}: the degrees (replicate {d.replicate} x shard {d.shard} x tp {d.tp} x cp {d.cp} "
                         f"x pp {d.pp} = {fixed}) do not make world size {world}")  # fmt: skip
    tp = d.tp if d.tp > 1 else None
    if shard * d.cp > 1:  # torchtitan's fsdp dimension is dp_shard x cp: FSDP whenever CP is on; replicate > 1: HSDP
        return ("fsdp+tp+sp" if tp else "fsdp"), world, tp, d.replicate
    if d.replicate > 1:
        return ("tp+sp" if tp else "ddp"), world, tp, 1
    return ("tp+sp" if tp else "none"), world, tp, 1


def _optimizer(cfg: _Config) -> str:
    """The zoo's optimizer of ``[optimizer]``: AdamW, fused unless the config says foreach (torchtitan's default
    ``implementation = "fused"``; the 2024 configs' ``fused`` flag: foreach when false)."""
    name = cfg.get("optimizer.name", default="AdamW")
    if name != "AdamW":
        raise cfg.error("optimizer.name", f"{name!r}: only AdamW is modelled (not yet supported)")
    if cfg.get("optimizer.early_step_in_backward", default=False):
        raise cfg.error("optimizer.early_step_in_backward", "true: the optimizer in the backward is not yet supported")
    implementation = cfg.get("optimizer.implementation")
    if implementation is None and cfg.get("optimizer.fused") is not None:
        implementation = "fused" if cfg.get("optimizer.fused") else "foreach"
    kinds = {"fused": "adamw-fused", "foreach": "adamw"}
    if (implementation or "fused") not in kinds:
        raise cfg.error("optimizer.implementation", f"{implementation!r}: expected fused or foreach (for-loop, one "
                        "kernel per tensor, is not yet supported)")  # fmt: skip
    return kinds[implementation or "fused"]


def _max_norm(cfg: _Config) -> float:
    """``[training] max_norm``, the gradient clipping norm (torchtitan's default 1.0; it always clips)."""
    value = cfg.get("training.max_norm", default=1.0)
    if not value > 0:
        raise cfg.error("training.max_norm", f"{value}: expected a number > 0")
    return float(value)


def _ac(cfg: _Config) -> str:
    mode = cfg.get("activation_checkpoint.mode", default="selective")
    if mode in ("none", "full"):
        return mode
    if mode != "selective":
        raise cfg.error("activation_checkpoint.mode", f"{mode!r}: expected none, selective or full (memory_budget "
                        "is not yet supported)")  # fmt: skip
    option = str(cfg.get("activation_checkpoint.selective_ac_option", default="2")).strip()
    if option == "op":
        return "selective-op"
    if option.isdigit() and int(option) >= 1:
        return f"selective-layer:{int(option)}"
    raise cfg.error("activation_checkpoint.selective_ac_option", f"{option!r}: expected 'op' or an integer >= 1")


def _float8(cfg: _Config) -> tuple[str, bool]:
    """(float8 recipe or "none", FSDP2 all-gathers float8 weights): ``converters = ["float8"]`` (or the older
    ``[float8] enable_float8_linear``) turns float8 on; no recipe is torchao's tensorwise one."""
    converters = cfg.get("model.converters", default=[])
    if any(c in ("mx", "quantize.linear.mx", "mxfp8") for c in converters):
        raise cfg.error("model.converters", f"{converters}: MX formats are not yet supported by the zoo")
    if "float8" in converters or "quantize.linear.float8" in converters:
        section = "quantize.linear.float8"
    elif cfg.get("float8.enable_float8_linear", default=False):
        section = "float8"
    else:
        return "none", False
    recipe = cfg.get(f"{section}.recipe_name") or "tensorwise"
    return recipe, bool(cfg.get(f"{section}.enable_fsdp_float8_all_gather", default=False))


def _context_parallel(cfg: _Config, cp: int) -> tuple[tuple[str, Any], ...]:
    """The zoo's ``cp_size`` / ``cp_rotate`` of ``context_parallel_degree`` (1: none) and
    ``context_parallel_rotate_method`` (torchtitan's default ``"allgather"``: ``job_config.py`` at 4a950ea)."""
    if cp == 1:
        return ()
    key = cfg.given("parallelism.context_parallel_rotate_method", "experimental.context_parallel_rotate_method")
    rotate = cfg.get(key) if key else "allgather"
    if rotate not in ("allgather", "alltoall"):
        raise cfg.error(key or "parallelism.context_parallel_rotate_method", f"{rotate!r}: expected allgather or "
                        "alltoall")  # fmt: skip
    balancer = cfg.get("parallelism.context_parallel_load_balancer", default="headtail")
    if balancer != "headtail":
        raise cfg.error("parallelism.context_parallel_load_balancer", f"{balancer!r}: only 'headtail' (SDPA's, the "
                        "default) is modelled by the zoo")  # fmt: skip
    return (("cp_rotate", rotate), ("cp_size", cp))


def _batch(cfg: _Config, world: int, tp: int | None, cp: int = 1, pp: int = 1) -> int:
    batch = cfg.get("training.local_batch_size", "training.batch_size", default=8)
    key = cfg.given("training.local_batch_size", "training.batch_size") or "training.local_batch_size"
    if batch < 1:
        raise cfg.error(key, f"{batch}: expected >= 1")
    global_batch = cfg.get("training.global_batch_size", default=-1)
    dp = world // ((tp or 1) * cp * pp)
    if global_batch not in (-1, batch * dp):
        raise cfg.error("training.global_batch_size", f"{global_batch} is not local_batch_size {batch} x the data-"
                        f"parallel degree {dp} = {batch * dp}: gradient accumulation is not yet supported")  # fmt: skip
    return batch


def _pp_key(cfg: _Config, name: str) -> str:
    """The dotted key ``pipeline_parallel_<name>`` the file sets ([parallelism], else the 2024 [experimental])."""
    keys = (f"parallelism.pipeline_parallel_{name}", f"experimental.pipeline_parallel_{name}")
    return cfg.given(*keys) or keys[0]


def _pipeline(cfg: _Config, pp: int, batch: int, preset: str) -> dict[str, Any]:
    """The StepConfig's pipeline fields of the config (none when ``pp`` is 1), checked as torchtitan's
    ``pipeline_llm`` and ``build_pipeline_schedule`` check them (at 4a950ea), each error naming the key."""
    from commsched.pipeline.actions import SINGLE_STAGE, parse_schedule
    from commsched.workloads import get_preset

    if pp == 1:
        return {}
    for name, off in (("schedule_csv", ""), ("split_points", None), ("first_stage_less_layers", 1),
                      ("last_stage_less_layers", 1)):  # fmt: skip
        if cfg.get(_pp_key(cfg, name)) not in (None, off):
            raise cfg.error(_pp_key(cfg, name), f"{cfg.get(_pp_key(cfg, name))!r}: only torchtitan's default split "
                            "and torch's schedules are modelled (not yet supported)")  # fmt: skip
    if cfg.get("parallelism.module_fqns_per_model_part") is not None:
        raise cfg.error("parallelism.module_fqns_per_model_part", "a custom split is not yet supported")
    key = _pp_key(cfg, "schedule")
    name = cfg.get(key, default="1F1B")
    try:
        schedule = parse_schedule(name)
    except ValueError as exc:  # its text after "schedule=...: " names torch's schedules
        raise cfg.error(key, f"{name!r}: {str(exc).partition(': ')[2]}") from None
    single = schedule in SINGLE_STAGE
    return {
        "pp_size": pp,
        "pp_schedule": schedule,
        "microbatches": _microbatches(cfg, batch),
        "stages_per_rank": _stages_per_rank(cfg, pp, single, get_preset(preset).n_layers),
    }


def _microbatches(cfg: _Config, batch: int) -> int:
    """M: ``local_batch_size / pipeline_parallel_microbatch_size`` (torchtitan's ``build_pipeline_schedule``); the
    2024 configs' ``pipeline_parallel_microbatches`` is M itself."""
    if cfg.get(_pp_key(cfg, "microbatches")) is not None:
        m = cfg.get(_pp_key(cfg, "microbatches"))
        if m < 1 or batch % m:
            raise cfg.error(_pp_key(cfg, "microbatches"), f"{m}: expected a divisor of local_batch_size {batch}")
        return m
    size = cfg.get("parallelism.pipeline_parallel_microbatch_size", default=1)
    if size < 1 or batch % size:
        raise cfg.error("parallelism.pipeline_parallel_microbatch_size", f"{size}: local_batch_size {batch} must be "
                        "divisible by it (torchtitan refuses it)")  # fmt: skip
    return batch // size


def _stages_per_rank(cfg: _Config, pp: int, single: bool, layers: int) -> int:
    """V: from ``pipeline_parallel_layers_per_stage`` as torchtitan's ``pipeline_llm`` derives it (stages =
    ceil((layers + 2) / it), the embedding and the output counted as a layer each; a multiple of the PP degree; 1 for
    GPipe / 1F1B, >= 2 for the others), else its default (1 for GPipe / 1F1B, else 2)."""
    key = "parallelism.pipeline_parallel_layers_per_stage"
    per_stage = cfg.get(key)
    if per_stage is None:
        return 1 if single else 2
    if per_stage < 1:
        raise cfg.error(key, f"{per_stage}: expected >= 1")
    stages = -(-(layers + 2) // per_stage)
    if stages % pp:
        raise cfg.error(key, f"{per_stage}: {layers} layers + 2 make {stages} stages, not a multiple of "
                        f"pipeline_parallel_degree {pp} (torchtitan refuses it)")  # fmt: skip
    v = stages // pp
    if single != (v == 1):
        need = "exactly 1 stage per rank" if single else "at least 2 stages per rank"
        raise cfg.error(key, f"{per_stage}: {v} stage(s) per rank; the schedule needs {need} (torchtitan refuses it)")
    return v


RESHARD_AFTER_FORWARD = ("default", "always", "never")
"""torchtitan's ``fsdp_reshard_after_forward`` values (``default``: True without PP, False under PP)"""


def _reshard_after_forward(cfg: _Config, pp: int) -> bool:
    """FSDP2's ``reshard_after_forward`` as torchtitan's ``parallelize_llama`` derives it from the config. Under PP
    the pipeline's stages are modelled without reshard (torchtitan's default there): ``always`` is refused."""
    key = cfg.given("parallelism.fsdp_reshard_after_forward", "training.fsdp_reshard_after_forward")
    value = cfg.get(key) if key else "default"
    if value not in RESHARD_AFTER_FORWARD:
        raise cfg.error(str(key), f"{value!r}: expected one of {', '.join(RESHARD_AFTER_FORWARD)}")
    if pp > 1 and value == "always":
        raise cfg.error(str(key), "'always' under pipeline parallelism is not yet supported (the stages are "
                        "modelled without reshard, torchtitan's default)")  # fmt: skip
    return value != "never" or pp > 1


def to_step_config(cfg: _Config, *, world_size: int | None = None) -> StepConfig:
    """The step a validated config trains at ``world_size`` ranks (None: the degrees' product); one-line errors for
    what the zoo cannot trace yet."""
    name, flavor = cfg.get("model.name", default="llama3"), cfg.get("model.flavor", default="debugmodel")
    preset = FLAVORS.get((name, flavor))
    if preset is None:
        known = ", ".join(f"{n} {f} -> {p}" for (n, f), p in FLAVORS.items())
        raise cfg.error("model.flavor" if name == "llama3" else "model.name",
                        f"{name} {flavor!r}: no zoo preset for it ({known})")  # fmt: skip
    if cfg.get("training.enable_cpu_offload", default=False):
        raise cfg.error("training.enable_cpu_offload", "true: CPU offload is not yet supported")
    degrees = _degrees(cfg)
    parallel, world, tp, replicate = _plan(cfg, degrees, world_size)
    # torchtitan passes it to fully_shard only: without FSDP there is nothing to reshard
    reshard = _reshard_after_forward(cfg, degrees.pp) or "fsdp" not in parallel.split("+")
    components = cfg.get("compile.components", default=["model", "loss"])
    compile_ = bool(cfg.get("compile.enable", "training.compile", default=False)) and "model" in components
    float8, float8_all_gather = _float8(cfg)
    async_tp = bool(cfg.get("parallelism.enable_async_tensor_parallel", "experimental.enable_async_tensor_parallel",
                            default=False))  # fmt: skip
    notes = ()
    if async_tp and tp is None:  # torchtitan enables it only where TP is applied (parallelize_llama)
        async_tp, notes = False, ("enable_async_tensor_parallel without TP: nothing to micro-pipeline",)
    batch = _batch(cfg, world, tp, degrees.cp, degrees.pp)
    step = StepConfig(
        preset=preset, parallel=parallel, world_size=world, seq_len=cfg.get("training.seq_len", default=2048),
        batch=batch, dtype=cfg.get("training.mixed_precision_param", default="bfloat16"),
        tp_size=tp, ac=_ac(cfg), compile=compile_, float8=float8, float8_all_gather=float8_all_gather,
        async_tp=async_tp, reshard_after_forward=reshard, extra=_context_parallel(cfg, degrees.cp),
        source=cfg.path.name, notes=notes,
        dp_replicate=replicate, optimizer=_optimizer(cfg), max_norm=_max_norm(cfg),
        **_pipeline(cfg, degrees.pp, batch, preset),
    )  # fmt: skip
    try:
        step.check()  # float8, until the zoo has it; async TP without compile
    except ValueError as exc:
        if async_tp and "async TP" in str(exc):
            raise cfg.error("parallelism.enable_async_tensor_parallel", f"true: {exc}") from None
        key = "model.converters" if cfg.get("model.converters") else "float8.enable_float8_linear"
        raise cfg.error(key, f"{cfg.get(key)!r}: {exc}") from None
    return step


def from_torchtitan_config(path: str | Path, *, world_size: int | None = None) -> StepConfig:
    """The step the torchtitan job config at ``path`` trains, at ``world_size`` ranks (needed when its
    ``data_parallel_shard_degree`` is -1; else it must equal the degrees' product). One-line ValueError naming the
    file and the key for a bad or unsupported config."""
    return to_step_config(read_config(path), world_size=world_size)


CONFIG_KEYS = {
    "parallel": "[parallelism] degrees", "tp_size": "[parallelism] tensor_parallel_degree",
    "seq_len": "[training] seq_len", "batch": "[training] local_batch_size",
    "dtype": "[training] mixed_precision_param", "ac": "[activation_checkpoint]", "compile": "[compile] enable",
    "world_size": "[parallelism] degrees", "mode": "(a training job)",
    "dp_replicate": "[parallelism] data_parallel_replicate_degree", "optimizer": "[optimizer] name / implementation",
    "max_norm": "[training] max_norm",
    "async_tp": "[parallelism] enable_async_tensor_parallel",
    "reshard_after_forward": "[parallelism] fsdp_reshard_after_forward",
    "pp_size": "[parallelism] pipeline_parallel_degree", "pp_schedule": "[parallelism] pipeline_parallel_schedule",
    "microbatches": "[training] local_batch_size / [parallelism] pipeline_parallel_microbatch_size",
    "stages_per_rank": "[parallelism] pipeline_parallel_layers_per_stage",
}  # fmt: skip
"""StepConfig field -> where a torchtitan config says it (for a conflict with a command-line option)"""


def merge_options(step: StepConfig, given: dict[str, Any]) -> StepConfig:
    """``step`` with the command-line options ``given`` (StepConfig field or zoo option -> value): ``layers`` (a
    config does not say it) is taken; an option the config sets is accepted when it agrees and is a one-line
    ValueError naming both when it does not; any other is refused (the config says the step)."""
    replace: dict[str, Any] = {}
    for name, value in given.items():
        option = name.replace("_", "-")
        flag = (f"--{option}" if value else f"--no-{option}") if isinstance(value, bool) else f"--{option} {value}"
        if name == "layers":
            replace[name] = value
        elif name not in CONFIG_KEYS:
            raise ValueError(f"{flag}: not an option with --torchtitan-config ({step.source} says the step)")
        else:
            mine = "train" if name == "mode" else getattr(step, name)
            if ((value or 1) != (mine or 1)) if name == "tp_size" else value != mine:
                said = str(mine).lower() if isinstance(mine, bool) else mine
                raise ValueError(f"{flag} conflicts with {step.source}'s {CONFIG_KEYS[name]} ({said}): "
                                 "give one or the other")  # fmt: skip
    return dataclasses.replace(step, **replace) if replace else step

"""A layout as the job config torchtitan takes (TOML, the keys of ``torchtitan/config/job_config.py`` at 4a950ea,
the format :mod:`commsched.experiments.torchtitan` reads back): parallel degrees, the pipeline schedule and its
micro-batch size, FSDP's ``fsdp_reshard_after_forward`` (``"never"`` when the layout keeps the gathered weights; the
default otherwise), ``enable_async_tensor_parallel``, activation checkpointing, float8, torch.compile. What
torchtitan cannot say is a comment in the file: TP without sequence parallelism (torchtitan's llama3 plan always
shards the sequence), a model with no torchtitan flavor."""

from __future__ import annotations

import json
from typing import Any

from commsched.plan.layout import Layout, PlanRequest, local_batch

NO_INFERENCE_TOML = ("no torchtitan TOML for inference: its job config trains, and its inference script "
                     "(scripts/generate/test_generate.py) takes TP from the world size and its options on the command "
                     "line; --python writes the mesh and TP plan")  # fmt: skip
"""why ``plan --mode prefill|decode`` writes no TOML (one line)"""
_FLAVORS = {"llama3-8b": ("llama3", "8B"), "llama3-70b": ("llama3", "70B"), "llama3-405b": ("llama3", "405B")}


def _value(v: Any) -> str:
    if isinstance(v, bool):
        return "true" if v else "false"
    return json.dumps(v)  # ints, floats, strings and lists of strings are TOML as JSON writes them


def _section(name: str, items: dict[str, Any]) -> list[str]:
    return [f"[{name}]", *(f"{k} = {_value(v)}" for k, v in items.items()), ""]


def _ac(ac: str) -> dict[str, Any]:
    if ac in ("none", "full"):
        return {"mode": ac}
    option = "op" if ac == "selective-op" else ac.partition(":")[2]
    return {"mode": "selective", "selective_ac_option": option}


def _pipeline(req: PlanRequest, layout: Layout) -> dict[str, Any]:
    """torchtitan's pipeline keys: the schedule, the micro-batch size (M = local batch / it) and, for V > 1, each
    stage's modules (torchtitan's own split into P x V stages, :func:`commsched.pipeline.split.stage_fqns`: its
    ``layers_per_stage`` cannot make every stage count)."""
    if layout.pp == 1:
        return {}
    out: dict[str, Any] = {
        "pipeline_parallel_schedule": layout.pp_schedule,
        "pipeline_parallel_microbatch_size": local_batch(req, layout) // layout.microbatches,
    }
    if layout.stages_per_rank > 1:
        from commsched.pipeline.split import stage_fqns

        out["module_fqns_per_model_part"] = stage_fqns(layout.pp * layout.stages_per_rank, req.model().n_layers)
    return out


def torchtitan_toml(req: PlanRequest, layout: Layout, note: str = "") -> str:
    """The torchtitan job config of ``layout`` for ``req`` (a TOML document)."""
    name, flavor = _FLAVORS.get(req.preset, ("llama3", "debugmodel"))
    comments = [f"# commsched plan: {req.preset} on {req.gpus} x {req.hardware}: {layout.label()}"]
    if note:
        comments.append(f"# {note}")
    if req.preset not in _FLAVORS:
        comments.append(f"# {req.preset} has no torchtitan flavor: set [model] flavor to your model's")
    if layout.tp > 1 and not layout.sp:
        comments.append("# TP without sequence parallelism: torchtitan's llama3 plan always shards the sequence "
                        "(SP); this layout needs a TP plan without it")  # fmt: skip
    model: dict[str, Any] = {"name": name, "flavor": flavor}
    if layout.float8 != "none":
        model["converters"] = ["float8"]
    parallelism = {"data_parallel_replicate_degree": layout.dp_replicate, "data_parallel_shard_degree": layout.dp_shard,
                   "tensor_parallel_degree": layout.tp, "pipeline_parallel_degree": layout.pp,
                   "context_parallel_degree": layout.cp, **_pipeline(req, layout)}  # fmt: skip
    if layout.ep > 1:
        parallelism["expert_parallel_degree"] = layout.ep
    if not layout.reshard_after_forward:
        parallelism["fsdp_reshard_after_forward"] = "never"
    if layout.async_tp:
        parallelism["enable_async_tensor_parallel"] = True
    lines = [*comments, ""]
    lines += _section("model", model)
    lines += _section("training", {"local_batch_size": local_batch(req, layout), "seq_len": req.seq,
                                   "mixed_precision_param": req.dtype})  # fmt: skip
    lines += _section("parallelism", parallelism)
    lines += _section("activation_checkpoint", _ac(layout.ac))
    lines += _section("compile", {"enable": req.compile, "components": ["model", "loss"]})
    if layout.float8 != "none":
        fsdp = layout.fsdp > 1
        lines += _section("quantize.linear.float8", {"recipe_name": layout.float8, "filter_fqns": ["output"],
                                                     "enable_fsdp_float8_all_gather": fsdp and
                                                     layout.float8 == "tensorwise"})  # fmt: skip
    return "\n".join(lines)

"""A layout as the FSDP2 / ``torch.distributed.pipelining`` calls that run it: a Python snippet beside the torchtitan
TOML (:mod:`commsched.plan.toml_out`) for a user whose trainer is not torchtitan.

The snippet follows torchtitan's ``parallelize_llama`` and ``pipeline_llm`` at 4a950ea, condensed: the device mesh
in torchtitan's order (``pp``, ``dp_replicate``, ``dp_shard``, ``cp``, ``tp``; degrees of one left out), TP per
block with torchtitan's plan names (``attention.wq`` ... ``feed_forward.w3``, SP around the norms), activation
checkpointing with torch's ``checkpoint_wrapper``, torch.compile per block, async TP as torchtitan's
``maybe_enable_async_tp`` turns it on (Inductor's ``_micro_pipeline_tp``, symmetric memory on the TP group),
``fully_shard`` per block with ``reshard_after_forward`` (the layout's without PP; False under PP, torchtitan's
default) and on the root, torch's pipeline
schedule class over the rank's stages. It names a torchtitan-style Llama (``model.layers`` and :data:`OUTER`); the
tests compile it and run its ``build`` under the fake process group; EP is a comment (torchtitan's MoE calls).
"""

from __future__ import annotations

from commsched.pipeline.split import EMBED_FQN, NORM_FQN, OUTPUT_FQN
from commsched.plan.layout import Layout, PlanRequest, local_batch

MESH_ORDER = ("pp", "dp_replicate", "dp_shard", "cp", "tp")
"""torchtitan's mesh dimensions, outermost first (``ParallelDims``); ``ep`` borrows from ``dp_shard x cp``"""
OUTER = (EMBED_FQN, NORM_FQN, OUTPUT_FQN)
"""the model's modules outside the blocks, as torchtitan's pipeline split names them"""
_TP_SP = """\
    "attention_norm": SequenceParallel(),
    "attention": PrepareModuleInput(input_layouts=(Shard(1), None), desired_input_layouts=(Replicate(), None)),
    "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
    "attention.wo": RowwiseParallel(output_layouts=Shard(1)),
    "ffn_norm": SequenceParallel(),
    "feed_forward": PrepareModuleInput(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
    "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
    "feed_forward.w2": RowwiseParallel(output_layouts=Shard(1)),"""
_TP = """\
    "attention.wq": ColwiseParallel(), "attention.wk": ColwiseParallel(), "attention.wv": ColwiseParallel(),
    "attention.wo": RowwiseParallel(),
    "feed_forward.w1": ColwiseParallel(), "feed_forward.w3": ColwiseParallel(),
    "feed_forward.w2": RowwiseParallel(),"""
_SELECTIVE_OP = """\
# selective-op AC: matmul and attention outputs saved, the rest recomputed (torchtitan's _save_list, condensed)
from torch.utils.checkpoint import CheckpointPolicy, create_selective_checkpoint_contexts

_SAVE = {torch.ops.aten.mm.default, torch.ops.aten._scaled_dot_product_flash_attention.default,
         torch.ops.aten._scaled_dot_product_efficient_attention.default,
         torch.ops._c10d_functional.reduce_scatter_tensor.default}


def _policy(ctx, func, *args, **kwargs):
    return CheckpointPolicy.MUST_SAVE if func in _SAVE else CheckpointPolicy.PREFER_RECOMPUTE


def _wrap(block):
    return checkpoint_wrapper(block, context_fn=lambda: create_selective_checkpoint_contexts(_policy),
                              preserve_rng_state=False)
"""


def _stage_ids(layout: Layout) -> str:
    """The stage indices a pipeline rank runs: torchtitan's ``loop`` style (``rank + i P``) or, for the V-shaped
    schedules, ``v`` (``rank`` and ``2P - 1 - rank``)."""
    if layout.stages_per_rank == 1:
        return "[pp_rank]"
    if layout.pp_schedule in ("ZBVZeroBubble", "DualPipeV"):
        return "[pp_rank, 2 * PP - 1 - pp_rank]"
    return f"[pp_rank + i * PP for i in range({layout.stages_per_rank})]"


def _header(req: PlanRequest, layout: Layout) -> list[str]:
    degrees = ", ".join(f'"{name}": {getattr(layout, name)}' for name in MESH_ORDER)
    lines = [f'"""commsched plan: {req.preset} on {req.gpus} x {req.hardware}: {layout.label()}.',
             "",
             "FSDP2 / torch.distributed.pipelining calls of this layout (torchtitan's parallelize_llama, condensed);",
             f'run under torchrun with a torchtitan-style Llama (model.layers, {", ".join(OUTER)})."""',
             "import copy", "", "import torch",
             "from torch.distributed.device_mesh import init_device_mesh",
             "from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard",
             "from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper",
             "from torch.distributed.tensor import Replicate, Shard",
             "from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,",
             "                                               SequenceParallel, parallelize_module)",
             "from torch.distributed.pipelining import PipelineStage",
             f"from torch.distributed.pipelining.schedules import Schedule{layout.pp_schedule or '1F1B'}",
             "", f"DEGREES = {{{degrees}}}  # torchtitan's mesh order, outermost first",
             f"EP = {layout.ep}  # expert parallel degree (borrows from dp_shard x cp)",
             f"LOCAL_BATCH = {local_batch(req, layout)}  # sequences per data-parallel replica per step",
             f"SEQ_LEN = {req.seq}", f"AC = {layout.ac!r}", f"FLOAT8 = {layout.float8!r}",
             f"COMPILE = {req.compile}", f"ASYNC_TP = {layout.async_tp}",
             f"RESHARD_AFTER_FORWARD = {layout.reshard_after_forward}  # FSDP2's; False: gathered weights kept",
             f"OUTER = {OUTER!r}  # the modules outside the blocks",
             ""]  # fmt: skip
    if layout.ep > 1:
        lines += [
            "# EP: the experts of each block over an 'ep' mesh of EP ranks taken from dp_shard (torchtitan's",
            "# apply_moe_ep_tp with ExpertParallel, experts' FSDP over dp_shard / EP): not written out here",
            "",
        ]
    if layout.pp > 1:
        from commsched.pipeline.split import stage_fqns

        fqns = stage_fqns(layout.pp * layout.stages_per_rank, req.model().n_layers)
        lines += [f"PP, MICROBATCHES = {layout.pp}, {layout.microbatches}",
                  f"STAGE_FQNS = {fqns!r}  # torchtitan's split into P x V stages", ""]  # fmt: skip
    return lines


def _tp_ac(layout: Layout) -> list[str]:
    lines = [f"TP_PLAN = {{  # per block; torchtitan's names\n{_TP_SP if layout.sp else _TP}\n}}", ""]
    if layout.ac == "selective-op":
        lines.append(_SELECTIVE_OP)
    else:
        every = layout.ac.partition(":")[2] or "1"
        lines += ["", "def _wrap(block):", "    return checkpoint_wrapper(block, preserve_rng_state=False)", "", "",
                  f"AC_EVERY = {every}  # selective-layer:N checkpoints every N-th block; full: each", ""]  # fmt: skip
    return lines


_BODY = '''

def parallelize(model, mesh, reshard_after_forward):
    """TP, float8, AC, compile and FSDP2 on one model part, in torchtitan's order."""
    if DEGREES["tp"] > 1:
        for block in model.layers.values():
            parallelize_module(block, mesh["tp"], TP_PLAN)
        if ASYNC_TP:  # torchtitan's maybe_enable_async_tp: Inductor micro-pipelines TP in the compiled blocks
            from torch.distributed._symmetric_memory import enable_symm_mem_for_group

            torch._inductor.config._micro_pipeline_tp = True
            enable_symm_mem_for_group(mesh["tp"].get_group().group_name)
    if FLOAT8 != "none":
        from torchao.float8 import Float8LinearConfig, convert_to_float8_training

        config = Float8LinearConfig.from_recipe_name(FLOAT8)
        if FLOAT8 == "tensorwise" and DEGREES["dp_shard"] * DEGREES["cp"] > 1:
            config = Float8LinearConfig(enable_fsdp_float8_all_gather=True)
        convert_to_float8_training(model, config=config, module_filter_fn=lambda mod, fqn: fqn != OUTER[2])
    for i, (name, block) in enumerate(list(model.layers.named_children())):
        if AC == "full" or AC == "selective-op" or (AC.startswith("selective-layer") and i % AC_EVERY == 0):
            block = _wrap(block)
        if COMPILE:
            block = torch.compile(block, fullgraph=True)
        model.layers.register_module(name, block)
    if DEGREES["dp_shard"] * DEGREES["cp"] > 1:  # FSDP2 (HSDP with dp_replicate > 1)
        shard = [n for n in ("dp_shard", "cp") if DEGREES[n] > 1]
        if len(shard) > 1:  # FSDP shards over dp_shard x cp (torchtitan's dp_shard_cp)
            mesh[tuple(shard)]._flatten("dp_shard_cp")
            shard = ["dp_shard_cp"]
        dp_mesh = mesh[tuple(["dp_replicate"] * (DEGREES["dp_replicate"] > 1) + shard)]
        mp = MixedPrecisionPolicy(param_dtype=torch.bfloat16, reduce_dtype=torch.float32)
        for block in model.layers.values():
            fully_shard(block, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
        fully_shard(model, mesh=dp_mesh, mp_policy=mp, reshard_after_forward=reshard_after_forward)
    elif DEGREES["dp_replicate"] > 1:  # DDP
        from torch.distributed._composable.replicate import replicate

        replicate(model, device_mesh=mesh["dp_replicate"], bucket_cap_mb=100)
    return model


def build(model, loss_fn, device_type="cuda"):
    """The mesh and what one training step calls: the parallelised model or, under PP, the schedule."""
    names = tuple(n for n in DEGREES if DEGREES[n] > 1) or ("dp_shard",)
    mesh = init_device_mesh(device_type, tuple(DEGREES[n] for n in names), mesh_dim_names=names)
    # CP: each step runs inside torch.distributed.tensor.experimental.context_parallel(mesh["cp"], buffers=...)
'''
_FLAT = """    return mesh, parallelize(model, mesh, reshard_after_forward=RESHARD_AFTER_FORWARD)
"""
_PIPELINED = """    pp_rank = mesh["pp"].get_local_rank()
    stages = []
    for index in {stage_ids}:
        part = copy.deepcopy(model)  # keep only this stage's modules (torchtitan's pipeline_module_split)
        keep = set(STAGE_FQNS[index])
        for name in list(part.layers.keys()):
            if f"layers.{{name}}" not in keep:
                del part.layers[name]
        for name in OUTER:
            if name not in keep:
                setattr(part, name, None)
        part = parallelize(part, mesh, reshard_after_forward=False)  # torchtitan: no reshard under PP
        stages.append(PipelineStage(part, index, len(STAGE_FQNS), torch.device(device_type),
                                    group=mesh["pp"].get_group()))
    schedule = Schedule{schedule}({stages}, n_microbatches=MICROBATCHES, loss_fn=loss_fn)
    return mesh, schedule
"""


def fsdp2_python(req: PlanRequest, layout: Layout) -> str:
    """``layout`` for ``req`` as Python source (see the module docstring); ``compile()`` accepts it."""
    lines = _header(req, layout) + _tp_ac(layout)
    text = "\n".join(lines) + _BODY
    if layout.pp == 1:
        return text + _FLAT
    stages = "stages" if layout.stages_per_rank > 1 else "stages[0]"
    return text + _PIPELINED.format(
        stage_ids=_stage_ids(layout),
        schedule=layout.pp_schedule,
        stages=stages,
    )


INFERENCE_MESH_ORDER = ("dp_replicate", "cp", "tp")
"""an inference layout's mesh dimensions, outermost first (``ep``: the experts' ranks, a comment)"""
_ROOT_TP_SP = f"""\
    "{EMBED_FQN}": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
    "{NORM_FQN}": SequenceParallel(),
    "{OUTPUT_FQN}": ColwiseParallel(input_layouts=Shard(1), output_layouts=Replicate()),"""
_ROOT_TP = f"""\
    "{EMBED_FQN}": RowwiseParallel(input_layouts=Replicate()),
    "{OUTPUT_FQN}": ColwiseParallel(output_layouts=Replicate()),"""
_INFERENCE_BODY = '''

def build(model, device_type="cuda"):
    """The mesh and the model parallelised for inference: TP on the root and each block (torchtitan's plan names),
    torch.compile per block, eval mode; each data-parallel replica serves its own sequences."""
    names = tuple(n for n in DEGREES if DEGREES[n] > 1) or ("dp_replicate",)
    mesh = init_device_mesh(device_type, tuple(DEGREES[n] for n in names), mesh_dim_names=names)
    if DEGREES["tp"] > 1:
        parallelize_module(model, mesh["tp"], ROOT_TP_PLAN)
        for block in model.layers.values():
            parallelize_module(block, mesh["tp"], TP_PLAN)
    # CP (prefill): each step runs inside torch.distributed.tensor.experimental.context_parallel(mesh["cp"], ...)
    for name, block in list(model.layers.named_children()):
        if COMPILE:
            model.layers.register_module(name, torch.compile(block, fullgraph=True))
    return mesh, model.eval()
'''


def inference_python(req: PlanRequest, layout: Layout) -> str:
    """An inference ``layout`` (``req.mode`` prefill / decode) as Python source: the device mesh and the tensor-parallel
    plan (torchtitan's names; without SP the root plan of its ``scripts/generate/test_generate.py``,
    ``apply_tp_minus_sp``; with SP its training plan's); ``compile()`` accepts it."""
    degrees = ", ".join(f'"{name}": {getattr(layout, name)}' for name in INFERENCE_MESH_ORDER)
    lines = [f'"""commsched plan --mode {req.mode}: {req.preset} on {req.gpus} x {req.hardware}: {layout.label()}.',
             "",
             "The device mesh and tensor-parallel plan of this inference layout (torchtitan's plan names); run",
             f'under torchrun with a torchtitan-style Llama (model.layers, {", ".join(OUTER)})."""',
             "import torch",
             "from torch.distributed.device_mesh import init_device_mesh",
             "from torch.distributed.tensor import Replicate, Shard",
             "from torch.distributed.tensor.parallel import (ColwiseParallel, PrepareModuleInput, RowwiseParallel,",
             "                                               SequenceParallel, parallelize_module)",
             "", f"DEGREES = {{{degrees}}}  # outermost first; replicas never communicate",
             f"EP = {layout.ep}  # expert-parallel ranks per replica",
             f"LOCAL_BATCH = {local_batch(req, layout)}  # concurrent sequences per replica (per rank under EP)",
             f"SEQ_LEN = {req.seq}  # {'the prompt' if req.mode == 'prefill' else 'positions each new token attends'}",
             f"KV_LEN = {req.kv}  # KV-cache positions per sequence", f"COMPILE = {req.compile}", ""]  # fmt: skip
    if layout.ep > 1:
        lines += ["# EP: each block's experts over EP ranks, tokens dispatched and combined by all_to_all",
                  "# (torchtitan's ExpertParallel on an 'ep' mesh): not written out here", ""]  # fmt: skip
    lines += [f"ROOT_TP_PLAN = {{\n{_ROOT_TP_SP if layout.sp else _ROOT_TP}\n}}",
              f"TP_PLAN = {{  # per block\n{_TP_SP if layout.sp else _TP}\n}}"]  # fmt: skip
    return "\n".join(lines) + _INFERENCE_BODY

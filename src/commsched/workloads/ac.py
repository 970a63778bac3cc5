"""Activation checkpointing (AC) of the zoo's transformer blocks, as torchtitan applies it.

``ac`` is one of ``"none"``, ``"full"`` (every block), ``"selective-layer:N"`` (every N-th block) or
``"selective-op"`` (every block, saving the outputs of the expensive ops and recomputing the rest). A checkpointed
block runs under ``torch.utils.checkpoint.checkpoint(..., use_reentrant=False)``: its forward keeps no activation,
and the backward recomputes the forward when it first needs one of them, so a traced step holds the recomputed ops
in its backward, before the gradients that read them. The parameter fetch of the block (FSDP's all_gather, the
compute-dtype cast) is inside the checkpointed region, so the recompute re-gathers the block's parameters as FSDP2
does before a checkpointed block's backward (:meth:`commsched.workloads.sources.ParamSource.run`).

Follows torchtitan at commit 169ba3bd770617e9b623205dfe610720251d985d (2026-01-28, the last with the
``selective_ac_option`` layer/op choice): ``torchtitan/distributed/activation_checkpoint.py`` (``_apply_full_ac``,
``_apply_layer_sac``, ``_apply_op_sac`` and its ``_get_custom_policy``) with the ``_op_sac_save_list`` of
``torchtitan/models/llama3/infra/parallelize.py`` (dense models) and ``torchtitan/models/deepseek_v3/infra/
parallelize.py`` (MoE: also ``all_to_all_single``), and ``ActivationCheckpoint``'s defaults in
``torchtitan/config/job_config.py``: ``preserve_rng_state=False``, ``early_stop=False`` (the whole block forward is
recomputed, even ops whose outputs the backward does not read), ``determinism_check="default"``,
``per_op_sac_force_recompute_mm_shapes_by_fqns=["moe.router.gate"]`` (the MoE router's matmul is always recomputed
and not counted). Layer selection is torchtitan's: a counter incremented before the test, ``count % N == 0``, so
the checkpointed blocks are the 0-based layers ``N-1, 2N-1, ...`` (``layer + 1`` divisible by N; N=1: every block).
Unlike torchtitan's module-global counter, the count restarts with every step.

Beyond torchtitan, ``"per-layer:P,P,..."`` gives each block its own policy ``P`` (``none``, ``selective-op`` or
``full``, in layer order; ``P*K``: ``K`` blocks in a row), one per layer of the model: what
:mod:`commsched.optimize.families.ac_policy` proposes. Each block runs exactly as under the uniform mode of its
policy (``"per-layer:full,full"`` traces the graph of ``"full"`` node for node). Canonical spelling: runs merged,
``*1`` dropped (``"per-layer:full,full,none"`` -> ``"per-layer:full*2,none"``).
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Callable, Sequence
from typing import Any

import torch

AC_MODES = ("none", "full", "selective-op", "selective-layer:N", "per-layer:P,P,...")
"""the accepted values of ``ac`` (N: an integer >= 1; P: a block's policy, one of :data:`BLOCK_POLICIES`)"""
BLOCK_POLICIES = ("none", "selective-op", "full")
"""what one block can run under, from the most memory to the least (and the least recompute to the most)"""
PER_LAYER = "per-layer:"

Checkpoint = Callable[..., Any]
"""``checkpoint(fn, *args)``: ``fn(*args)`` with its activations recomputed in the backward"""


def parse_ac(ac: str, *, layers: int | None = None) -> str:
    """The canonical form of an ``ac`` value (``"selective-layer:02"`` -> ``"selective-layer:2"``, per-layer runs
    merged); a one-line ValueError naming the field and the accepted values otherwise. ``layers``: the model's
    block count, which a per-layer value must match."""
    value = str(ac).strip()
    if value in ("none", "full", "selective-op"):
        return value
    if value.startswith(PER_LAYER):
        policies = _per_layer_policies(value, ac)
        if layers is not None and len(policies) != layers:
            raise ValueError(f"ac={ac!r}: gives {len(policies)} block policies, expected one per layer ({layers})")
        return per_layer_ac(policies)
    head, sep, tail = value.partition(":")
    if head == "selective-layer" and sep:
        try:
            every = int(tail)
        except ValueError:
            every = 0
        if every >= 1:
            return f"selective-layer:{every}"
        raise ValueError(f"ac={ac!r}: selective-layer:N needs an integer N >= 1 (every N-th block checkpointed)")
    raise ValueError(f"ac={ac!r}: expected one of {', '.join(AC_MODES)} (N >= 1, P in {'|'.join(BLOCK_POLICIES)})")


def _per_layer_policies(value: str, ac: str) -> tuple[str, ...]:
    """The block policies of a ``per-layer:`` value (``P`` or ``P*K`` items, comma-separated)."""
    out: list[str] = []
    for item in value.removeprefix(PER_LAYER).split(","):
        policy, star, count = item.strip().partition("*")
        policy = policy.strip()
        try:
            repeat = int(count) if star else 1
        except ValueError:
            repeat = 0
        if policy not in BLOCK_POLICIES or repeat < 1:
            raise ValueError(f"ac={ac!r}: per-layer item {item.strip()!r}: expected P or P*K with P in "
                             f"{'|'.join(BLOCK_POLICIES)} and K >= 1")  # fmt: skip
        out += [policy] * repeat
    return tuple(out)


def per_layer_ac(policies: Sequence[str]) -> str:
    """The canonical ``ac`` value giving block ``i`` the policy ``policies[i]`` (runs merged as ``P*K``)."""
    runs: list[list[Any]] = []
    for policy in policies:
        if policy not in BLOCK_POLICIES:
            raise ValueError(f"block policy {policy!r}: expected one of {', '.join(BLOCK_POLICIES)}")
        if runs and runs[-1][0] == policy:
            runs[-1][1] += 1
        else:
            runs.append([policy, 1])
    if not runs:
        raise ValueError("per-layer AC needs at least one block policy")
    return PER_LAYER + ",".join(p if k == 1 else f"{p}*{k}" for p, k in runs)


def layer_policies(ac: str, layers: int) -> tuple[str, ...]:
    """Each of ``layers`` blocks' policy under ``ac`` (one of :data:`BLOCK_POLICIES`)."""
    return tuple(block_policy(ac, i, layers=layers) for i in range(layers))


def block_policy(ac: str, layer: int, *, layers: int | None = None) -> str:
    """What block ``layer`` (0-based) runs under: ``"none"``, ``"selective-op"`` or ``"full"`` (torchtitan's layer
    rule for ``selective-layer:N``: see the module)."""
    ac = parse_ac(ac, layers=layers)
    if ac.startswith(PER_LAYER):
        policies = _per_layer_policies(ac, ac)
        if not 0 <= layer < len(policies):
            raise ValueError(f"ac={ac!r}: no policy for layer {layer} (it gives {len(policies)})")
        return policies[layer]
    if ac.startswith("selective-layer:"):
        return "full" if (layer + 1) % int(ac.partition(":")[2]) == 0 else "none"
    return ac


def checkpointed(ac: str, layer: int) -> bool:
    """Whether block ``layer`` (0-based) is checkpointed under ``ac`` (torchtitan's layer rule: see the module)."""
    return block_policy(ac, layer) != "none"


def block_checkpoint(ac: str, layer: int, *, moe_router_shape: tuple[int, int] | None = None) -> Checkpoint | None:
    """The checkpoint block ``layer`` runs under (None: not checkpointed). ``moe_router_shape``: the MoE router
    matmul's right-hand shape ``(dim, n_experts)``, which selective-op AC always recomputes (torchtitan's
    ``per_op_sac_force_recompute_mm_shapes_by_fqns``); given, the save list is the MoE models' one."""
    policy = block_policy(ac, layer)
    if policy == "none":
        return None
    if policy == "full":
        return _checkpoint
    save = save_list(moe=moe_router_shape is not None)
    force = {torch.Size(moe_router_shape)} if moe_router_shape is not None else set()
    return functools.partial(_checkpoint, context_fn=functools.partial(_selective_contexts, save, force))


def _checkpoint(fn: Callable[..., Any], *args: Any, context_fn: Callable[[], Any] | None = None) -> Any:
    """``torch.utils.checkpoint.checkpoint`` with torchtitan's settings. Selective: under torch's non-strict
    tracing flag, so that under ``make_fx`` the selective checkpoint saves and recomputes as it does eagerly (in a
    proxy mode without the flag, torch's SAC saves every op and only tags the nodes for AOTAutograd's partitioner);
    torchtitan's make_fx tracer (``experiments/graph_trainer/make_fx_tracer.py``) traces under the same flag."""
    from torch.utils.checkpoint import checkpoint

    from commsched.workloads.tags import recomputing

    fn = recomputing(fn)  # the backward's second run of fn is tagged "recompute" in a traced step
    if context_fn is None:
        return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False, determinism_check="default",
                          early_stop=False)  # fmt: skip
    with _eager_sac():
        return checkpoint(fn, *args, use_reentrant=False, preserve_rng_state=False, determinism_check="default",
                          early_stop=False, context_fn=context_fn)  # fmt: skip


def _eager_sac() -> Any:
    """torch's non-strict make_fx tracing flag (``torch.compiler._non_strict_tracing_context``, private). A torch
    without it runs selective checkpoints eagerly on real tensors; tracing one under make_fx is refused."""
    context = getattr(torch.compiler, "_non_strict_tracing_context", None)
    if context is not None:
        return context()
    from torch.fx.experimental.proxy_tensor import get_proxy_mode

    if get_proxy_mode() is not None:
        raise RuntimeError(f"ac='selective-op' under make_fx needs torch.compiler._non_strict_tracing_context "
                           f"(torch {torch.__version__} has none): trace with ac='full' or a newer torch")  # fmt: skip
    return contextlib.nullcontext()


@functools.cache
def save_list(*, moe: bool = False) -> frozenset[Any]:
    """The ops whose outputs selective-op AC saves (torchtitan's ``_op_sac_save_list``; ``moe``: the MoE models'
    list, with ``all_to_all_single``), those this torch has. Beyond torchtitan: flash attention's CPU kernel, so a
    CPU run saves what a CUDA run saves."""
    aten, c10d = torch.ops.aten, torch.ops._c10d_functional
    names = [
        "mm",
        "_scaled_dot_product_efficient_attention",
        "_scaled_dot_product_flash_attention",
        "_scaled_dot_product_cudnn_attention",
        "_scaled_dot_product_attention_math",
        "_scaled_dot_product_fused_attention_overrideable",
        "max",
        "_scaled_dot_product_flash_attention_for_cpu",
    ]
    ops: set[Any] = {getattr(aten, n).default for n in names if hasattr(aten, n)}
    ops.add(c10d.reduce_scatter_tensor.default)
    if moe:
        ops.add(c10d.all_to_all_single.default)
    from torch import _higher_order_ops as hops

    ops.update(getattr(hops, n) for n in ("flex_attention", "inductor_compiled_code") if hasattr(hops, n))
    return frozenset(ops)


def _selective_contexts(save: frozenset[Any], force_recompute: set[torch.Size]) -> Any:
    """torchtitan's ``selective_checkpointing_context_fn``: a fresh matmul count for each checkpointed call."""
    from torch.utils.checkpoint import create_selective_checkpoint_contexts

    return create_selective_checkpoint_contexts(_policy(save, force_recompute))


def _policy(save: frozenset[Any], force_recompute: set[torch.Size]) -> Callable[..., Any]:
    """torchtitan's ``_get_custom_policy``: save the outputs of the save list's ops but every second matmul (counted
    apart in the forward and in the recompute), recompute the rest."""
    from torch.utils.checkpoint import CheckpointPolicy

    mm = torch.ops.aten.mm.default
    count = {"forward": 0, "recompute": 0}

    def policy(ctx: Any, func: Any, *args: Any, **kwargs: Any) -> Any:
        if func == torch.ops.aten._to_copy.default and "cuda" in str(args[0].device) \
                and str(kwargs.get("device")) == "cpu":  # fmt: skip
            return CheckpointPolicy.MUST_SAVE  # a device-to-host copy (none in the zoo's models)
        mode = "recompute" if ctx.is_recompute else "forward"
        if func == mm:
            if args[1].shape in force_recompute:
                return CheckpointPolicy.PREFER_RECOMPUTE
            count[mode] += 1
        if func in save and not (func == mm and count[mode] % 2 == 0):
            return CheckpointPolicy.MUST_SAVE
        return CheckpointPolicy.PREFER_RECOMPUTE

    return policy

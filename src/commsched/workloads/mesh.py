"""Parallel plans: how a world of ranks is split into a device mesh, and the process groups of one rank.

A plan is a named mesh, outer dimension first; the innermost dimension has stride 1 (consecutive ranks, e.g. one
node for tensor parallelism), an outer dimension's stride is the product of the sizes inside it.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

PARALLELISMS: dict[str, str] = {
    "fsdp": "FSDP2-style fully sharded data parallel: params all-gathered per block, grads reduce-scattered",
    "ddp": "DDP: replicated params, gradients all-reduced in ~25 MB buckets during backward",
    "tp": "Megatron tensor parallelism: column/row-parallel matmuls, all_reduce per block half",
    "tp+sp": "tensor + sequence parallelism: all_gather / reduce_scatter of the sequence around each block half",
    "fsdp+tp": "2-D mesh: FSDP over the outer dimension, tensor parallelism inside (stride 1)",
    "fsdp+tp+sp": "2-D mesh: FSDP outside, tensor + sequence parallelism inside",
    "ep": "expert parallelism (MoE): all_to_all dispatch/combine; dense grads all-reduced over all ranks",
    "fsdp+ep": "2-D for MoE (torchtitan): dense params FSDP over all ranks; experts split over EP, FSDP over the rest",
    "none": "one rank, no communication (a reference for real runs)",
}
MODES: dict[str, str] = {
    "train": "one joint forward + backward graph (loss and gradients)",
    "prefill": "forward over the prompt, filling a KV cache; logits of the last position",
    "decode": "forward of one new token per sequence against a KV cache of seq_len positions",
}
INFERENCE_PARALLELISMS = ("tp", "tp+sp", "ep", "none")


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ParallelPlan:
    """The mesh of one parallelism at one world size. Degrees of absent dimensions are 1."""

    parallel: str
    world_size: int
    mesh: tuple[tuple[str, int], ...]  # (dimension name, size), outer first; product == world_size
    tp: int = 1  # tensor-parallel degree
    sp: bool = False  # sequence parallelism inside the TP group
    fsdp: int = 1  # FSDP shard degree
    dp: int = 1  # DDP replicas whose gradients are all-reduced (also the dense-gradient group of "ep")
    ep: int = 1  # expert-parallel degree
    expert_fsdp: int = 0  # FSDP degree of expert parameters (0: the same as ``fsdp``; "fsdp+ep": world / ep)
    cp: int = 1  # context-parallel degree: the innermost factor of the data dimension (:func:`with_cp`)
    replicate: int = 1  # HSDP: replicas of the FSDP shards (outer mesh dim "dp_replicate"), grads all-reduced over them

    @property
    def dims(self) -> dict[str, int]:
        return dict(self.mesh)

    @property
    def cp_host(self) -> str:
        """The mesh dimension the CP groups split (torchtitan's ``fsdp`` = dp_shard x cp; ``dp`` without FSDP)."""
        return "fsdp" if "fsdp" in self.dims else "dp"

    def stride(self, dim: str) -> int:
        if dim == "cp":
            return self.stride(self.cp_host)
        names = [n for n, _ in self.mesh]
        if dim not in names:
            raise ValueError(f"mesh {self.mesh} has no dimension {dim!r}")
        return math.prod(s for _, s in self.mesh[names.index(dim) + 1 :])

    def coords(self, rank: int) -> dict[str, int]:
        """Mesh coordinates of a global rank."""
        if not 0 <= rank < self.world_size:
            raise ValueError(f"rank={rank} is outside the world of {self.world_size} ranks")
        out = {name: (rank // self.stride(name)) % size for name, size in self.mesh}
        if self.cp > 1:
            out["cp"] = out[self.cp_host] % self.cp
        return out

    def group_ranks(self, dim: str, rank: int) -> list[int]:
        """The global ranks of ``rank``'s group along mesh dimension ``dim`` (``"world"``: every rank)."""
        if dim == "world":
            return list(range(self.world_size))
        stride, size = self.stride(dim), (self.cp if dim == "cp" else self.dims[dim])
        base = rank - self.coords(rank)[dim] * stride
        return [base + k * stride for k in range(size)]

    def all_groups(self, dim: str) -> list[list[int]]:
        """Every group along ``dim``, in a fixed order (real process groups must be created by all ranks)."""
        seen: dict[int, list[int]] = {}
        for r in range(self.world_size):
            ranks = self.group_ranks(dim, r)
            seen.setdefault(ranks[0], ranks)
        return [seen[k] for k in sorted(seen)]

    def fsdp_degree(self, expert: bool) -> int:
        """Ranks one parameter is FSDP-sharded over (1: not sharded)."""
        return self.expert_fsdp if (expert and self.expert_fsdp) else self.fsdp

    def fsdp_dim(self, expert: bool) -> str:
        """The mesh dimension (or ``"world"``) whose group shards a parameter under FSDP."""
        if self.parallel == "fsdp+ep":
            return "efsdp" if expert else "world"
        return "fsdp"

    def fsdp_index(self, rank: int, expert: bool) -> int:
        """``rank``'s index in the FSDP group of a parameter (which shard it stores)."""
        dim = self.fsdp_dim(expert)
        return rank if dim == "world" else self.coords(rank)[dim]

    @property
    def data_parallel_degree(self) -> int:
        """Replicas that each see their own batch (tokens per step multiply by this)."""
        return self.world_size // (self.tp * self.cp)

    def to_meta(self) -> dict[str, Any]:
        return {
            "mesh": {name: size for name, size in self.mesh},
            "mesh_strides": {name: self.stride(name) for name, _ in self.mesh},
            "tp": self.tp,
            "sp": self.sp,
            "fsdp": self.fsdp,
            "dp": self.dp,
            "ep": self.ep,
            **({"expert_fsdp": self.expert_fsdp} if self.expert_fsdp else {}),
            **({"cp": self.cp} if self.cp > 1 else {}),
            **({"dp_replicate": self.replicate} if self.replicate > 1 else {}),
        }


def make_plan(
    parallel: str,
    world_size: int,
    *,
    tp_size: int | None = None,
    ep_size: int | None = None,
    n_experts: int = 0,
    tp_divides: int = 0,
    dp_replicate: int = 1,
) -> ParallelPlan:
    """The plan for ``parallel`` at ``world_size``; raises ValueError for an impossible mesh.

    Defaults: ``tp``/``tp+sp`` use every rank for TP (pass ``tp_size`` to add DDP replicas outside it);
    ``fsdp+tp`` puts TP over the largest divisor of ``world_size`` up to 8 that leaves FSDP >= 2 and divides
    ``tp_divides`` (the model's gcd of heads, KV heads and MLP width; 0: no constraint); ``ep`` uses
    ``gcd(world_size, n_experts)`` expert-parallel ranks. ``dp_replicate`` > 1: HSDP (:func:`_hsdp_plan`).
    """
    if parallel not in PARALLELISMS:
        raise ValueError(f"unknown parallelism {parallel!r}: expected one of {', '.join(PARALLELISMS)}")
    if dp_replicate != 1:
        return _hsdp_plan(parallel, world_size, dp_replicate, tp_size=tp_size, tp_divides=tp_divides)
    if not 1 <= world_size <= 1 << 20:
        raise ValueError(f"world_size={world_size}: expected 1..{1 << 20}")
    if parallel == "none":
        if world_size != 1:
            raise ValueError(f"parallel='none' runs on one rank; got world_size={world_size}")
        return ParallelPlan(parallel=parallel, world_size=1, mesh=(("dp", 1),))
    if world_size < 2:
        raise ValueError(f"parallel={parallel!r} needs world_size >= 2, got {world_size}")
    if parallel in ("fsdp", "ddp"):
        if tp_size not in (None, 1):
            raise ValueError(f"parallel={parallel!r} has no tensor parallelism; tp_size={tp_size} is not allowed")
        if parallel == "fsdp":
            return ParallelPlan(parallel=parallel, world_size=world_size, mesh=(("fsdp", world_size),), fsdp=world_size)
        return ParallelPlan(parallel=parallel, world_size=world_size, mesh=(("dp", world_size),), dp=world_size)
    if parallel in ("ep", "fsdp+ep"):
        return _expert_plan(parallel, world_size, ep_size, n_experts, tp_size)
    # tensor-parallel families
    if parallel.startswith("fsdp"):
        if tp_size is not None:
            tp = tp_size
        else:
            fits = [
                d
                for d in range(2, min(8, world_size // 2) + 1)
                if world_size % d == 0 and (tp_divides == 0 or tp_divides % d == 0)
            ]
            if not fits:
                model = f" and the model (gcd of heads, KV heads, MLP = {tp_divides})" if tp_divides else ""
                raise ValueError(
                    f"parallel={parallel!r} at world_size={world_size}: no tensor-parallel degree in 2..8 divides "
                    f"the world size{model} while leaving an FSDP dimension >= 2; pass tp_size"
                )
            tp = max(fits)
        if tp < 2 or world_size % tp or world_size // tp < 2:
            raise ValueError(
                f"parallel={parallel!r}: tp_size={tp} must be >= 2 and divide world_size={world_size} "
                "leaving an FSDP dimension >= 2"
            )
        fsdp = world_size // tp
        return ParallelPlan(
            parallel=parallel,
            world_size=world_size,
            mesh=(("fsdp", fsdp), ("tp", tp)),
            tp=tp,
            sp=parallel.endswith("+sp"),
            fsdp=fsdp,
        )
    tp = tp_size if tp_size is not None else world_size
    if tp < 2 or world_size % tp:
        raise ValueError(f"parallel={parallel!r}: tp_size={tp} must be >= 2 and divide world_size={world_size}")
    return ParallelPlan(
        parallel=parallel,
        world_size=world_size,
        mesh=(("dp", world_size // tp), ("tp", tp)),
        tp=tp,
        sp=parallel == "tp+sp",
        dp=world_size // tp,
    )


CP_PARALLELISMS = ("fsdp", "fsdp+tp", "fsdp+tp+sp", "ddp", "tp", "tp+sp")


def with_cp(plan: ParallelPlan, cp_size: int) -> ParallelPlan:
    """``plan`` with context parallelism of degree ``cp_size`` over consecutive ranks of its data dimension (just
    outside TP), as torchtitan's meshes place ``cp`` (``parallel_dims.py``: ``["batch", "cp", "tp"]`` for the data,
    ``["dp_replicate", "fsdp", "tp"]`` with ``fsdp = dp_shard x cp`` for FSDP, so FSDP shards over the CP ranks too).
    Under HSDP (``dp_replicate`` > 1) the CP ranks sit inside each replica's shard group (torchtitan's
    ``dp_shard_cp``): gradients reduce-scattered over dp_shard x cp, then all-reduced across the replicas.
    """
    if cp_size == 1:
        return plan
    if cp_size < 1:
        raise ValueError(f"cp_size={cp_size}: expected >= 1")
    if plan.parallel not in CP_PARALLELISMS:
        raise ValueError(f"cp_size={cp_size}: context parallelism composes with parallel in {CP_PARALLELISMS}, not "
                         f"{plan.parallel!r}")  # fmt: skip
    host = plan.cp_host
    if plan.dims.get(host, 1) % cp_size:
        raise ValueError(f"cp_size={cp_size} does not divide the {host} dimension ({plan.dims.get(host, 1)} = "
                         f"world_size {plan.world_size} / tp {plan.tp}): choose a world or tp_size that leaves a "
                         "multiple of cp")  # fmt: skip
    return dataclasses.replace(plan, cp=cp_size)


HSDP_PARALLELISMS = ("fsdp", "fsdp+tp", "fsdp+tp+sp")
"""the parallelisms whose FSDP shards can be replicated (``dp_replicate`` > 1)"""


def _hsdp_plan(parallel: str, world_size: int, replicate: int, *, tp_size: int | None, tp_divides: int) -> ParallelPlan:
    """HSDP, FSDP2's ``fully_shard`` on a (replicate, shard) mesh (torchtitan's ``data_parallel_replicate_degree``):
    ``parallel``'s plan on ``world_size / replicate`` ranks, inside an outer ``dp_replicate`` dimension whose groups
    all-reduce the reduce-scattered gradient shards."""
    if parallel not in HSDP_PARALLELISMS:
        raise ValueError(f"dp_replicate={replicate} (HSDP) replicates FSDP shards: it needs parallel in "
                         f"{', '.join(HSDP_PARALLELISMS)}, not {parallel!r}")  # fmt: skip
    if replicate < 1 or world_size % replicate:
        raise ValueError(f"dp_replicate={replicate} must be >= 1 and divide world_size={world_size}")
    if world_size // replicate < 2:
        raise ValueError(f"dp_replicate={replicate} at world_size={world_size} leaves FSDP shard groups of one rank "
                         "(that is DDP: parallel='ddp')")  # fmt: skip
    inner = make_plan(parallel, world_size // replicate, tp_size=tp_size, tp_divides=tp_divides)
    mesh = (("dp_replicate", replicate), *inner.mesh)
    return dataclasses.replace(inner, world_size=world_size, mesh=mesh, replicate=replicate)


def _expert_plan(
    parallel: str, world_size: int, ep_size: int | None, n_experts: int, tp_size: int | None
) -> ParallelPlan:
    """``ep``: experts over the inner ``ep`` ranks, gradients all-reduced (dense over the world, experts over
    ``edp``); ``fsdp+ep``: the same split, FSDP instead of all-reduce (dense over the world, experts over
    ``efsdp``)."""
    if n_experts < 1:
        raise ValueError(f"parallel={parallel!r} needs a mixture-of-experts model (n_experts > 0), e.g. mixtral-8x7b")
    if tp_size not in (None, 1):
        raise ValueError(f"parallel={parallel!r} has no tensor parallelism; tp_size={tp_size} is not allowed")
    ep = ep_size if ep_size is not None else math.gcd(world_size, n_experts)
    if ep < 2 or world_size % ep or n_experts % ep:
        raise ValueError(
            f"parallel={parallel!r}: ep_size={ep} must be >= 2 and divide both world_size={world_size} "
            f"and n_experts={n_experts}"
        )
    if parallel == "ep":
        mesh = (("edp", world_size // ep), ("ep", ep))
        return ParallelPlan(parallel=parallel, world_size=world_size, mesh=mesh, ep=ep, dp=world_size)
    mesh = (("efsdp", world_size // ep), ("ep", ep))
    return ParallelPlan(
        parallel=parallel, world_size=world_size, mesh=mesh, ep=ep, fsdp=world_size, expert_fsdp=world_size // ep
    )


def create_groups(plan: ParallelPlan, rank: int) -> dict[str, Any]:
    """torch.distributed process groups of ``rank`` for each mesh dimension of size > 1, plus ``"world"``.

    Needs an initialised default process group of ``plan.world_size`` ranks. With the fake backend only this
    rank's groups are created (no other process exists); with a real backend every group is created in the same
    order on every rank, as ``torch.distributed.new_group`` requires.
    """
    import torch.distributed as dist

    if not dist.is_initialized():
        raise RuntimeError("create_groups needs torch.distributed to be initialised (real or fake process group)")
    if dist.get_world_size() != plan.world_size:
        raise ValueError(
            f"the default process group has {dist.get_world_size()} ranks; the plan needs {plan.world_size}"
        )
    fake = dist.get_backend() == "fake"
    groups: dict[str, Any] = {"world": dist.group.WORLD}
    for name, size in plan.mesh:
        if size == 1:
            continue
        if size == plan.world_size:
            groups[name] = dist.group.WORLD
            continue
        mine = plan.group_ranks(name, rank)
        candidates = [mine] if fake else plan.all_groups(name)
        for ranks in candidates:
            pg = dist.new_group(ranks)
            if ranks == mine:
                groups[name] = pg
    if plan.cp > 1:  # context parallelism: consecutive ranks of the data dimension (with_cp)
        mine = plan.group_ranks("cp", rank)
        if plan.cp == plan.world_size:
            groups["cp"] = dist.group.WORLD
        for ranks in ([mine] if fake else plan.all_groups("cp")) if plan.cp < plan.world_size else []:
            pg = dist.new_group(ranks)
            if ranks == mine:
                groups["cp"] = pg
    return groups

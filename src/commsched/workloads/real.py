"""Run zoo steps on real tensors: on one rank unsharded (the reference) or on a real gloo process group.

The reference of a sharded step is the same model with ``parallel="none"`` fed each data-parallel replica's batch;
:func:`expected_rank_outputs` maps it onto what one rank's ``StepProgram.step`` must return (its loss, its gradient
shards of the replica-averaged gradients, its slice of the logits), so a real run can be checked number for number.
A step with an optimizer also updates its parameters in place: a real run returns them after the step's outputs, and
their reference is ``torch.optim.AdamW`` applied to the unsharded model with the replica-averaged gradients.
"""

from __future__ import annotations

import dataclasses
import math
import os
import tempfile
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import torch

from commsched.io import free_port
from commsched.workloads.context_parallel import head_tail_positions
from commsched.workloads.optimizer import reference_adamw, reference_clip
from commsched.workloads.params import init_full_params, shard_for_rank
from commsched.workloads.program import StepProgram, WorkloadSpec, resolve


def single_rank_spec(spec: WorkloadSpec) -> WorkloadSpec:
    """The same model, step and shapes with no parallelism (world size 1)."""
    return resolve(spec.model, parallel="none", world_size=1, **spec.step_options())


def reference_outputs(spec: WorkloadSpec, *, seed: int = 0) -> dict[str, Any]:
    """Unsharded results of every data-parallel replica of ``spec``: ``losses`` / ``logits`` per replica and, in
    training, ``grads`` (name -> gradient averaged over replicas, as data parallelism averages them; clipped by
    ``torch.nn.utils.clip_grad_norm_`` under ``max_norm``), with an
    optimizer ``params`` (name -> the parameter after ``torch.optim.AdamW`` with those gradients), and under context
    parallelism ``cp_losses`` (per replica, per CP rank: the mean loss over that rank's head-tail positions, the
    labels elsewhere ignored by the cross-entropy)."""
    # each replica's step up to its gradients (the optimizer is applied to their mean below)
    one = dataclasses.replace(single_rank_spec(spec), optimizer="none", max_norm=None)
    program = StepProgram(one, groups={}, rank=0)  # "none" issues no collective
    full = init_full_params(spec.model, seed=seed)
    replicas = spec.plan.data_parallel_degree
    names = [p.name for p in program.spec.layout]
    out: dict[str, Any] = {"losses": [], "logits": [], "grads": {}, "cp_losses": []}
    cp = spec.plan.cp
    for r in range(replicas):
        inputs = program.real_inputs(seed=seed, full_params=full, replica=r)
        if spec.train and cp > 1:
            at = program.input_names.index("labels")
            labels = inputs[at]
            losses = []
            for c in range(cp):
                mine = head_tail_positions(labels.shape[1], cp, c)
                only = torch.full_like(labels, -100)  # F.cross_entropy's ignore_index
                only[:, mine] = labels[:, mine]
                losses.append(program.step(*inputs[:at], only, *inputs[at + 1 :])[0].detach())
            out["cp_losses"].append(losses)
        result = program.step(*inputs)
        if spec.train:
            out["losses"].append(result[0].detach())
            for name, g in zip(names, result[1:], strict=True):
                out["grads"][name] = out["grads"].get(name, 0) + g.detach() / replicas
        else:
            out["logits"].append(result[0].detach())
    if spec.train and spec.max_norm is not None:  # torch's clip_grad_norm_ of the averaged gradients
        out["grads"] = reference_clip(out["grads"], spec.max_norm)
    if spec.optimizer != "none":
        out["params"] = reference_adamw(spec.optimizer, full, out["grads"])
    return out


def expected_rank_outputs(spec: WorkloadSpec, rank: int, reference: dict[str, Any]) -> list[torch.Tensor]:
    """What ``StepProgram(spec, groups, rank).step(*real_inputs(seed))`` returns when the parallel step is right.
    Under context parallelism a rank's loss is the mean over its own tokens (``cp_losses``; the CP group's mean is
    the replica's loss); a prefill's logits are CP rank 0's (it holds the last position)."""
    plan = spec.plan
    replica = rank // (plan.tp * plan.cp)
    if spec.train:
        grads = [shard_for_rank(p, reference["grads"][p.name], plan, rank) for p in spec.layout]
        loss = reference["cp_losses"][replica][plan.coords(rank)["cp"]] if plan.cp > 1 else reference["losses"][replica]
        updated = reference.get("params", {}) if spec.optimizer != "none" else {}
        params = [shard_for_rank(p, updated[p.name], plan, rank) for p in spec.layout if updated]
        return [loss, *grads, *params]
    logits = reference["logits"][replica]
    if plan.tp == 1:
        return [logits]
    batch, vocab = logits.shape
    rows = next(p for p in spec.layout if p.key == "output").local_shape[0]
    padded = torch.cat([logits, logits.new_zeros(batch, rows * plan.tp - vocab)], dim=1)
    # the gathered logits are rank-major: [tp * batch, vocab / tp]
    return [padded.view(batch, plan.tp, rows).transpose(0, 1).reshape(plan.tp * batch, rows)]


def unshard(spec: WorkloadSpec, per_rank: Sequence[Sequence[torch.Tensor]]) -> dict[str, torch.Tensor]:
    """The unsharded tensors (name -> full shape) of per-rank shards (``per_rank[rank]``: one per parameter, in
    ``spec.layout`` order, as the rank stores it): each element from the last rank that stores it (replicas hold the
    same), the FSDP and vocabulary padding dropped. The inverse of :func:`shard_for_rank`, found by sharding the
    elements' indices."""
    out = {}
    for pid, p in enumerate(spec.layout):
        numel = math.prod(p.full_shape)
        index = torch.arange(1, numel + 1, dtype=torch.float64).view(p.full_shape)  # 0: padding
        full = torch.zeros(numel, dtype=per_rank[0][pid].dtype)
        for rank, shards in enumerate(per_rank):
            where = shard_for_rank(p, index, spec.plan, rank).reshape(-1).long()
            kept = where > 0
            full[where[kept] - 1] = shards[pid].reshape(-1)[kept]
        out[p.name] = full.view(p.full_shape)
    return out


def _worker(rank: int, world_size: int, port: int, specs: Sequence[WorkloadSpec], seed: int, out_dir: str) -> None:
    import torch.distributed as dist

    from commsched.workloads.mesh import create_groups

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world_size)
    try:
        results = []
        for spec in specs:
            program = StepProgram(spec, create_groups(spec.plan, rank), rank)
            inputs = program.real_inputs(seed=seed)
            outputs = program.step(*inputs)
            if spec.optimizer != "none":  # the parameters it updated in place
                outputs = [*outputs, *inputs[: program.n_params]]
            results.append([t.detach().clone() for t in outputs])
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
    finally:
        dist.destroy_process_group()


def run_on_gloo(specs: Sequence[WorkloadSpec], *, seed: int = 0) -> list[list[list[torch.Tensor]]]:
    """Run each spec's step on a real gloo process group of its world size (one process per rank, all specs in
    one launch, which needs a common world size). Returns ``[spec][rank] -> step outputs`` (with an optimizer, then
    the updated parameters). For tests and real
    checks of tiny models on CPU: use ``attention="sdpa"`` (the flash op has no CPU kernel)."""
    import torch.multiprocessing as mp

    worlds = {s.plan.world_size for s in specs}
    if len(worlds) != 1:
        raise ValueError(f"run_on_gloo runs specs of one world size per launch; got {sorted(worlds)}")
    for s in specs:
        if s.attention != "sdpa":
            raise ValueError(f"{s.model.name}/{s.plan.parallel}: real CPU runs need attention='sdpa'")
    world = worlds.pop()
    with tempfile.TemporaryDirectory() as d:
        mp.start_processes(_worker, args=(world, free_port(), list(specs), seed, d), nprocs=world, start_method="spawn")
        per_rank = [torch.load(Path(d) / f"rank{r}.pt", weights_only=True) for r in range(world)]
    return [[per_rank[r][k] for r in range(world)] for k in range(len(specs))]

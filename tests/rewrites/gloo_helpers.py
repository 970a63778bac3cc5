"""Check a rewrite on real gloo ranks: every rank traces a zoo step, rewrites it, and runs both modules on its own
real inputs; the caller compares the outputs bit for bit.

Each rank traces for itself (on fake tensors, with the real process group initialised), so the traced group names
are the real ones and no retargeting is needed. (``commsched.runtime`` solves the general problem of running a
GraphModule traced elsewhere; this helper stays local to the rewrites' checks.)
"""

from __future__ import annotations

import os
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import torch
import torch.fx

RewriteFn = Callable[[Any, str], torch.fx.GraphModule]


def _bucket(workload, hardware: str) -> torch.fx.GraphModule:
    from commsched.rewrites.bucket_plan import BucketConfig
    from commsched.rewrites.bucketing import bucket_collectives

    # the overlap estimate may keep everything apart on a tiny model: bucket every eligible run for the check
    res, plan = bucket_collectives(
        workload.graph_module, hardware, graph=workload.graph, config=BucketConfig(overlap_aware=False)
    )
    if not plan.merged:
        raise RuntimeError("the bucket plan merged nothing: the check would prove nothing")
    return res.gm


def _lower(workload, hardware: str) -> torch.fx.GraphModule:
    from commsched.rewrites.lower_all_reduce import lower_all_reduces

    res = lower_all_reduces(workload.graph_module, hardware, graph=workload.graph)
    if not res.changed:
        raise RuntimeError("the lowering changed nothing: the check would prove nothing")
    return res.gm


def _fsdp2_case(opts: dict[str, Any]) -> tuple[list[torch.Tensor], list[torch.Tensor]]:
    """Eager FSDP2 (the reference) and its traced, rewritten step, on this rank of the real process group."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from commsched.rewrites.fsdp_trace import fsdp2_passes, shard_mlp, tiny_mlp, trace_fsdp2_step

    mesh = init_device_mesh("cpu", (dist.get_world_size(),))
    model = shard_mlp(tiny_mlp(), mesh, mixed_precision=opts.get("mixed_precision", False))
    params = list(model.parameters())

    def loss_fn(m, x):
        return m(x).float().pow(2).mean()

    x = torch.randn(4, 16, generator=torch.Generator().manual_seed(100 + dist.get_rank()))
    gm = trace_fsdp2_step(model, loss_fn, x)
    new = fsdp2_passes(gm)
    loss = loss_fn(model, x)
    loss.backward()
    before = [loss.detach().clone(), *[p.grad.to_local().detach().clone() for p in params]]
    with torch.no_grad():
        after = [t.detach().clone() for t in new(x)]
    return before, after


def _decompose_tp(workload, hardware: str) -> torch.fx.GraphModule:
    from commsched.rewrites.decompose_tp import TPSplit, decompose_tp, find_tp_sites

    # every TP site split in two (reductions along the dim the hardware string names: "m" or "n")
    sites = find_tp_sites(workload.graph_module)
    dim = hardware if hardware in ("m", "n") else "m"
    splits = [TPSplit(s.collective, "m" if s.pattern == "ag_mm" else dim, 2) for s in sites]
    res = decompose_tp(workload.graph_module, splits, graph=workload.graph)
    if not res.changed:
        raise RuntimeError("decompose_tp changed nothing: the check would prove nothing")
    return res.gm


def _split_batch(workload, hardware: str) -> torch.fx.GraphModule:
    from commsched.rewrites.split_batch import split_zoo_step

    return split_zoo_step(workload.spec).gm  # retraced on this rank, like the step itself


def _split_sequence(workload, hardware: str) -> torch.fx.GraphModule:
    from commsched.rewrites.split_sequence import split_zoo_sequence

    return split_zoo_sequence(workload.spec, 2).gm  # retraced on this rank, like the step itself


def _reuse_gathers(workload, hardware: str) -> torch.fx.GraphModule:
    from commsched.rewrites.reuse_gathers import find_regathers, reuse_gathers

    runs = find_regathers(workload.graph_module)
    if not runs:
        raise RuntimeError("no re-gather to drop: the check would prove nothing")
    return reuse_gathers(workload.graph_module, [r.backward for run in runs for r in run]).gm


# "fsdp2" runs torch's fully_shard on a tiny MLP (eager FSDP2 against its traced, rewritten step)
REWRITES: dict[str, RewriteFn | None] = {
    "bucket": _bucket,
    "lower_all_reduce": _lower,
    "decompose_tp": _decompose_tp,
    "split_batch": _split_batch,
    "split_sequence": _split_sequence,
    "reuse_gathers": _reuse_gathers,
    "fsdp2": None,
}


Case = tuple[str, dict[str, Any], str, str]  # (preset, build options, rewrite, hardware profile)


def _worker(rank: int, world: int, port: int, cases: Sequence[Case], seed: int, out_dir: str) -> None:
    import torch.distributed as dist

    from commsched.workloads import build
    from commsched.workloads.mesh import create_groups
    from commsched.workloads.program import StepProgram

    os.environ["MASTER_ADDR"], os.environ["MASTER_PORT"] = "127.0.0.1", str(port)
    dist.init_process_group("gloo", rank=rank, world_size=world)
    try:
        results = []
        for preset, opts, rewrite, hw in cases:
            if rewrite == "fsdp2":  # torch's own fully_shard on the preset "tiny-mlp"
                results.append(_fsdp2_case(opts))
                continue
            w = build(preset, world_size=world, **opts)
            new = REWRITES[rewrite](w, hw)
            program = StepProgram(w.spec, create_groups(w.spec.plan, rank), rank)
            inputs = program.real_inputs(seed=seed)
            with torch.no_grad():
                before = [t.detach().clone() for t in w.graph_module(*inputs)]
                after = [t.detach().clone() for t in new(*inputs)]
            results.append((before, after))
        torch.save(results, Path(out_dir) / f"rank{rank}.pt")
        dist.barrier()  # nobody tears down while a peer still talks (gloo aborts a rank whose peer closed first)
    finally:
        dist.destroy_process_group()


def compare_on_gloo(
    cases: Sequence[Case], *, world_size: int = 2, seed: int = 0
) -> list[list[tuple[list[torch.Tensor], list[torch.Tensor]]]]:
    """For each ``(preset, build options, rewrite, hardware)``: ``[case][rank] -> (outputs before, outputs after)``
    of the step traced on every rank and rewritten with ``REWRITES[rewrite]`` (planned for the hardware profile),
    run on real gloo ranks in one launch. Build options must include ``parallel`` and should set
    ``attention="sdpa"`` (the flash kernel has no CPU implementation)."""
    import torch.multiprocessing as mp

    from commsched.io import free_port

    for _, _, rewrite, _ in cases:
        if rewrite not in REWRITES:
            raise ValueError(f"unknown rewrite {rewrite!r}: expected one of {', '.join(REWRITES)}")
    with tempfile.TemporaryDirectory() as d:
        try:
            mp.start_processes(
                _worker, args=(world_size, free_port(), list(cases), seed, d), nprocs=world_size, start_method="spawn"
            )
        except mp.ProcessExitedException:
            # gloo can still abort a rank while tearing down, after every rank saved its results; a failure before
            # that leaves a file missing, and this raises
            if not all((Path(d) / f"rank{r}.pt").exists() for r in range(world_size)):
                raise
        per_rank = [torch.load(Path(d) / f"rank{r}.pt", weights_only=True) for r in range(world_size)]
    return [[per_rank[r][k] for r in range(world_size)] for k in range(len(cases))]


def assert_outputs_match(labels: Sequence[str], results: list, rtol: float = 1e-4, atol: float = 1e-5) -> None:
    """Every case's rewritten step gives each rank's outputs of the original (same dtype and shape, equal to the
    tolerance), and the original did real work (some output is non-zero). ``results``: :func:`compare_on_gloo`'s."""
    for label, per_rank in zip(labels, results, strict=True):
        for rank, (before, after) in enumerate(per_rank):
            assert len(before) == len(after) >= 1, label
            for k, (a, b) in enumerate(zip(before, after, strict=True)):
                assert a.dtype == b.dtype and a.shape == b.shape, f"{label} rank {rank} output {k}"
                torch.testing.assert_close(a, b, rtol=rtol, atol=atol, msg=f"{label} rank {rank} output {k}")
            assert any(t.abs().sum() > 0 for t in before), label

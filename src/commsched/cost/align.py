"""Cross-rank alignment: every rank schedules from the same estimates.

Estimates can differ per rank (measured tables, noisy calibration, a rank-dependent ``estimate`` callable); a
schedule that differs per rank can reorder collectives differently and deadlock. As the seed's
``align_runtime_estimations_across_all_distributed_ranks`` does, take the per-node median over ranks.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from typing import Any

import numpy as np

from commsched.cost.model import CostEstimate


def median_across_ranks(per_rank: Sequence[np.ndarray]) -> np.ndarray:
    """The per-node median of equally long per-rank arrays; ValueError when lengths differ."""
    if not per_rank:
        raise ValueError("median_across_ranks: no per-rank estimates given")
    lengths = {len(a) for a in per_rank}
    if len(lengths) != 1:
        raise ValueError(f"per-rank estimates have different lengths {sorted(lengths)}: the graphs differ across ranks")
    return np.median(np.stack([np.asarray(a, np.float64) for a in per_rank]), axis=0)


def align_across_ranks(est: CostEstimate, group: Any = None) -> CostEstimate:
    """The estimate with ``node_s`` and ``coll_latency_s`` replaced by their median over the ranks of ``group``
    (``torch.distributed``'s default group when None). Without an initialised process group, ``est`` itself."""
    import torch
    import torch.distributed as dist

    if not dist.is_available() or not dist.is_initialized():
        return est
    world = dist.get_world_size(group)
    if world == 1:
        return est
    local = torch.from_numpy(np.concatenate([est.node_s, est.coll_latency_s]).astype(np.float64))
    n = torch.tensor([local.numel()], dtype=torch.int64)
    sizes = [torch.zeros_like(n) for _ in range(world)]
    dist.all_gather(sizes, n, group=group)
    if len({int(s) for s in sizes}) != 1:
        raise ValueError(f"ranks estimate graphs of different sizes {sorted({int(s) // 2 for s in sizes})}")
    gathered = [torch.empty_like(local) for _ in range(world)]
    dist.all_gather(gathered, local, group=group)
    med = median_across_ranks([t.numpy() for t in gathered])
    k = len(est.node_s)
    latency = np.minimum(med[k:], med[:k])
    return dataclasses.replace(est, node_s=med[:k], coll_latency_s=latency, meta={**est.meta, "aligned_ranks": world})

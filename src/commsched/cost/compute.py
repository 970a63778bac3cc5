"""Roofline kernel times, vectorised over nodes.

time = launch + max(flops / (peak[dtype] x eff_compute), bytes / (bandwidth x eff_memory)), where

* ``eff_compute`` for a GEMM is the profile's best matmul efficiency times a shape term: the best over the tile
  shapes the library picks from of (tile fill x wave quantization over the SMs), times K / (K + k_half) for the
  main loop's prologue and epilogue. Small or skinny GEMMs fall well below peak; large square ones approach it.
* ``eff_compute`` for attention: the same wave term over (batch x heads x query blocks), and the KV length in
  place of K; a causal pass (the graph marks it) takes :func:`causal_fraction` of the full pass's time.
* ``eff_memory = eff_max x bytes / (bytes + memory_half_bytes)``: a kernel moving few bytes cannot keep enough
  requests in flight to reach the bandwidth (Little's law); this is an efficiency curve in size, equivalently a
  latency of ``memory_half_bytes / bandwidth``. A profile may add a cache level (``cache_bytes``,
  ``cache_bandwidth``) for kernels small enough to stay in it (CPUs: calibration fits it).
"""

from __future__ import annotations

import functools
import heapq
import math

import numpy as np

from commsched.cost.opclass import OpClass
from commsched.hardware import Hardware


def memory_efficiency(nbytes: np.ndarray, eff_max: float | np.ndarray, half_bytes: float) -> np.ndarray:
    nbytes = np.asarray(nbytes, np.float64)
    return eff_max * nbytes / (nbytes + half_bytes) if half_bytes > 0 else np.full_like(nbytes, eff_max)


def memory_time(nbytes: np.ndarray, eff_max: float | np.ndarray, hw: Hardware) -> np.ndarray:
    """Seconds to move ``nbytes`` through memory (0 for 0 bytes): HBM, or the cache level for small kernels."""
    c = hw.compute
    nbytes = np.asarray(nbytes, np.float64)
    bw = c.hbm_bandwidth_bytes_per_s
    if c.cache_bytes > 0:
        bw = np.where(nbytes <= c.cache_bytes, c.cache_bandwidth_bytes_per_s, bw)
    eff = np.maximum(memory_efficiency(nbytes, eff_max, c.memory_half_bytes), 1e-12)
    return np.where(nbytes > 0, nbytes / (bw * eff), 0.0)


def gemm_shape_efficiency(m: np.ndarray, n: np.ndarray, k: np.ndarray, batch: np.ndarray, hw: Hardware) -> np.ndarray:
    """Fraction of the best matmul efficiency a (batch x M x N x K) GEMM reaches: tiles, waves and K depth."""
    m, n, k, batch = (np.maximum(np.asarray(a, np.float64), 1.0) for a in (m, n, k, batch))
    units = float(hw.compute.num_units)
    best = np.zeros_like(m)
    for tm, tn, rel in hw.compute.matmul_tiles:
        tiles_m, tiles_n = np.ceil(m / tm), np.ceil(n / tn)
        fill = (m * n) / (tiles_m * tm * tiles_n * tn)
        tiles = tiles_m * tiles_n * batch
        waves = np.ceil(tiles / units)
        best = np.maximum(best, rel * fill * tiles / (waves * units))
    k_half = hw.compute.matmul_k_half
    return best * (k / (k + k_half) if k_half > 0 else 1.0)


def attention_shape_efficiency(
    batch_heads: np.ndarray, q_len: np.ndarray, kv_len: np.ndarray, hw: Hardware
) -> np.ndarray:
    """Fraction of the best attention efficiency: waves over (batch x heads x query blocks), KV depth."""
    bh, q, kv = (np.maximum(np.asarray(a, np.float64), 1.0) for a in (batch_heads, q_len, kv_len))
    tile = float(hw.compute.attention_tile)
    units = float(hw.compute.num_units)
    blocks = np.ceil(q / tile)
    fill = q / (blocks * tile)
    tiles = blocks * bh
    waves = np.ceil(tiles / units)
    k_half = hw.compute.matmul_k_half
    return fill * tiles / (waves * units) * (kv / (kv + k_half) if k_half > 0 else 1.0)


ATTENTION_CTAS_PER_SM = {False: 2, True: 1}
"""Flash attention CTAs resident per SM, forward (False) and backward (True): the fit, among one or two, to the causal /
full ratios measured on one H100 (benchmarks/RESULTS.md, "flash attention, causal and not")"""


@functools.lru_cache(maxsize=4096)
def causal_fraction(batch_heads: int, q_blocks: int, kv_blocks: int, units: int, backward: bool) -> float:
    """Causal / full time of a flash attention pass: its CTAs start in grid order, each on the first free place of
    ``units x ATTENTION_CTAS_PER_SM``; a full one runs ``kv_blocks`` blocks, a causal one those its query block
    sees (bottom-right aligned). The forward's CTAs go by query block, the backward's by KV block, longest first.

    Few CTAs (a TP rank's heads) fit in one wave, where the longest one sets the time and a mask saves nothing in
    the forward; many CTAs share the places and it saves up to half. O(J log J) for J CTAs, cached per shape."""
    slots = units * ATTENTION_CTAS_PER_SM[backward]
    seen = [min(kv_blocks, max(1, kv_blocks - q_blocks + m + 1)) for m in range(q_blocks)]
    jobs = sorted(seen, reverse=True) if backward else seen
    if batch_heads * q_blocks > 200_000:  # beyond that the tail is noise: the balanced bound
        full = math.ceil(batch_heads * q_blocks / slots) * kv_blocks
        return min(1.0, max(sum(seen) * batch_heads / slots, max(seen)) / full)

    def makespan(sizes: list[int]) -> int:
        free = [0] * slots
        for _ in range(batch_heads):
            for size in sizes:
                heapq.heappush(free, heapq.heappop(free) + size)
        return max(free)

    return makespan(jobs) / makespan([kv_blocks] * q_blocks)


def causal_attention_factor(gemm: np.ndarray, backward: np.ndarray, hw: Hardware) -> np.ndarray:
    """:func:`causal_fraction` per attention node (rows of ``gemm``: batch x heads, query length, KV length)."""
    tile = float(hw.compute.attention_tile)
    units = int(hw.compute.num_units)
    out = np.ones(len(gemm))
    for j, ((bh, q, kv), bwd) in enumerate(zip(gemm[:, :3].tolist(), backward.tolist())):
        out[j] = causal_fraction(int(bh), math.ceil(q / tile), math.ceil(kv / tile), units, bool(bwd))
    return out


def kernel_times(
    cls: np.ndarray,
    flops: np.ndarray,
    nbytes: np.ndarray,
    peak_flops: np.ndarray,
    shape_eff: np.ndarray,
    hw: Hardware,
) -> np.ndarray:
    """Roofline seconds per node (0 for FREE and COLLECTIVE classes, which are timed elsewhere).

    ``shape_eff``: the GEMM / attention shape term per node (1 where it does not apply).
    """
    c = hw.compute
    eff = c.efficiency
    compute_eff = np.select(
        [cls == OpClass.MATMUL, cls == OpClass.ATTENTION], [eff.matmul, eff.attention], default=eff.matmul
    ) * np.maximum(shape_eff, 1e-6)
    mem_eff_max = np.where(cls == OpClass.REDUCTION, eff.reduction, eff.elementwise)
    t_compute = np.divide(flops, peak_flops * compute_eff, out=np.zeros(len(cls)), where=flops > 0)
    t_memory = memory_time(nbytes, mem_eff_max, hw)
    t = c.launch_overhead_s + np.maximum(t_compute, t_memory)
    return np.where((cls == OpClass.FREE) | (cls == OpClass.COLLECTIVE), 0.0, t)


def gemm_dims(target: str, shape: tuple[int, ...], flops: float) -> tuple[float, float, float, float]:
    """(M, N, K, batch) of a GEMM-like node from its first output's shape and its flop count."""
    if not shape:
        return 1.0, 1.0, max(flops / 2.0, 1.0), 1.0
    if "conv" in target and len(shape) >= 3:
        # output [N, C, *spatial]: an implicit GEMM with M = N x spatial, N = C
        m = float(shape[0] * math.prod(shape[2:]))
        n = float(shape[1])
        batch = 1.0
    elif len(shape) == 1:
        m, n, batch = 1.0, float(shape[0]), 1.0
    else:
        m, n = float(shape[-2]), float(shape[-1])
        batch = float(math.prod(shape[:-2])) if len(shape) > 2 else 1.0
    denom = 2.0 * m * n * batch
    k = flops / denom if denom > 0 else 1.0
    return m, n, max(k, 1.0), batch


def attention_dims(target: str, input_shapes: list[tuple[int, ...]], flops: float) -> tuple[float, float, float, float]:
    """(batch x heads, query length, KV length, flops) of an attention node from its [B, H, S, D] tensor inputs.

    When the graph has no flop count (e.g. the CPU flash kernels have no formula in torch's flop counter), the flops
    are derived: 4 x B x H x Sq x Skv x D forward (two GEMMs), 2.5x that backward.
    """
    four = [s for s in input_shapes if len(s) == 4]
    if not four:
        return 1.0, 1.0, 1.0, flops
    b, h, q, d = (float(x) for x in four[0])
    kv = float(max(s[2] for s in four))
    if flops <= 0:
        flops = 4.0 * b * h * q * kv * d * (2.5 if "backward" in target else 1.0)
    return b * h, q, kv, flops

"""Roofline kernel times, vectorised over nodes.

time = launch + max(flops / (peak[dtype] x eff_compute), bytes / (bandwidth x eff_memory)), where

* ``eff_compute`` for a GEMM is the profile's best matmul efficiency times a shape term: the best over the tile
  shapes the library picks from, and over split-K where the grid leaves SMs idle, of (tile fill x wave quantization
  over the SMs), times K / (K + k_half) for the main loop's prologue and epilogue (K of one split). Small or skinny
  GEMMs fall well below peak; large square ones approach it. A matmul's memory term ramps up with its own
  ``matmul_memory_half_bytes`` (a few tokens against a weight stream it slower than a copy).
* ``eff_compute`` for an attention forward: its CTAs as FlashAttention-2 launches them (split along the KV range
  when few query blocks would leave SMs idle; a decode's query heads that share a KV head as rows of that head),
  each the blocks of the (bottom-right causal) mask it sees, two per SM, one alone on its SM faster
  (:func:`forward_attention_efficiency`); times the KV length's K-depth term; a split pass also pays its combine
  kernel (:func:`forward_attention_extra_s`). For a
  backward: the GEMM wave term over (batch x heads x query blocks), the KV length in place of K, times
  FLASH_BACKWARD_RATE (a GPU kernel's backward is slower per flop than its forward), and a causal pass
  (the graph marks it) takes :func:`causal_fraction` of the full pass's time.
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


def memory_efficiency(nbytes: np.ndarray, eff_max: float | np.ndarray, half_bytes: float | np.ndarray) -> np.ndarray:
    nbytes = np.asarray(nbytes, np.float64)
    half = np.asarray(half_bytes, np.float64)
    ramp = np.divide(nbytes, nbytes + half, out=np.ones(np.broadcast(nbytes, half).shape), where=half > 0)
    return eff_max * ramp


def memory_time(nbytes: np.ndarray, eff_max: float | np.ndarray, hw: Hardware,
                half_bytes: float | np.ndarray | None = None) -> np.ndarray:  # fmt: skip
    """Seconds to move ``nbytes`` through memory (0 for 0 bytes): HBM, or the cache level for small kernels;
    ``half_bytes`` (default the profile's ``memory_half_bytes``) where the bandwidth reaches half."""
    c = hw.compute
    nbytes = np.asarray(nbytes, np.float64)
    bw = c.hbm_bandwidth_bytes_per_s
    if c.cache_bytes > 0:
        bw = np.where(nbytes <= c.cache_bytes, c.cache_bandwidth_bytes_per_s, bw)
    half = c.memory_half_bytes if half_bytes is None else half_bytes
    eff = np.maximum(memory_efficiency(nbytes, eff_max, half), 1e-12)
    return np.where(nbytes > 0, nbytes / (bw * eff), 0.0)


SPLIT_K = (1, 2, 4, 8, 16, 32, 64)
"""the split-K factors a GEMM library may cut K into when its grid leaves SMs idle (cuBLAS's split-K / stream-K)"""
SPLIT_K_MIN = 1024.0
"""the least K a split keeps: the fit (256 / 512 / 1024, with the profile's matmul_memory_half_bytes; least squared
log error) to the 40 Llama 3 8B-shaped matmuls of benchmarks/data/gpu_decode_h200.csv (1-512 tokens against
the TP 8 and TP 1 weights); 512 came within 8 % of its error. Held out: the 30 70B-shaped ones"""


def gemm_shape_efficiency(m: np.ndarray, n: np.ndarray, k: np.ndarray, batch: np.ndarray, hw: Hardware) -> np.ndarray:
    """Fraction of the best matmul efficiency a (batch x M x N x K) GEMM reaches: tiles, waves and K depth."""
    m, n, k, batch = (np.maximum(np.asarray(a, np.float64), 1.0) for a in (m, n, k, batch))
    units = float(hw.compute.num_units)
    k_half = hw.compute.matmul_k_half
    best = np.zeros_like(m)
    for tm, tn, rel in hw.compute.matmul_tiles:
        tiles_m, tiles_n = np.ceil(m / tm), np.ceil(n / tn)
        fill = (m * n) / (tiles_m * tm * tiles_n * tn)
        tiles = tiles_m * tiles_n * batch
        for split in SPLIT_K:
            # split-K: a grid that leaves SMs idle also cuts K, each split at least SPLIT_K_MIN deep
            ok = (split == 1) | ((tiles < units) & (k / split >= SPLIT_K_MIN))
            waves = np.ceil(tiles * split / units)
            depth = k / split
            eff = rel * fill * tiles * split / (waves * units) * (depth / (depth + k_half) if k_half > 0 else 1.0)
            best = np.where(ok, np.maximum(best, eff), best)
    return best


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


FLASH_BACKWARD_RATE = 0.86
"""a GPU flash attention backward's rate per counted flop over its forward's (same shape, same efficiency entry):
FlashAttention-2 on H100, head dim 128, no mask, 8k-16k tokens: forward 370, backward 318-322 TFLOP/s (Shah et al.
2024, "FlashAttention-3", arXiv 2407.08608, Fig. 5a and 6); on A100 forward up to 73 % of peak, backward up to 63 %
(Dao 2023, "FlashAttention-2", arXiv 2307.08691, Sec. 4.1): 0.86 both. Checked, not fitted, on
benchmarks/data/gpu_attention_h100.csv (torch's flash kernel, 1 x 32 x 8192 full: 362 and 308 TFLOP/s, 0.85)"""


def backward_attention_rate(targets: list[str]) -> np.ndarray:
    """FLASH_BACKWARD_RATE for each GPU attention backward target, 1 for a CPU kernel (``*_for_cpu_*``: no
    measurement of its backward)."""
    return np.array([1.0 if "for_cpu" in t else FLASH_BACKWARD_RATE for t in targets])


_MANY_CTAS = 200_000  # beyond that the tail is noise: the balanced bound
_MANY_FORWARD_CTAS = 20_000  # the same for the forward's slower (processor-sharing) schedule: 75 waves on 132 SMs
BACKWARD_CTAS_PER_SM = 1
"""flash attention backward CTAs resident per SM: the fit, among one or two, to the causal / full ratios measured on
one H100 (benchmarks/RESULTS.md, "flash attention, causal and not")"""


@functools.lru_cache(maxsize=4096)
def causal_fraction(batch_heads: int, q_blocks: int, kv_blocks: int, units: int) -> float:
    """Causal / full time of a flash attention backward pass: its CTAs go by KV block, longest first, each to the
    first free place of ``units x BACKWARD_CTAS_PER_SM``; a full one runs ``q_blocks`` blocks, a causal one those
    that see its KV block (bottom-right aligned). (The forward's rule is :func:`forward_attention_efficiency`.)

    Few CTAs (a TP rank's heads) fit in one wave, where the longest one sets the time; many CTAs share the places
    and a mask saves up to half. O(J log J) for J CTAs, cached per shape."""
    slots = units * BACKWARD_CTAS_PER_SM
    seen = [min(kv_blocks, max(1, kv_blocks - q_blocks + m + 1)) for m in range(q_blocks)]
    jobs = sorted(seen, reverse=True)
    if batch_heads * q_blocks > _MANY_CTAS:
        full = math.ceil(batch_heads * q_blocks / slots) * kv_blocks
        return min(1.0, max(sum(seen) * batch_heads / slots, max(seen)) / full)

    def makespan(sizes: list[int]) -> int:
        free = [0] * slots
        for _ in range(batch_heads):
            for size in sizes:
                heapq.heappush(free, heapq.heappop(free) + size)
        return max(free)

    return makespan(jobs) / makespan([kv_blocks] * q_blocks)


def causal_attention_factor(gemm: np.ndarray, hw: Hardware) -> np.ndarray:
    """:func:`causal_fraction` per attention backward node (rows of ``gemm``: batch x heads, query length, KV
    length)."""
    tile = float(hw.compute.attention_tile)
    units = int(hw.compute.num_units)
    out = np.ones(len(gemm))
    for j, (bh, q, kv) in enumerate(gemm[:, :3].tolist()):
        out[j] = causal_fraction(int(bh), math.ceil(q / tile), math.ceil(kv / tile), units)
    return out


LONE_CTA_SPEEDUP = 1.8
"""how much faster a flash attention forward CTA runs alone on its SM than as one of the two that share it: the fit
(1.4-2.0 by 0.1, least squared log error) to the ten forward passes of benchmarks/data/gpu_attention_h100.csv, where
4 heads x 4096 positions (128 CTAs, one per SM) takes 0.31 x the time of 4 x 8192 (256 CTAs, two per SM) for 0.25 x
its work"""
SPLIT_KV_ROWS = 64
"""query rows per CTA of FlashAttention-2's split-KV forward kernel (flash_api.cpp ``set_params_splitkv``)"""
SPLIT_KV_EFFICIENCY = 0.94
"""the split-KV kernel's work rate relative to the standard kernel's (its combine kernel is timed apart,
:func:`forward_attention_extra_s`): the fit (the same mean log error as the same run's unsplit passes, 0.70-1.00
by 0.02) to the four split passes of benchmarks/data/gpu_attention_chunks_h200.csv, the only prompt passes measured
split (2048 queries against 2048-8192 keys, 4 heads), fitted jointly with COMBINE_S_PER_SPLIT (alternately, to a
fixed point)"""


def flash_num_splits(ctas_64: int, slots: int, kv_blocks: int, max_splits: int = 128) -> int:
    """FlashAttention-2's ``num_splits_heuristic`` (flash_api.cpp), which torch's flash forward runs: with fewer
    than 0.8 x ``slots`` (2 per SM) query blocks of 64 rows in the grid, the KV range is cut into the fewest splits
    that reach 85 % of the best wave efficiency."""
    if ctas_64 >= 0.8 * slots:
        return 1
    max_splits = min(max_splits, slots, kv_blocks)

    def eligible(k: int) -> bool:  # a split count that gives the same blocks per split as one fewer is skipped
        return k == 1 or -(-kv_blocks // k) != -(-kv_blocks // (k - 1))

    effs = [0.0] * (max_splits + 1)
    for k in range(1, max_splits + 1):
        if eligible(k):
            waves = ctas_64 * k / slots
            effs[k] = waves / math.ceil(waves)
    best = max(effs)
    return next((k for k in range(1, max_splits + 1) if eligible(k) and effs[k] >= 0.85 * best), 1)


def _forward_ctas(batch_heads: int, q_len: int, kv_len: int, causal: bool, units: int, tile: int) -> list[float]:
    """The work of each CTA of a flash forward, in grid order, in (tile x tile) blocks at the standard kernel's
    rate: the standard kernel's CTAs hold ``tile`` query rows; the split-KV kernel's hold SPLIT_KV_ROWS rows and one
    of the KV ranges. A causal CTA (bottom-right aligned) runs the key blocks its last row sees."""
    kv_blocks = -(-kv_len // tile)
    splits = flash_num_splits(batch_heads * -(-q_len // SPLIT_KV_ROWS), 2 * units, kv_blocks)
    rows = tile if splits == 1 else SPLIT_KV_ROWS
    per_split = -(-kv_blocks // splits)
    unit = rows / tile / (1.0 if splits == 1 else SPLIT_KV_EFFICIENCY)
    one_head = []
    for split in range(splits):
        lo, hi = split * per_split, min(kv_blocks, (split + 1) * per_split)
        for m in range(-(-q_len // rows)):
            seen = min(kv_len, kv_len - q_len + (m + 1) * rows) if causal else kv_len
            one_head.append(max(0, min(hi, -(-max(seen, 0) // tile)) - lo) * unit)
    return one_head * batch_heads


def _shared_makespan(jobs: list[float], units: int) -> float:
    """Makespan of ``jobs`` (work at a shared CTA's rate 1) on ``units`` SMs of 2 places each, dispatched in order
    (a first CTA on each SM, then a second, then each into the place the next finish frees); a CTA alone on its SM
    runs LONE_CTA_SPEEDUP x faster. Event-driven processor sharing, O(J log S)."""
    left: list[list[float]] = [[] for _ in range(units)]  # per SM: the remaining work of its CTAs
    since = [0.0] * units  # per SM: when its remaining work was last brought up to date
    version = [0] * units
    heap: list[tuple[float, int, int]] = []

    def rate(k: int) -> float:
        return LONE_CTA_SPEEDUP if k == 1 else 1.0

    def plan(sm: int, t: float) -> None:
        version[sm] += 1
        if left[sm]:
            heapq.heappush(heap, (t + min(left[sm]) / rate(len(left[sm])), sm, version[sm]))

    for place in range(min(len(jobs), 2 * units)):
        left[place % units].append(jobs[place])
    nxt = min(len(jobs), 2 * units)
    for sm in range(units):
        plan(sm, 0.0)
    end = 0.0
    while heap:
        t, sm, ver = heapq.heappop(heap)
        if ver != version[sm]:
            continue
        done = (t - since[sm]) * rate(len(left[sm]))
        since[sm], end = t, t
        rest = [w - done for w in left[sm]]
        rest.remove(min(rest))
        if nxt < len(jobs):
            rest.append(jobs[nxt])
            nxt += 1
        left[sm] = rest
        plan(sm, t)
    return end


@functools.lru_cache(maxsize=4096)
def forward_attention_efficiency(
    batch_heads: int, q_len: int, kv_len: int, causal: bool, units: int, tile: int
) -> float:
    """Fraction of the attention efficiency a flash forward pass reaches per counted flop (the flops count the
    masked blocks too): its full pass's work spread evenly over every SM at full occupancy, over the makespan of its
    CTAs (:func:`_forward_ctas`, :func:`_shared_makespan`). About 1 for a large full pass, about 2 for a large
    causal one; below 1 where few CTAs leave SMs idle or alone, or the last wave is short. Cached per shape."""
    jobs = _forward_ctas(batch_heads, q_len, kv_len, causal, units, tile)
    ideal = batch_heads * q_len * kv_len / (tile * tile) / (2 * units)  # every place busy at the shared rate
    if len(jobs) > _MANY_FORWARD_CTAS:
        makespan = max(sum(jobs) / (2 * units), max(jobs) / LONE_CTA_SPEEDUP)
    else:
        makespan = _shared_makespan(jobs, units)
    return ideal / makespan if makespan > 0 else 1.0


COMBINE_S_PER_SPLIT = 0.25e-6
"""seconds FlashAttention-2's split-KV combine kernel spends per split on each wave of its CTAs (4 query rows each,
one CTA reading every split's partial output): the fit (0.05-0.40 us by 0.025, least squared log error) to the 18
batch-1 decode passes of benchmarks/data/gpu_decode_h200.csv, where it is most of the time; held out: the 36 at
batch 8 and 32 (benchmarks/RESULTS.md, "A decode step's kernels")"""


def forward_attention_extra_s(gemm: np.ndarray, hw: Hardware) -> np.ndarray:
    """Seconds each flash attention forward spends beyond its main kernel (rows of ``gemm``: batch x heads, query
    length, KV length): where FlashAttention-2 splits the KV range, its combine kernel, one more launch and, per
    wave of its CTAs (4 query rows each), a pass over every split's partial output."""
    c = hw.compute
    out = np.zeros(len(gemm))
    for j, (bh, q, kv) in enumerate(gemm[:, :3].tolist()):
        passes = _combine_passes(max(int(bh), 1), max(int(q), 1), max(int(kv), 1), int(c.num_units), c.attention_tile)
        if passes:
            out[j] = c.launch_overhead_s + COMBINE_S_PER_SPLIT * passes
    return out


@functools.cache
def _combine_passes(batch_heads: int, q_len: int, kv_len: int, units: int, tile: int) -> int:
    """Splits x waves of the combine kernel's CTAs of one flash forward (0: not split). Cached per shape."""
    kv_blocks = -(-kv_len // tile)
    splits = flash_num_splits(batch_heads * -(-q_len // SPLIT_KV_ROWS), 2 * units, kv_blocks)
    if splits == 1:
        return 0
    combine_ctas = -(-batch_heads * q_len // 4)
    return splits * -(-combine_ctas // units)


def forward_attention_factor(gemm: np.ndarray, causal: np.ndarray, hw: Hardware) -> np.ndarray:
    """Shape term of each flash attention forward (rows of ``gemm``: batch x heads, query length, KV length):
    :func:`forward_attention_efficiency` times the KV depth's K / (K + k_half) term, as a GEMM's."""
    c = hw.compute
    out = np.ones(len(gemm))
    for j, ((bh, q, kv), is_causal) in enumerate(zip(gemm[:, :3].tolist(), causal.tolist())):
        out[j] = forward_attention_efficiency(
            max(int(bh), 1), max(int(q), 1), max(int(kv), 1), bool(is_causal), int(c.num_units), int(c.attention_tile)
        )
        if c.matmul_k_half > 0:
            out[j] *= kv / (kv + c.matmul_k_half)
    return out


def runs_power_saturated(targets: list[str]) -> bool:
    """Whether a graph is a training step (it has a backward op): seconds of back-to-back GEMMs hold the GPU at its
    power limit, where its clock sits below the boost a lone kernel or a decode step runs at (the profile's
    ``sustained_matmul``, from sustained and burst GEMM rates measured on the same chip)."""
    return any("backward" in t for t in targets)


def kernel_times(
    cls: np.ndarray,
    flops: np.ndarray,
    nbytes: np.ndarray,
    peak_flops: np.ndarray,
    shape_eff: np.ndarray,
    hw: Hardware,
    *,
    sustained: bool = False,
) -> np.ndarray:
    """Roofline seconds per node (0 for FREE and COLLECTIVE classes, which are timed elsewhere).

    ``shape_eff``: the GEMM / attention shape term per node (1 where it does not apply). ``sustained``: the matmuls
    run at the power-limited rate (:func:`runs_power_saturated`).
    """
    c = hw.compute
    eff = c.efficiency
    matmul = eff.matmul * (eff.sustained_matmul if sustained else 1.0)
    compute_eff = np.select(
        [cls == OpClass.MATMUL, cls == OpClass.ATTENTION], [matmul, eff.attention], default=matmul
    ) * np.maximum(shape_eff, 1e-6)
    mem_eff_max = np.where(cls == OpClass.REDUCTION, eff.reduction, eff.elementwise)
    t_compute = np.divide(flops, peak_flops * compute_eff, out=np.zeros(len(cls)), where=flops > 0)
    half = np.where(cls == OpClass.MATMUL, c.matmul_memory_half_bytes or c.memory_half_bytes, c.memory_half_bytes)
    t_memory = memory_time(nbytes, mem_eff_max, hw, half)
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
    kv_heads = float(four[1][1]) if len(four) > 1 else h
    gpu_flash = "flash" in target and "backward" not in target and "for_cpu" not in target
    if gpu_flash and q == 1 and kv_heads < h and h % kv_heads == 0:
        # FlashAttention-2's decode under GQA (flash_api.cpp seqlenq_ngroups_swapped): the query heads that share a
        # KV head become the query rows of one head, so each KV head's cache is read by one CTA row block
        return b * kv_heads, h / kv_heads, kv, flops
    return b * h, q, kv, flops

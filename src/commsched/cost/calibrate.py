"""Calibration: measure this machine's kernels and collectives, fit a profile, keep the raw numbers as a table.

Measured: the per-op launch (dispatch) overhead, matmuls of several shapes, elementwise and reduction kernels over
a range of sizes, attention (``scaled_dot_product_attention``), and, with ``world`` local processes (gloo on the
CPU, NCCL on GPUs), all_reduce / all_gather / reduce_scatter / all_to_all / broadcast over a range of sizes.

Fitted (small grid and 1-D searches, minimising the mean absolute log error, clipped per point, of the roofline
model on the measurements): launch overhead; peak FLOP/s per dtype with the matmul tile size and
``matmul_k_half``; memory and cache bandwidths with ``memory_half_bytes``; reduction and attention efficiencies; the
collective bus bandwidth, the all_to_all efficiency and the protocol latency. The profile's remaining fields (the
network, interference) come from a base profile. The measured collective times also go into a table that the
profile names, so estimates use the measurements themselves where they exist and the fitted model elsewhere.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
import time
from collections.abc import Callable
from dataclasses import dataclass, field

import numpy as np

from commsched.cost.collectives import bus_factor
from commsched.cost.compute import attention_shape_efficiency, gemm_shape_efficiency, memory_efficiency, memory_time
from commsched.cost.table import MeasuredTable
from commsched.hardware import Hardware
from commsched.io import free_port

COLLECTIVE_KINDS = ("all_reduce", "all_gather", "reduce_scatter", "all_to_all", "broadcast")


@dataclass
class Measurements:
    """Raw calibration results (seconds)."""

    device: str
    units: int = 0  # parallel units used: intra-op threads on a CPU, SMs on a GPU (0: unknown)
    launch_s: float = 0.0
    matmul: list[tuple[int, int, int, str, float]] = field(default_factory=list)  # (M, N, K, dtype, s)
    elementwise: list[tuple[int, float]] = field(default_factory=list)  # (bytes moved, s)
    reduction: list[tuple[int, float]] = field(default_factory=list)  # (bytes moved, s)
    attention: list[tuple[int, int, int, int, float]] = field(default_factory=list)  # (B, H, S, D, s)
    collectives: list[tuple[str, int, int, float]] = field(default_factory=list)  # (kind, world, nbytes, s)
    notes: list[str] = field(default_factory=list)


def _timer(device: str) -> Callable[[Callable[[], object], int], float]:
    """A function timing ``fn`` repeated ``reps`` times; returns seconds per call."""
    import torch

    if device.startswith("cuda"):

        def run(fn: Callable[[], object], reps: int) -> float:
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            for _ in range(reps):
                fn()
            end.record()
            end.synchronize()
            return start.elapsed_time(end) * 1e-3 / reps

        return run

    def run_cpu(fn: Callable[[], object], reps: int) -> float:
        t0 = time.perf_counter()
        for _ in range(reps):
            fn()
        return (time.perf_counter() - t0) / reps

    return run_cpu


def _measure(timer: Callable, fn: Callable[[], object], budget_s: float) -> float:
    """Seconds per call of ``fn``: the best of a few batches sized to fit ``budget_s`` (on a shared machine the
    best batch is the one least disturbed by other processes)."""
    fn()
    one = max(timer(fn, 1), 1e-7)
    reps = int(min(max(budget_s / 5 / one, 1), 10000))
    return min(timer(fn, reps) for _ in range(5 if one * reps * 5 <= budget_s * 2 else 3))


def measure_compute(
    device: str = "cpu", *, quick: bool = False, dtypes: tuple[str, ...] = ("float32",), threads: int | None = 1
) -> Measurements:
    """Time launch overhead, matmul, elementwise, reduction and attention kernels on ``device``.

    On the CPU with ``threads`` intra-op threads (None: torch's default). One thread is the default because on a
    shared machine a multi-threaded op waits for busy cores, and times become scheduler noise.
    """
    import torch
    import torch.nn.functional as F

    if not device.startswith("cuda") and threads is not None:
        torch.set_num_threads(threads)
    m = Measurements(device=device)
    if device.startswith("cuda"):
        m.units = torch.cuda.get_device_properties(torch.device(device)).multi_processor_count
    else:
        m.units = torch.get_num_threads()
        m.notes.append(f"intra-op threads: {m.units}")
    timer = _timer(device)
    budget = 0.01 if quick else 0.04
    rounds = 2 if quick else 3
    tiny = torch.ones(1, device=device)
    # (record, measure) pairs; every round measures all of them again and each keeps its best time, so a burst of
    # load from another process spoils one round of a few measurements, not the fit
    jobs: list[tuple[list, tuple, Callable[[], float]]] = []
    jobs.append(([], ("launch",), lambda: _measure(timer, lambda: torch.add(tiny, tiny), budget)))

    sizes = (32, 128, 512) if quick else (32, 64, 128, 256, 512, 1024)
    extra = [(256, 256, 16)] if quick else [(512, 512, 16), (512, 512, 64), (64, 1024, 512), (256, 768, 256),
                                             (256, 256, 1024), (256, 1024, 256), (1024, 256, 256)]  # fmt: skip
    shapes = [(s, s, s) for s in sizes] + extra
    for dtype_name in dtypes:
        dtype = getattr(torch, dtype_name)
        for mm, nn_, kk in shapes if dtype_name == dtypes[0] else shapes[1 : len(sizes)]:
            a = torch.randn(mm, kk, device=device, dtype=dtype)
            b = torch.randn(kk, nn_, device=device, dtype=dtype)
            jobs.append(
                (m.matmul, (mm, nn_, kk, dtype_name), lambda a=a, b=b: _measure(timer, lambda: torch.mm(a, b), budget))
            )

    for numel in [1 << k for k in range(10, 25, 2)]:  # the cache / memory split needs points on both sides
        x = torch.randn(numel, device=device)
        rows = max(numel // 256, 1)
        jobs.append((m.elementwise, (3 * 4 * numel,), lambda x=x: _measure_cold(timer, x, lambda a, b: a + b, budget)))
        jobs.append(
            (m.elementwise, (2 * 4 * numel,), lambda x=x: _measure_cold(timer, x, lambda a, b: a.clone(), budget))
        )
        jobs.append(
            (
                m.reduction,
                (4 * numel + 4 * rows,),
                lambda x=x, r=rows: _measure_cold(timer, x, lambda a, b: a.view(r, -1).sum(-1), budget),
            )
        )
        jobs.append(
            (
                m.reduction,
                (8 * numel,),
                lambda x=x, r=rows: _measure_cold(timer, x, lambda a, b: torch.softmax(a.view(r, -1), -1), budget),
            )
        )

    for s in (128, 256) if quick else (128, 256, 512):
        q = torch.randn(1, 4, s, 64, device=device)
        jobs.append((m.attention, (1, 4, s, 64),
                     lambda q=q: _measure(timer, lambda: F.scaled_dot_product_attention(q, q, q), budget)))  # fmt: skip

    best = [math.inf] * len(jobs)
    for _ in range(rounds):
        for j, (_, _, run) in enumerate(jobs):
            best[j] = min(best[j], run())
    m.launch_s = best[0]
    for (record, key, _), t in zip(jobs[1:], best[1:], strict=True):
        record.append((*key, t))
    return m


def _measure_cold(timer: Callable, like, op: Callable, budget_s: float, pool_bytes: int = 16 << 20) -> float:
    """Seconds per call of ``op(a, b)`` as a graph run sees it: inputs rotate over ``pool_bytes`` of buffers (not in
    cache) and outputs stay alive (fresh allocations, with their page faults on a CPU), freed once per rotation."""
    import torch

    k = max(2, pool_bytes // max(like.numel() * like.element_size(), 1))
    xs = [torch.randn_like(like) for _ in range(k)]
    ys = [torch.randn_like(like) for _ in range(k)]
    state = {"j": 0, "keep": []}

    def call() -> None:
        j = state["j"]
        if j == 0:
            state["keep"] = []
        state["keep"].append(op(xs[j], ys[j]))
        state["j"] = (j + 1) % k

    return _measure(timer, call, budget_s)


# ---------------------------------------------------------------------------------------------------- collectives
def _collective_worker(rank: int, world: int, port: int, backend: str, sizes: list[int], quick: bool, queue) -> None:
    import datetime
    import warnings

    import torch
    import torch.distributed as dist

    warnings.filterwarnings("ignore", category=FutureWarning)  # the *_tensor names work from torch 2.1 on
    torch.set_num_threads(1)
    device = "cpu"
    if backend == "nccl":
        torch.cuda.set_device(rank)
        device = f"cuda:{rank}"
    timer = _timer(device)
    dist.init_process_group(
        backend, init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world,
        timeout=datetime.timedelta(seconds=60),
    )  # fmt: skip
    jobs: list[tuple[str, int, Callable[[], object]]] = []
    failed: list[tuple[str, int, int, str]] = []
    for kind in COLLECTIVE_KINDS:
        for nbytes in sizes:
            numel = max(nbytes // 4 // world * world, world)
            x = torch.ones(numel, device=device)
            if kind == "all_reduce":
                fn = lambda x=x: dist.all_reduce(x)  # noqa: E731
            elif kind == "all_gather":
                shard, out = torch.ones(numel // world, device=device), torch.empty(numel, device=device)
                fn = lambda s=shard, o=out: dist.all_gather_into_tensor(o, s)  # noqa: E731
            elif kind == "reduce_scatter":
                out = torch.empty(numel // world, device=device)
                fn = lambda x=x, o=out: dist.reduce_scatter_tensor(o, x)  # noqa: E731
            elif kind == "all_to_all":
                out = torch.empty(numel, device=device)
                fn = lambda x=x, o=out: dist.all_to_all_single(o, x)  # noqa: E731
            else:
                fn = lambda x=x: dist.broadcast(x, 0)  # noqa: E731
            try:
                fn()  # warm-up (connection setup), and a backend without this collective fails here
            except (RuntimeError, ValueError) as exc:
                failed.append((kind, world, -1, f"{type(exc).__name__}: {str(exc).splitlines()[0][:120]}"))
                break
            jobs.append((kind, numel * 4, fn))
    best = [math.inf] * len(jobs)
    try:
        # every round measures every point again and keeps the best: bursts of load spoil rounds, not the fit
        for _ in range(1 if quick else 2):
            for j, (_, _, fn) in enumerate(jobs):
                for _ in range(3):
                    dist.barrier()
                    best[j] = min(best[j], timer(fn, 2 if quick else 4))
    finally:
        if rank == 0:
            queue.put([(k, world, b, t) for (k, b, _), t in zip(jobs, best, strict=True)] + failed)
        dist.destroy_process_group()


def measure_collectives(
    world: int = 2, *, backend: str = "gloo", quick: bool = False, timeout_s: float = 120.0
) -> Measurements:
    """Time each collective with ``world`` local processes (forked, so the children start in milliseconds)."""
    import multiprocessing as mp

    sizes = [1 << k for k in ((12, 16, 20, 22) if quick else range(12, 25, 2))]
    ctx = mp.get_context("fork" if backend == "gloo" else "spawn")
    queue = ctx.Queue()
    port = free_port()
    procs = [
        ctx.Process(target=_collective_worker, args=(r, world, port, backend, sizes, quick, queue))
        for r in range(world)
    ]
    for p in procs:
        p.start()
    m = Measurements(device=f"{backend} x{world}")
    try:
        rows = queue.get(timeout=timeout_s)
    except Exception:
        rows = None
    for p in procs:
        p.join(timeout=10)
        if p.is_alive():
            p.kill()
            p.join()
    if rows is None:
        raise RuntimeError(
            f"collective calibration with {world} {backend} processes did not finish in {timeout_s:.0f} s"
        )
    for kind, w, nbytes, t in rows:
        if nbytes < 0:
            m.notes.append(f"{kind}: not measured ({t})")
        else:
            m.collectives.append((kind, w, nbytes, float(t)))
    return m


# ---------------------------------------------------------------------------------------------------- fitting
def _log_err(model: np.ndarray, measured: np.ndarray) -> float:
    """Mean absolute log error, each point's error clipped at log(3) so that a few disturbed measurements do not
    drag the fit (a median would be robust too, but is flat once half the points fit, and so ties)."""
    err = np.abs(np.log(np.maximum(model, 1e-15) / np.maximum(measured, 1e-15)))
    return float(np.mean(np.minimum(err, math.log(3.0))))


def _golden(f: Callable[[float], float], lo: float, hi: float, iters: int = 60) -> float:
    """Minimise a unimodal ``f`` over [lo, hi] (log scale)."""
    a, b = math.log(lo), math.log(hi)
    r = (math.sqrt(5) - 1) / 2
    c, d = b - r * (b - a), a + r * (b - a)
    for _ in range(iters):
        if f(math.exp(c)) < f(math.exp(d)):
            b, d = d, c
            c = b - r * (b - a)
        else:
            a, c = c, d
            d = a + r * (b - a)
    return math.exp((a + b) / 2)


# bytes per element of the matmul dtypes the calibration measures
_ITEM_BYTES = {"float64": 8.0, "float32": 4.0, "bfloat16": 2.0, "float16": 2.0}


def _check_inside(field: str, value: float, lo: float, hi: float, unit: str, why: str) -> float:
    """``value`` if a 1-D search over [lo, hi] (log scale) ended inside it; a fit that ends on a bound was not
    constrained by the measurements, so it is an error naming the field (ValueError, one line)."""
    span = math.log(hi / lo)
    if min(math.log(value / lo), math.log(hi / value)) < 0.01 * span:
        raise ValueError(
            f"calibration: {field} = {value:.3g} {unit} is the fit's bound [{lo:g}, {hi:g}], not a measurement "
            f"({why}); nothing was written"
        )
    return value


def fit_profile(
    base: Hardware, m: Measurements, coll: Measurements | None = None, *, name: str | None = None
) -> Hardware:
    """A profile from ``base`` with every measured quantity replaced by its fit (see the module docstring)."""
    c = base.compute if m.units < 1 else dataclasses.replace(base.compute, num_units=m.units)
    launch = m.launch_s

    # memory: cache level, bandwidths and half-saturation bytes from elementwise kernels (efficiency 1)
    eb = np.array([b for b, _ in m.elementwise], float)
    et = np.array([t for _, t in m.elementwise], float)
    best: tuple[float, float, float, float, float] = (math.inf, 0.0, 0.0, 1.0, 0.0)
    for cache in [0.0] + [float(1 << k) for k in range(18, 27)]:
        small = eb <= cache
        if cache and (small.sum() < 3 or (~small).sum() < 3):
            continue  # a cache level needs a few measurements on each side of it
        for half in [0.0] + [float(1 << k) for k in range(10, 22)]:

            def err(bw: float, sel: np.ndarray, half: float = half) -> float:
                return (
                    _log_err(launch + eb[sel] / (bw * memory_efficiency(eb[sel], 1.0, half)), et[sel])
                    if sel.any()
                    else 0.0
                )

            bw_c = _golden(lambda bw, sel=small: err(bw, sel), 1e8, 1e13) if small.any() else 0.0
            bw_h = _golden(lambda bw, sel=~small: err(bw, sel), 1e8, 1e13) if (~small).any() else bw_c
            bw_all = np.where(small, bw_c, bw_h)
            e = _log_err(launch + eb / (bw_all * memory_efficiency(eb, 1.0, half)), et)
            if e < best[0] - 1e-9:
                best = (e, cache if small.any() else 0.0, bw_c, bw_h, half)
    _, cache, bw_c, bw, half = best
    why_bw = "elementwise kernels did not constrain it"
    _check_inside("compute.hbm_bandwidth_bytes_per_s", bw, 1e8, 1e13, "B/s", why_bw)
    if cache:
        _check_inside("compute.cache_bandwidth_bytes_per_s", bw_c, 1e8, 1e13, "B/s", why_bw)
    trial = dataclasses.replace(
        base,
        compute=dataclasses.replace(
            c, launch_overhead_s=launch, hbm_bandwidth_bytes_per_s=bw, memory_half_bytes=half, cache_bytes=cache,
            cache_bandwidth_bytes_per_s=bw_c,
        ),
    )  # fmt: skip
    rb = np.array([b for b, _ in m.reduction], float)
    rt = np.array([t for _, t in m.reduction], float)
    red_eff = _golden(lambda e: _log_err(launch + memory_time(rb, e, trial), rt), 0.01, 1.0)

    # matmul: tile size and K half-depth by grid, peak by 1-D search, per dtype (efficiency 1: peak := achieved)
    peaks = dict(c.peak_flops)
    tiles, k_half = c.matmul_tiles, c.matmul_k_half
    by_dtype: dict[str, list[tuple[int, int, int, float]]] = {}
    for mm, nn_, kk, dt, t in m.matmul:
        by_dtype.setdefault(dt, []).append((mm, nn_, kk, t))
    first = True
    for dt, rows in by_dtype.items():
        arr = np.array(rows, float)
        mm, nn_, kk, t = arr.T
        flops, nbytes = 2 * mm * nn_ * kk, _ITEM_BYTES.get(dt, 4.0) * (mm * kk + kk * nn_ + mm * nn_)
        t_mem = memory_time(nbytes, 1.0, trial)
        grid = [((tile,), kh) for tile in (4, 8, 16, 32, 64, 128) for kh in (0.0, 4.0, 8.0, 16.0, 32.0, 64.0, 128.0)]
        if not first:
            grid = [((tiles[0][0],), k_half)]  # other dtypes share the shape terms of the first
        best_mm: tuple[float, float, tuple, float] = (math.inf, 1.0, (), 0.0)
        for (tile,), kh in grid:
            shaped = dataclasses.replace(
                trial, compute=dataclasses.replace(trial.compute, matmul_tiles=((tile, tile, 1.0),), matmul_k_half=kh)
            )
            shape_eff = gemm_shape_efficiency(mm, nn_, kk, np.ones_like(mm), shaped)

            def err_peak(peak: float, se=shape_eff, fl=flops, tm=t_mem, tt=t) -> float:
                return _log_err(launch + np.maximum(fl / (peak * se), tm), tt)

            peak = _golden(err_peak, 1e8, 1e16)
            e = err_peak(peak)
            if e < best_mm[0]:
                best_mm = (e, peak, ((tile, tile, 1.0),), kh)
        _, peaks[dt], new_tiles, new_kh = best_mm
        why = f"the {dt} matmuls ran no slower than their memory traffic, so they bound no peak"
        _check_inside(f"compute.peak_flops[{dt}]", peaks[dt], 1e8, 1e16, "FLOP/s", why)
        if first:
            tiles, k_half, first = new_tiles, new_kh, False
    if "float32" not in by_dtype:
        peaks.setdefault("float32", c.peak_flops_for("float32"))

    compute = dataclasses.replace(
        trial.compute,
        peak_flops=tuple(sorted(peaks.items())),
        matmul_tiles=tiles,
        matmul_k_half=k_half,
        efficiency=dataclasses.replace(c.efficiency, matmul=1.0, elementwise=1.0, reduction=float(red_eff)),
    )
    if m.attention:
        shaped = dataclasses.replace(trial, compute=compute)
        arr = np.array([(b * h, s_, s_, 4.0 * b * h * s_ * s_ * d, t) for b, h, s_, d, t in m.attention], float)
        shape_eff = attention_shape_efficiency(arr[:, 0], arr[:, 1], arr[:, 2], shaped)
        ratios = arr[:, 3] / np.maximum(arr[:, 4] - launch, 1e-9) / (peaks["float32"] * shape_eff)
        compute = dataclasses.replace(
            compute,
            efficiency=dataclasses.replace(compute.efficiency, attention=float(np.clip(np.median(ratios), 0.01, 1.0))),
        )
    hw = dataclasses.replace(base, name=name or base.name, compute=compute)
    if coll is not None and coll.collectives:
        hw = _fit_collectives(hw, coll)
    return hw


def _fit_collectives(hw: Hardware, m: Measurements) -> Hardware:
    """Ring bus bandwidth and the Simple protocol's base and per-step latency from the measured sweep."""
    rows = [(k, w, b, t) for k, w, b, t in m.collectives if k != "all_to_all"]
    wire = np.array([bus_factor(k, w) * b for k, w, b, _ in rows], float)
    t = np.array([r[3] for r in rows], float)
    steps = np.array([2 * (w - 1) if k == "all_reduce" else w - 1 for k, w, _, _ in rows], float)
    t_min = float(t.min())
    best = (math.inf, 1e9, 0.0, 0.0)
    for base in t_min * np.array([0.1, 0.25, 0.5, 0.75, 1.0]):
        for hop in t_min * np.array([0.0, 0.05, 0.1, 0.25, 0.5]):
            lat = base + steps * hop

            def err(bus: float, lat: np.ndarray = lat) -> float:
                return _log_err(lat + wire / bus, t)

            bus = _golden(err, 1e6, 1e13)
            e = err(bus)
            if e < best[0]:
                best = (e, bus, float(base), float(hop))
    _, bus, base, hop = best
    _check_inside(
        "intra_node.link_bandwidth_bytes_per_s", bus, 1e6, 1e13, "B/s", "the collectives did not constrain it"
    )
    a2a = [(w, b, tt) for k, w, b, tt in m.collectives if k == "all_to_all"]
    a2a_eff = hw.intra_node.all_to_all_efficiency
    if a2a:
        ratios = [bus_factor("all_to_all", w) * b / max(tt - base - (w - 1) * hop, 1e-9) / bus for w, b, tt in a2a]
        a2a_eff = float(min(max(statistics.median(ratios), 0.01), 1.0))
    simple = dataclasses.replace(
        next(p for p in hw.protocols if p.name == "simple"),
        bandwidth_fraction=1.0,
        base_latency_s=base,
        intra_hop_latency_s=hop,
    )
    intra = dataclasses.replace(
        hw.intra_node, link_bandwidth_bytes_per_s=bus, ring_efficiency=1.0, all_to_all_efficiency=a2a_eff, nvls=False
    )
    return dataclasses.replace(hw, intra_node=intra, protocols=(simple,))


def measurements_table(*parts: Measurements, source: str = "calibration") -> MeasuredTable:
    """The collective measurements as a table (ops are fitted, not tabled: graphs rarely repeat bench shapes)."""
    table = MeasuredTable(source)
    for m in parts:
        for kind, world, nbytes, t in m.collectives:
            table.add_collective(kind, world, nbytes, t)
    return table


def machine_description(device: str) -> str:
    import platform

    import torch

    if device.startswith("cuda"):
        return f"{torch.cuda.get_device_name()} (torch {torch.__version__})"
    cpu = platform.processor() or platform.machine()
    return f"{cpu}, {os.cpu_count()} cores, torch {torch.__version__} ({torch.get_num_threads()} threads)"

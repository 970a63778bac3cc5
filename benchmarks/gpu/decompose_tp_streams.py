"""Decomposed TP collectives of a zoo layer on one GPU with two CUDA streams (issue 18's GPU check).

torch only, so it runs on whatever torch the GPU machine has (it does not import commsched). The communication
stand-in is a device-to-device copy of the collective's bytes on a second stream, issued, recorded and waited as
``_c10d_functional`` collectives are (output allocated on the compute stream, the collective's stream first waits
for the compute stream, the compute stream waits on an event before the first reader). Per chunk count ``k`` the
program is the one ``commsched.rewrites.decompose_tp`` emits; ``k = 1`` is the traced program:

* ``ag_mm`` (split ``m``): chunk ``j`` gathers rows ``[j S/k, (j+1) S/k)`` of every rank's shard (stand-in: a copy
  of the gathered chunk), its matmuls run once its copy is done, each product is interleaved back (``stack`` on
  dim 1, then a view);
* ``mm_rs`` (split ``n``): chunk ``j`` multiplies by column block ``j`` of the weight and reduce-scatters the
  ``(M, N/k)`` product (stand-in: a copy of the product, rows ``[0, M/W)`` kept), the pieces joined by ``cat``.

Timing: a spin kernel (``torch.cuda._sleep``) is queued first on the compute stream, long enough that the CPU has
launched the whole program before the GPU reaches it, so the events time the GPU's work, not Python's launches (the
CPU launch time is recorded too). Per case and ``k`` (median of repeats):

* ``two_stream`` / ``two_stream_hi``: the program, copies on a side stream of default / high priority;
* ``two_stream_sm16`` / ``two_stream_sm32``: the same with the copy as a Triton kernel on 16 / 32 CTAs, as NCCL
  runs a collective on a few channels (``torch``'s copy fills the GPU, which a GEMM in flight leaves no room for);
* ``one_stream``: the same kernels on one stream (what the split costs without any overlap);
* ``op``: each kernel alone (``copy``, ``copy_smN``, ``mm`` per weight, ``stack`` / ``cat``), the simulator's inputs;

and, once, how two streams slow each other (``interference``): a matmul chain and a copy chain, each alone and
while the other (3x as long) runs on the other stream, at both side-stream priorities.

    python benchmarks/gpu/decompose_tp_streams.py CASES.json OUT.csv [--sm-carveout 32]

``--sm-carveout N`` makes cuBLAS matmuls leave ``N`` SMs free (``torch._C._set_sm_carveout_experimental``): a
persistent GEMM otherwise takes every SM, and a communication kernel beside it waits for it or splits it in two waves.
"""

from __future__ import annotations

import argparse
import csv
import gc
import json
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

import torch

WARMUP, REPEATS = 5, 30
FIELDS = ["gpu", "driver", "torch", "cuda", "sm_carveout", "case", "pattern", "world", "rows", "hidden", "weights",
          "chunks", "measure", "op", "index", "median_us", "min_us", "cpu_launch_us", "repeats", "check"]  # fmt: skip
_CYCLES_PER_US = [0.0]
CopyFn = Callable[[torch.Tensor, torch.Tensor], Any]


def torch_copy(dst: torch.Tensor, src: torch.Tensor) -> Any:
    return dst.copy_(src)


def limited_copies(ctas: tuple[int, ...] = (16, 32)) -> dict[str, CopyFn]:
    """Copy kernels on a fixed number of CTAs, as NCCL runs a collective on a few channels (one CTA each) instead
    of filling the GPU; {} when Triton is missing or does not compile here."""
    try:
        import triton
        import triton.language as tl

        @triton.jit
        def copy_kernel(src, dst, n, BLOCK: tl.constexpr):
            pid, step = tl.program_id(0), tl.num_programs(0) * BLOCK
            for start in range(pid * BLOCK, n, step):
                offs = start + tl.arange(0, BLOCK)
                mask = offs < n
                tl.store(dst + offs, tl.load(src + offs, mask=mask), mask=mask)

        def make(ctas: int) -> CopyFn:
            def run(dst: torch.Tensor, src: torch.Tensor) -> Any:
                copy_kernel[(ctas,)](src, dst, src.numel(), BLOCK=4096, num_warps=8)

            return run

        fns = {f"sm{c}": make(c) for c in ctas}
        a = torch.randn(1 << 20, device="cuda", dtype=torch.bfloat16)
        b = torch.empty_like(a)
        for fn in fns.values():
            fn(b, a)
            if not torch.equal(a, b):
                raise RuntimeError("the limited copy is wrong")
        return fns
    except Exception as exc:  # a missing or broken Triton only drops these rows
        print(f"limited copies skipped: {exc}", file=sys.stderr)
        return {}


def spin_cycles_per_us() -> float:
    """The spin kernel's cycles per microsecond on this GPU (measured once)."""
    if not _CYCLES_PER_US[0]:
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda._sleep(1_000_000)
        start.record()
        torch.cuda._sleep(10_000_000)
        end.record()
        torch.cuda.synchronize()
        _CYCLES_PER_US[0] = 10_000_000 / (start.elapsed_time(end) * 1e3)
    return _CYCLES_PER_US[0]


def gpu_us(fn: Callable[[], Any], reps: int = REPEATS, warmup: int = WARMUP,
           before: Callable[[], Any] | None = None) -> tuple[float, float, float]:  # fmt: skip
    """Median and min GPU time of ``fn`` (us) between two events on the current stream, behind a spin kernel that
    covers the CPU's launches; and the median CPU launch time (us). ``before`` (e.g. a write that evicts the L2
    cache) runs before each spin kernel, outside the timed span."""
    for _ in range(warmup):
        fn()
    torch.cuda.synchronize()
    launch = []
    for _ in range(3):
        t0 = time.perf_counter()
        fn()
        launch.append((time.perf_counter() - t0) * 1e6)
        torch.cuda.synchronize()
    launch_us = statistics.median(launch)
    # far longer than the launches: a CPU stall (the VM, Python) must not let the start event fire before them
    cycles = int((4 * launch_us + 1000) * spin_cycles_per_us())
    times = []
    gc.disable()
    try:
        for _ in range(reps):
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            if before is not None:
                before()
            torch.cuda._sleep(cycles)
            start.record()
            fn()
            end.record()
            torch.cuda.synchronize()
            times.append(start.elapsed_time(end) * 1e3)
    finally:
        gc.enable()
    return statistics.median(times), min(times), launch_us


class AgSite:
    """``ag_mm``: a shard ``(S, K)`` on each of ``world`` ranks, gathered to ``(world S, K)``, read by ``x @ w.t()``
    for each weight ``w`` of shape ``(N, K)``."""

    def __init__(self, case: dict[str, Any], device: torch.device):
        self.world, self.rows, self.hidden = int(case["world"]), int(case["rows"]), int(case["hidden"])
        self.outs = [int(n) for n in case["weights"]]
        dtype = getattr(torch, case.get("dtype", "bfloat16"))
        gen = torch.Generator(device=device).manual_seed(0)
        self.shards = torch.randn(self.world, self.rows, self.hidden, device=device, dtype=dtype, generator=gen)
        self.weights = [torch.randn(n, self.hidden, device=device, dtype=dtype, generator=gen) / 64 for n in self.outs]
        self.reference = [self.shards.view(-1, self.hidden) @ w.t() for w in self.weights]

    def divides(self, k: int) -> bool:
        return self.rows % k == 0

    def sources(self, k: int) -> list[torch.Tensor]:
        """What chunk ``j`` of ``k`` gathers: rows ``[j s, (j+1) s)`` of every rank's shard, contiguous."""
        s = self.rows // k
        return [self.shards[:, j * s : (j + 1) * s].contiguous().view(-1, self.hidden) for j in range(k)]

    def program(self, k: int, comm: torch.cuda.Stream | None, copy: CopyFn = torch_copy) -> Callable[[], Any]:
        """The decomposed program; ``comm`` None runs the copies on the compute stream (no overlap)."""
        srcs, s = self.sources(k), self.rows // k
        events = [torch.cuda.Event() for _ in range(k)]

        def run() -> list[torch.Tensor]:
            compute = torch.cuda.current_stream()
            gathered = [torch.empty_like(src) for src in srcs]  # allocated on the compute stream, as c10d does
            side = comm if comm is not None else compute
            side.wait_stream(compute)
            for j in range(k):
                with torch.cuda.stream(side):
                    copy(gathered[j], srcs[j])
                    events[j].record()
            pieces: list[list[torch.Tensor]] = [[] for _ in self.weights]
            for j in range(k):
                compute.wait_event(events[j])
                for i, w in enumerate(self.weights):
                    pieces[i].append(gathered[j] @ w.t())
            if k == 1:
                return [p[0] for p in pieces]
            return [torch.stack([p.view(self.world, s, -1) for p in ps], 1).view(self.world * self.rows, -1)
                    for ps in pieces]  # fmt: skip

        return run

    def kernels(self, k: int, copies: dict[str, CopyFn]) -> list[tuple[str, int, Callable[[], Any]]]:
        """Each kernel of the ``k``-chunk program once (all chunks have one shape)."""
        src = self.sources(k)[0]
        dst = torch.empty_like(src)
        ops: list[tuple[str, int, Callable[[], Any]]] = [("copy", 0, lambda: dst.copy_(src))]
        ops += [(f"copy_{name}", 0, lambda fn=fn: fn(dst, src)) for name, fn in copies.items()]
        s = self.rows // k
        for i, w in enumerate(self.weights):
            ops.append(("mm", i, lambda w=w: src @ w.t()))
            if k > 1:
                parts = [(src @ w.t()).view(self.world, s, -1)] * k
                ops.append(("stack", i, lambda parts=parts: torch.stack(parts, 1)))
        return ops


class RsSite:
    """``mm_rs``: ``a @ w.t()`` (``a``: ``(M, K)``, ``w``: ``(N, K)``) reduce-scattered over ``world`` ranks to
    ``(M / world, N)``; the stand-in copies the whole product (the bytes a rank sends) and keeps rows
    ``[0, M / world)``."""

    def __init__(self, case: dict[str, Any], device: torch.device):
        self.world, self.rows, self.hidden = int(case["world"]), int(case["rows"]), int(case["hidden"])
        self.outs = [int(n) for n in case["weights"]]
        dtype = getattr(torch, case.get("dtype", "bfloat16"))
        gen = torch.Generator(device=device).manual_seed(0)
        self.a = torch.randn(self.rows, self.hidden, device=device, dtype=dtype, generator=gen)
        self.w = torch.randn(self.outs[0], self.hidden, device=device, dtype=dtype, generator=gen) / 64
        self.reference = [(self.a @ self.w.t())[: self.rows // self.world]]

    def divides(self, k: int) -> bool:
        return self.outs[0] % k == 0

    def program(self, k: int, comm: torch.cuda.Stream | None, copy: CopyFn = torch_copy) -> Callable[[], Any]:
        n = self.outs[0] // k
        blocks = [self.w.t()[:, j * n : (j + 1) * n] for j in range(k)]  # column blocks of the right operand
        events = [torch.cuda.Event() for _ in range(k)]
        keep = self.rows // self.world

        def run() -> list[torch.Tensor]:
            compute = torch.cuda.current_stream()
            side = comm if comm is not None else compute
            received = []
            for j in range(k):
                product = self.a @ blocks[j]
                out = torch.empty_like(product)
                side.wait_stream(compute)  # the collective is issued here, after its input
                with torch.cuda.stream(side):
                    copy(out, product)
                    events[j].record()
                product.record_stream(side)
                received.append(out[:keep])
            for j in range(k):
                compute.wait_event(events[j])
            return [received[0] if k == 1 else torch.cat(received, 1)]

        return run

    def kernels(self, k: int, copies: dict[str, CopyFn]) -> list[tuple[str, int, Callable[[], Any]]]:
        n = self.outs[0] // k
        block = self.w.t()[:, :n]
        product = self.a @ block
        dst = torch.empty_like(product)
        ops: list[tuple[str, int, Callable[[], Any]]] = [("copy", 0, lambda: dst.copy_(product)),
                                                         ("mm", 0, lambda: self.a @ block)]  # fmt: skip
        ops += [(f"copy_{name}", 0, lambda fn=fn: fn(dst, product)) for name, fn in copies.items()]
        if k > 1:
            parts = [dst[: self.rows // self.world]] * k
            ops.append(("cat", 0, lambda: torch.cat(parts, 1)))
        return ops


def worst_error(outputs: list[torch.Tensor], reference: list[torch.Tensor]) -> float:
    """Largest |difference| to the unsplit program's result, relative to that result's largest |value|."""
    return max(float((o.float() - r.float()).abs().max() / r.float().abs().max()) for o, r in zip(outputs, reference))


def measure_case(case: dict[str, Any], streams: dict[str, torch.cuda.Stream], copies: dict[str, CopyFn],
                 device: torch.device) -> list[dict]:  # fmt: skip
    site = (AgSite if case["pattern"] == "ag_mm" else RsSite)(case, device)
    base = {"case": case["name"], "pattern": case["pattern"], "world": site.world, "rows": site.rows,
            "hidden": site.hidden, "weights": " ".join(map(str, site.outs))}  # fmt: skip
    rows = []
    for k in case["chunks"]:
        if not site.divides(k):
            continue
        variants = [("two_stream", streams["default"], torch_copy), ("two_stream_hi", streams["high"], torch_copy),
                    ("one_stream", None, torch_copy)]  # fmt: skip
        variants += [(f"two_stream_{name}", streams["default"], fn) for name, fn in copies.items()]
        for measure, stream, copy in variants:
            fn = site.program(k, stream, copy)
            med, low, launch = gpu_us(fn)
            err = worst_error(fn(), site.reference)
            rows.append({**base, "chunks": k, "measure": measure, "op": "program", "index": 0, "median_us": med,
                         "min_us": low, "cpu_launch_us": launch, "repeats": REPEATS,
                         "check": f"{err:.2e}"})  # fmt: skip
        for op, index, fn in site.kernels(k, copies):
            med, low, launch = gpu_us(fn)
            rows.append({**base, "chunks": k, "measure": "op", "op": op, "index": index, "median_us": med,
                         "min_us": low, "cpu_launch_us": launch, "repeats": REPEATS, "check": ""})  # fmt: skip
    return rows


def chain(fn: Callable[[], Any], n: int) -> Callable[[], None]:
    def run() -> None:
        for _ in range(n):
            fn()

    return run


def chain_us(fn: Callable[[], None], comm: torch.cuda.Stream, other: Callable[[], None] | None) -> float:
    """Median wall of ``fn`` on the current stream (8 runs), with ``other`` launched on ``comm`` just before it."""
    times = []
    for rep in range(10):
        torch.cuda.synchronize()
        if other is not None:
            comm.wait_stream(torch.cuda.current_stream())
            with torch.cuda.stream(comm):
                other()
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        fn()
        end.record()
        torch.cuda.synchronize()
        if rep >= 2:
            times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def interference(streams: dict[str, torch.cuda.Stream], copies: dict[str, CopyFn], device: torch.device) -> list:
    """A matmul chain and a copy chain, each alone, then each while the other (3x as long) runs on the other stream.

    Rows: ``alone`` and ``overlapped_<priority>`` per chain (``op`` ``mm`` / ``copy`` / ``copy_smN``; for ``mm``,
    ``overlapped_<copy>`` names the other chain's copy), the wall of the measured chain; the other chain is on the
    side stream, the measured one on the compute stream."""
    a = torch.randn(8192, 4096, device=device, dtype=torch.bfloat16)
    b = torch.randn(4096, 4096, device=device, dtype=torch.bfloat16)
    src = torch.randn(64 * 2**20 // 2, device=device, dtype=torch.bfloat16)  # 64 MiB, a TP+SP all_gather's output
    dst = torch.empty_like(src)
    copy_fns = {"copy": torch_copy, **{f"copy_{name}": fn for name, fn in copies.items()}}
    mm_once = gpu_us(lambda: a @ b)[0]
    n_mm = 50
    mm_chain, mm_long = chain(lambda: a @ b, n_mm), chain(lambda: a @ b, 3 * n_mm)
    rows = []

    def row(op: str, measure: str, count: int, value: float) -> dict[str, Any]:
        what = "8192x4096x4096 bf16" if op == "mm" else "64 MiB"
        return {"case": "interference", "chunks": count, "measure": measure, "op": op, "index": 0,
                "median_us": value, "repeats": 8, "check": what}  # fmt: skip

    rows.append(row("mm", "alone", n_mm, chain_us(mm_chain, streams["default"], None)))
    for name, fn in copy_fns.items():
        once = gpu_us(lambda fn=fn: fn(dst, src))[0]
        n_copy = max(1, round(n_mm * mm_once / once))  # a chain about as long as the matmuls'
        copy_chain = chain(lambda fn=fn: fn(dst, src), n_copy)
        copy_long = chain(lambda fn=fn: fn(dst, src), 3 * n_copy)
        rows.append(row(name, "alone", n_copy, chain_us(copy_chain, streams["default"], None)))
        for p in ("default", "high"):
            rows.append(row(name, f"overlapped_{p}", n_copy, chain_us(copy_chain, streams[p], mm_long)))
            rows.append(row("mm", f"overlapped_{name}_{p}", n_mm, chain_us(mm_chain, streams[p], copy_long)))
    return rows


def machine() -> dict[str, str]:
    try:
        driver = subprocess.run(["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
                                capture_output=True, text=True, timeout=30).stdout.strip()  # fmt: skip
    except (OSError, subprocess.SubprocessError):
        driver = "unknown"
    return {"gpu": torch.cuda.get_device_name(), "driver": driver, "torch": torch.__version__,
            "cuda": str(torch.version.cuda)}  # fmt: skip


def write_rows(path: str, fields: list[str], rows: list[dict[str, Any]]) -> None:
    """``rows``, each with the machine's fields (:func:`machine`), as a CSV of ``fields`` (other keys dropped);
    each row printed as it is written."""
    meta = machine()
    with open(path, "w", newline="") as f:
        writer = csv.DictWriter(f, fields, extrasaction="ignore")
        writer.writeheader()
        for row in rows:
            writer.writerow({**meta, **row})
            print(row)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("cases", help="JSON list of cases (benchmarks/bench_gpu.py cases writes it)")
    parser.add_argument("out", help="CSV to write")
    parser.add_argument("--sm-carveout", type=int, default=None,
                        help="SMs cuBLAS matmuls leave to other streams (torch's experimental flag)")  # fmt: skip
    args = parser.parse_args(argv)
    if not torch.cuda.is_available():
        print("decompose_tp_streams: no CUDA device", file=sys.stderr)
        return 2
    with open(args.cases) as f:
        cases = json.load(f)
    device = torch.device("cuda")
    streams = {"default": torch.cuda.Stream(device=device), "high": torch.cuda.Stream(device=device, priority=-1)}
    meta = machine()
    if args.sm_carveout is not None:
        torch._C._set_sm_carveout_experimental(args.sm_carveout)
        meta["sm_carveout"] = str(torch._C._get_sm_carveout_experimental())
    copies = limited_copies()
    rows = []
    for case in cases:
        rows += measure_case(case, streams, copies, device)
        print(f"{case['name']}: done", flush=True)
    rows += interference(streams, copies, device)
    with open(args.out, "w", newline="") as f:
        writer = csv.DictWriter(f, FIELDS)
        writer.writeheader()
        for row in rows:
            writer.writerow({**meta, **row})
    print(f"wrote {len(rows)} rows to {args.out} ({meta}); spin {spin_cycles_per_us():.0f} cycles/us")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

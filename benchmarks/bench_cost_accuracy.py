"""Cost-model accuracy against public measurements, side by side with torch 2.13's own estimates.

Usage: python benchmarks/bench_cost_accuracy.py   (prints Markdown tables; no GPU needed)

Public numbers: /work/shared/reference/README.md and the sources cited in tests/cost/test_collectives.py.
torch's numbers: ``torch._inductor.comm_analysis.estimate_nccl_collective_runtime_impl`` (the analytical NCCL model
Inductor falls back to without a live NCCL communicator), with ``get_gpu_type`` patched to the GPU generation in
question (on a CPU-only build it cannot detect one; the patch lives in this script only), sizes in the nccl-tests
convention; for compute, torch's roofline formula (``get_estimated_runtime``: max(flops / peak, bytes / bandwidth),
factor 1.0) with the datasheet peak and bandwidth, since ``get_device_tflops`` needs a GPU.
"""

from __future__ import annotations

import contextlib
from unittest import mock

from commsched import hardware
from commsched.cost import plan_collective
from commsched.cost.collectives import bus_factor

MB = 1 << 20
SIZES = {"1 KB": 1 << 10, "1 MB": MB, "8 MB": 8 * MB, "64 MB": 64 * MB, "256 MB": 256 * MB, "1 GB": 1 << 30,
         "8 GB": 8 << 30}  # fmt: skip
H100_AR = {
    "1 KB": "25.6 us",
    "1 MB": 43.7,
    "8 MB": 172.1,
    "64 MB": 361.8,
    "256 MB": 423.4,
    "1 GB": 466.4,
    "8 GB": 478.9,
}
A100_AR = {"1 MB": 36.2, "8 MB": 90.0, "64 MB": 166.6, "256 MB": 213.9, "1 GB": 228.1, "8 GB": 231.6}


@contextlib.contextmanager
def torch_gpu(gen: str):
    from torch._inductor import comm_analysis as ca

    with mock.patch.object(ca, "get_gpu_type", lambda: getattr(ca.NVIDIA_GPU_TYPE, gen)):
        yield ca


def torch_time_s(gen: str, kind: str, nbytes: int, n: int) -> float:
    with torch_gpu(gen) as ca:
        coll = {"all_reduce": ca.NCCL_COLL.ALL_REDUCE, "all_gather": ca.NCCL_COLL.ALL_GATHER,
                "reduce_scatter": ca.NCCL_COLL.REDUCE_SCATTER, "all_to_all": ca.NCCL_COLL.ALL_TO_ALL}[kind]  # fmt: skip
        return ca.estimate_nccl_collective_runtime_impl(nbytes, n, coll) * 1e-3  # ms -> s


def busbw(kind: str, nbytes: int, n: int, t: float) -> float:
    return bus_factor(kind, n) * nbytes / t / 1e9 if t > 0 else float("inf")


def err(got: float, ref: float) -> str:
    return f"{got:.1f} ({got / ref - 1:+.0%})"


def sweep(title: str, profile: str, gen: str, ref: dict) -> None:
    hw = hardware.get(profile)
    print(f"\n### {title}\n")
    print("| size | public busbw GB/s | commsched (algorithm) | torch 2.13 comm_analysis |")
    print("|---|---|---|---|")
    for label, ref_v in ref.items():
        nbytes = SIZES[label]
        p = plan_collective("all_reduce", nbytes, 8, hw)
        tt = torch_time_s(gen, "all_reduce", nbytes, 8)
        if isinstance(ref_v, str):  # a time
            ref_s = float(ref_v.split()[0]) * 1e-6
            print(f"| {label} | {ref_v} | {p.time_s * 1e6:.1f} us ({p.time_s / ref_s - 1:+.0%}; "
                  f"{p.algorithm}/{p.protocol}) | {tt * 1e6:.1f} us ({tt / ref_s - 1:+.0%}) |")  # fmt: skip
            continue
        ours = busbw("all_reduce", nbytes, 8, p.time_s)
        theirs = busbw("all_reduce", nbytes, 8, tt)
        print(f"| {label} | {ref_v} | {err(ours, ref_v)} {p.algorithm}/{p.protocol} | {err(theirs, ref_v)} |")


def table(title: str, rows: list[tuple[str, str, str, str, int, int, float]]) -> None:
    """rows: (case, profile, torch gen, kind, nbytes, group size, public busbw)."""
    print(f"\n### {title}\n")
    print("| case | public busbw GB/s | commsched (algorithm) | torch 2.13 comm_analysis |")
    print("|---|---|---|---|")
    for case, profile, gen, kind, nbytes, n, ref in rows:
        hw = hardware.get(profile, num_nodes=max(1, n // 8))
        p = plan_collective(kind, nbytes, n, hw)
        ours = busbw(kind, nbytes, n, p.time_s)
        theirs = busbw(kind, nbytes, n, torch_time_s(gen, kind, nbytes, n))
        print(f"| {case} | {ref} | {err(ours, ref)} {p.algorithm}/{p.protocol} | {err(theirs, ref)} |")


def compute_table() -> None:
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from commsched.cost import estimate_costs
    from commsched.frontends.fx import from_fx

    print("\n### Compute roofline\n")
    print("| case | public | commsched | torch 2.13 formula (datasheet peak) |")
    print("|---|---|---|---|")
    cases = [
        ("H100 bf16 matmul 8192^3", "h100-sxm", "794.5 TFLOP/s [mamf]", 794.5, torch.bfloat16, 8192),
        ("A100 bf16 matmul 8192^3", "a100-sxm-80g", "271 TFLOP/s [mamf]", 271.0, torch.bfloat16, 8192),
        ("B200 bf16 matmul 8192^3", "b200", "1745 TFLOP/s [mamf]", 1745.0, torch.bfloat16, 8192),
        ("MI300X bf16 matmul 8192^3", "mi300x", "668 TFLOP/s [mamf]", 668.0, torch.bfloat16, 8192),
    ]
    for case, profile, ref_text, ref, dtype, n in cases:
        with FakeTensorMode():
            a = torch.randn(n, n, dtype=dtype)
            g = from_fx(make_fx(lambda x, y: x @ y)(a, a))
        hw = hardware.get(profile)
        i = next(k for k in range(len(g)) if g.targets[k] == "aten.mm.default")
        t = estimate_costs(g, hw).node_s[i]
        peak = hw.compute.peak_flops_for("bfloat16")
        nbytes = g.in_bytes[i] + g.out_bytes[i]
        t_torch = max(g.flops[i] / peak, nbytes / hw.compute.hbm_bandwidth_bytes_per_s)
        print(f"| {case} | {ref_text} | {err(g.flops[i] / t / 1e12, ref)} | {err(g.flops[i] / t_torch / 1e12, ref)} |")
    for case, profile, ref_text, ref in (
        ("H100 copy 1 GiB", "h100-sxm", "2.90 TB/s [azure]", 2.90),
        ("H200 copy 1 GiB", "h200-sxm", "4.01 TB/s [azure]", 4.01),
        ("A100 copy 1 GiB", "a100-sxm-80g", "1.61 TB/s [azure]", 1.61),
    ):
        with FakeTensorMode():
            g = from_fx(make_fx(lambda x: x.clone())(torch.randn(1 << 28)))
        hw = hardware.get(profile)
        i = next(k for k in range(len(g)) if g.targets[k] == "aten.clone.default")
        moved = float(g.in_bytes[i] + g.out_bytes[i])
        t = estimate_costs(g, hw).node_s[i]
        t_torch = moved / hw.compute.hbm_bandwidth_bytes_per_s
        ours, theirs = moved / t / 1e12, moved / t_torch / 1e12
        cells = f"{ours:.2f} TB/s ({ours / ref - 1:+.0%}) | {theirs:.2f} TB/s ({theirs / ref - 1:+.0%})"
        print(f"| {case} | {ref_text} | {cells} |")


def main() -> None:
    print("## Collectives and compute vs public measurements (busbw in GB/s; error vs public in brackets)")
    sweep("8 x H100 SXM all_reduce (Azure ND H100 v5, NCCL 2.18.5)", "h100-sxm", "HOPPER", H100_AR)
    sweep("8 x A100 SXM all_reduce (Azure ND A100 v4)", "a100-sxm-80g", "AMPERE", A100_AR)
    gb, g4 = 1 << 30, 4 << 30
    table(
        "Ring ceilings, multi-node, all_to_all",
        [
            ("8 x H100 all_gather 4 GB (ring ceiling)", "h100-sxm", "HOPPER", "all_gather", g4, 8, 365),
            ("8 x H100 reduce_scatter 4 GB (ring ceiling)", "h100-sxm", "HOPPER", "reduce_scatter", g4, 8, 365),
            ("4 x 8 H100, 8 x 400G: all_reduce 1 GB", "h100-sxm", "HOPPER", "all_reduce", gb, 32, 375),
            ("4 x 8 H100, 8 x 400G: all_reduce 4 GB", "h100-sxm", "HOPPER", "all_reduce", g4, 32, 375),
            ("4 x 8 H100, 8 x 400G: all_gather 1 GB", "h100-sxm", "HOPPER", "all_gather", gb, 32, 375),
            ("4 x 8 H100, 8 x 400G: all_gather 4 GB", "h100-sxm", "HOPPER", "all_gather", g4, 32, 375),
            ("4 x 8 A100, 8 x 200G: all_reduce 4 GB", "a100-sxm-80g", "AMPERE", "all_reduce", g4, 32, 192),
            ("8 x A100 all_to_all 1 GB", "a100-sxm-80g", "AMPERE", "all_to_all", gb, 8, 210),
            ("8 x H100 all_to_all 1 GB", "h100-sxm", "HOPPER", "all_to_all", gb, 8, 320),
            ("8 x B200 all_to_all 1 GB", "b200", "BLACKWELL", "all_to_all", gb, 8, 640),
            ("4 x 8 H100 all_to_all 1 GB", "h100-sxm", "HOPPER", "all_to_all", gb, 32, 48),
        ],
    )
    print("\nMulti-node at 64-256 MB (no public sweep found; the ceiling is ~375 GB/s):\n")
    print("| case | commsched busbw (algorithm) | torch 2.13 |")
    print("|---|---|---|")
    hw4 = hardware.get("h100-sxm", num_nodes=4)
    for kind in ("all_reduce", "all_gather"):
        for nbytes in (64 * MB, 256 * MB):
            p = plan_collective(kind, nbytes, 32, hw4)
            theirs = busbw(kind, nbytes, 32, torch_time_s("HOPPER", kind, nbytes, 32))
            print(f"| 4 x 8 H100 {kind} {nbytes // MB} MB | {busbw(kind, nbytes, 32, p.time_s):.1f} "
                  f"{p.algorithm}/{p.protocol} | {theirs:.1f} |")  # fmt: skip
    compute_table()


if __name__ == "__main__":
    main()

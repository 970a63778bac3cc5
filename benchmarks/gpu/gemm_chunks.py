"""The matmuls of one llama3-8b TP+SP layer whole and in chunks of the sequence (split-sequence overlap, issue 18),
on one GPU: what a chunk's smaller GEMMs cost against the whole one's.

torch only (runs on the GPU machine's own torch). bf16 ``x [M, K] @ w [K, N]`` for the layer's four weight shapes
under TP 8 (qkv 4096 -> 768, output 512 -> 4096, gate / up 4096 -> 1792, down 1792 -> 4096), at M = 8192 (one
sequence) and at the 2 and 4 chunks' M. Times with CUDA events behind a spin kernel (as
``decompose_tp_streams.py``), median of 20 after 5 warm-ups.

    python benchmarks/gpu/gemm_chunks.py OUT.csv
"""

from __future__ import annotations

import sys

import torch
from decompose_tp_streams import gpu_us, write_rows  # this folder: the same timing behind a spin kernel

WEIGHTS = {"qkv": (4096, 768), "output": (512, 4096), "gate_up": (4096, 1792), "down": (1792, 4096)}
ROWS = (8192, 4096, 2048)
FIELDS = ["gpu", "torch", "cuda", "weight", "m", "k", "n", "median_us", "min_us"]


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not torch.cuda.is_available():
        print("usage: gemm_chunks.py OUT.csv (needs a CUDA device)", file=sys.stderr)
        return 2
    rows = []
    for name, (k, n) in WEIGHTS.items():
        w = torch.randn(k, n, device="cuda", dtype=torch.bfloat16)
        for m in ROWS:
            x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
            med, low, _ = gpu_us(lambda x=x, w=w: torch.mm(x, w), 20, 5)
            rows.append({"weight": name, "m": m, "k": k, "n": n, "median_us": med, "min_us": low})
    write_rows(args[0], FIELDS, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

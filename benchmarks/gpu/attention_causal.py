"""Flash attention on one GPU, causal and not, forward and backward, at the zoo's shapes (the cost model's check).

torch only (runs on the GPU machine's own torch). Times with CUDA events behind a spin kernel (as
``decompose_tp_streams.py``), median of 20 after 5 warm-ups, through ``aten._scaled_dot_product_flash_attention``
and its backward, the ops the zoo traces (key / value heads expanded to the query heads, as the kernel needs).

    python benchmarks/gpu/attention_causal.py OUT.csv [--held-out]

``--held-out`` measures ``HELD_OUT`` instead: shapes the cost model's causal block schedule was not fitted on.
"""

from __future__ import annotations

import sys
from typing import Any

import torch
from decompose_tp_streams import gpu_us, write_rows  # this folder: the same timing behind a spin kernel

SHAPES = [  # (batch, heads, seq, head_dim): llama3-8b under TP 8 (4 heads) at three lengths, whole (32 heads)
    (1, 4, 8192, 128), (1, 4, 4096, 128), (2, 4, 4096, 128), (1, 32, 2048, 128), (1, 32, 8192, 128),
]  # fmt: skip
HELD_OUT = [  # shapes the model's CTAs per SM were not fitted on: llama3-70b under TP 8 (8 heads), longer, batched
    (1, 8, 8192, 128), (4, 8, 2048, 128), (1, 4, 16384, 128),
    (1, 64, 4096, 128), (8, 32, 1024, 128), (1, 16, 8192, 128),
]  # fmt: skip
FIELDS = ["gpu", "torch", "cuda", "batch", "heads", "seq", "head_dim", "causal", "pass", "median_us", "min_us"]


def measure(b: int, h: int, s: int, d: int, causal: bool) -> list[dict[str, Any]]:
    q, k, v = (torch.randn(b, h, s, d, device="cuda", dtype=torch.bfloat16, requires_grad=True) for _ in range(3))
    flash = torch.ops.aten._scaled_dot_product_flash_attention
    out = flash(q, k, v, 0.0, causal)
    grad = torch.randn_like(out[0])

    def forward() -> Any:
        return flash(q, k, v, 0.0, causal)

    def backward() -> Any:
        o, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = out
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            grad, q, k, v, o, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset
        )

    rows = []
    for name, fn in (("forward", forward), ("backward", backward)):
        med, low, _ = gpu_us(fn, reps=20, warmup=5)
        rows.append({"batch": b, "heads": h, "seq": s, "head_dim": d, "causal": causal, "pass": name,
                     "median_us": med, "min_us": low})  # fmt: skip
    return rows


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    held_out = "--held-out" in args
    args = [a for a in args if a != "--held-out"]
    if len(args) != 1 or not torch.cuda.is_available():
        print("usage: attention_causal.py OUT.csv [--held-out] (needs a CUDA device)", file=sys.stderr)
        return 2
    rows = []
    for shape in HELD_OUT if held_out else SHAPES:
        for causal in (False, True):
            rows += measure(*shape, causal)
    write_rows(args[0], FIELDS, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

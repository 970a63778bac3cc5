"""A prompt's flash attention whole and in chunks (split-sequence overlap, issue 18), on one GPU: what the causal mask
means when a chunk has fewer queries than keys, and what the chunks cost against the whole.

torch only (runs on the GPU machine's own torch). First the mask: ``aten._scaled_dot_product_flash_attention`` with
``is_causal`` on 256 queries against 512 keys, compared in float32 with the math attention under a bottom-right
and a top-left mask (the zoo's chunked prefill assumes bottom-right: query ``i`` sees keys ``0 .. kv - q + i``).
Then the forward of llama3-8b under TP 8 (4 heads of 128, one sequence of 8192 positions): whole, and as the 2 and 4
chunks the split makes (chunk ``c`` of ``k``: ``8192 / k`` queries against ``(c + 1) 8192 / k`` keys). Times with
CUDA events behind a spin kernel (as ``decompose_tp_streams.py``), median of 20 after 5 warm-ups.

    python benchmarks/gpu/attention_chunks.py OUT.csv
"""

from __future__ import annotations

import sys

import torch
import torch.nn.functional as F
from decompose_tp_streams import gpu_us, write_rows  # this folder: the same timing behind a spin kernel

HEADS, HEAD_DIM, SEQ = 4, 128, 8192
FIELDS = ["gpu", "torch", "cuda", "what", "chunks", "chunk", "q_len", "kv_len", "median_us", "min_us", "max_abs_err"]


def mask_check() -> list[dict]:
    """The flash kernel's causal output against the math attention under each alignment (max abs error)."""
    gen = torch.Generator(device="cuda").manual_seed(0)
    q = torch.randn(1, HEADS, 256, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen)
    k, v = (torch.randn(1, HEADS, 512, HEAD_DIM, device="cuda", dtype=torch.bfloat16, generator=gen) for _ in range(2))
    flash = torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0].float()
    ones = torch.ones(256, 512, dtype=torch.bool, device="cuda")
    rows = []
    for what, mask in (("bottom-right mask", ones.tril(512 - 256)), ("top-left mask", ones.tril(0))):
        ref = F.scaled_dot_product_attention(q.float(), k.float(), v.float(), attn_mask=mask)
        rows.append({"what": what, "q_len": 256, "kv_len": 512, "max_abs_err": (flash - ref).abs().max().item()})
    return rows


def forward_us(q_len: int, kv_len: int) -> tuple[float, float]:
    q = torch.randn(1, HEADS, q_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16)
    k, v = (torch.randn(1, HEADS, kv_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    med, low, _ = gpu_us(lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True), 20, 5)
    return med, low


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not torch.cuda.is_available():
        print("usage: attention_chunks.py OUT.csv (needs a CUDA device)", file=sys.stderr)
        return 2
    rows = mask_check()
    for chunks in (1, 2, 4):
        length = SEQ // chunks
        for c in range(chunks):
            med, low = forward_us(length, (c + 1) * length)
            rows.append({"what": "forward", "chunks": chunks, "chunk": c, "q_len": length, "kv_len": (c + 1) * length,
                         "median_us": med, "min_us": low})  # fmt: skip
    write_rows(args[0], FIELDS, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

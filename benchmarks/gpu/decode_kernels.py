"""A decode step's two big kernels on one GPU, as the zoo's decode steps trace them: the flash attention of one new
query per sequence against its KV cache (``aten._scaled_dot_product_flash_attention``, fewer KV heads than query
heads under GQA), and the skinny matmuls of a few tokens against a weight (``aten.mm`` of ``x`` and the weight's
transpose, as ``F.linear`` lowers).

torch only (runs on the GPU machine's own torch). bfloat16; attention head dim 128, no mask (a single query sees the
whole cache). Each row: the median and min GPU time of 20 runs after 5 warm-ups (CUDA events behind a spin kernel,
as ``decompose_tp_streams.py``) and the bytes the kernel must read (the KV cache, or the weight and ``x``), so that
the time can be read against the memory roofline. A decode step reads each layer's weights and KV cache once, from
HBM: ``median_us`` is timed after a 1 GiB write evicts the L2 cache (``warm_median_us``: run after run, what fits
in L2 stays there). A shape the kernel refuses is a row with its error.

    python benchmarks/gpu/decode_kernels.py OUT.csv
"""

from __future__ import annotations

import sys

import torch
from decompose_tp_streams import gpu_us, write_rows  # this folder: the same timing behind a spin kernel

HEAD_DIM = 128
HEADS = [(4, 1), (8, 1), (16, 2), (32, 8), (8, 8), (32, 32)]  # (query heads, KV heads): TP 8 / 4 / 1 of Llama 3, MHA
BATCHES = [1, 8, 32]
KV_LENS = [1024, 8192, 32768]
# (K, N) of the weights of Llama 3 8B / 70B's decode layers under TP 8 and TP 1 (q / kv / o, w1 / w3, w2, the head)
WEIGHTS = [(4096, 512), (4096, 128), (512, 4096), (4096, 1792), (1792, 4096), (4096, 4096), (4096, 14336),
           (14336, 4096), (8192, 1024), (8192, 128), (1024, 8192), (8192, 3584), (3584, 8192),
           (8192, 16032)]  # fmt: skip
TOKENS = [1, 8, 32, 128, 512]
FIELDS = ["gpu", "torch", "cuda", "what", "batch", "heads", "kv_heads", "kv_len", "m", "k", "n", "bytes", "median_us",
          "min_us", "warm_median_us", "error"]  # fmt: skip
_EVICT: list[torch.Tensor] = []  # a 1 GiB buffer, written before each cold run


def timed(fn) -> tuple[float, float, float]:
    """(median, min) us of ``fn`` with the L2 cache evicted before each run, and its median run after run."""
    if not _EVICT:
        _EVICT.append(torch.empty(1 << 30, device="cuda", dtype=torch.uint8))
    med, low, _ = gpu_us(fn, 20, 5, before=_EVICT[0].zero_)
    warm, _, _ = gpu_us(fn, 20, 5)
    return med, low, warm


def attention_us(batch: int, heads: int, kv_heads: int, kv_len: int) -> tuple[float, float, float]:
    """:func:`timed` of the forward; q is a [B, 1, H, D] tensor's transpose, as the zoo traces it."""
    q = torch.randn(batch, 1, heads, HEAD_DIM, device="cuda", dtype=torch.bfloat16).transpose(1, 2)
    k, v = (torch.randn(batch, kv_heads, kv_len, HEAD_DIM, device="cuda", dtype=torch.bfloat16) for _ in range(2))
    return timed(lambda: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v))


def mm_us(m: int, k: int, n: int) -> tuple[float, float, float]:
    """:func:`timed` of ``x @ w.t()`` with x [M, K] and w [N, K]."""
    x = torch.randn(m, k, device="cuda", dtype=torch.bfloat16)
    w = torch.randn(n, k, device="cuda", dtype=torch.bfloat16)
    return timed(lambda: torch.mm(x, w.t()))


def measured(row: dict, fn, *args: int) -> dict:
    try:
        row["median_us"], row["min_us"], row["warm_median_us"] = fn(*args)
    except RuntimeError as exc:  # a shape this torch's kernel refuses: recorded, the run goes on
        row["error"] = str(exc).splitlines()[0][:200]
    torch.cuda.empty_cache()
    return row


def main(argv: list[str] | None = None) -> int:
    args = sys.argv[1:] if argv is None else argv
    if len(args) != 1 or not torch.cuda.is_available():
        print("usage: decode_kernels.py OUT.csv (needs a CUDA device)", file=sys.stderr)
        return 2
    rows = []
    for heads, kv_heads in HEADS:
        for batch in BATCHES:
            for kv_len in KV_LENS:
                row = {"what": "attention", "batch": batch, "heads": heads, "kv_heads": kv_heads, "kv_len": kv_len,
                       "bytes": 2 * batch * kv_heads * kv_len * HEAD_DIM * 2}  # fmt: skip
                rows.append(measured(row, attention_us, batch, heads, kv_heads, kv_len))
    for k, n in WEIGHTS:
        for m in TOKENS:
            row = {"what": "mm", "m": m, "k": k, "n": n, "bytes": 2 * (k * n + m * k + m * n)}
            rows.append(measured(row, mm_us, m, k, n))
    write_rows(args[0], FIELDS, rows)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""A decode step's kernels measured on a GPU (benchmarks/gpu/decode_kernels.py) against the cost model.

Usage: python benchmarks/bench_decode.py [MEASURED.csv] [--hardware h200-sxm]
       python benchmarks/bench_decode.py benchmarks/data/gpu_decode_h100.csv --hardware h100-sxm (all held out)
       python benchmarks/bench_decode.py --steps [--hardware h100-sxm] (whole decode steps: decode_step.py's runs)
Prints the summary of model / measured per kernel kind and per set (the rows the model's constants were fitted on,
and the rows held out), then the rows at batch 8 / 8 tokens, as benchmarks/RESULTS.md shows them; the tests re-check
both against the stored run. Fitted: ``COMBINE_S_PER_SPLIT`` on the attention passes at batch 1, ``SPLIT_K_MIN``
and the H200 profile's ``matmul_memory_half_bytes`` on the Llama 3 8B-shaped matmuls (K and N without 8192 or
16032); everything else is held out.
"""

from __future__ import annotations

import argparse
import csv
import functools
import json
import math
import statistics
from pathlib import Path
from typing import Any

DATA = Path(__file__).resolve().parent / "data" / "gpu_decode_h200.csv"
STEPS = {"h200-sxm": Path(__file__).resolve().parent / "data" / "gpu_decode_step_h200",
         "h100-sxm": Path(__file__).resolve().parent / "data" / "gpu_decode_step_h100"}  # fmt: skip
FIT_GPU = "NVIDIA H200"  # the constants were fitted on this GPU's rows; on another GPU every row is held out


def read_rows(path: str | Path) -> list[dict[str, Any]]:
    from commsched.io import read_input_text

    return [r for r in csv.DictReader(read_input_text(Path(path), "measured CSV").splitlines()) if not r["error"]]


def is_fit(row: dict[str, Any]) -> bool:
    """Whether the model's constants were fitted on this row (see the module docstring)."""
    if row["what"] == "attention":
        return row["batch"] == "1"
    return not {int(row["k"]), int(row["n"])} & {8192, 16032}


@functools.cache
def _graph(what: str, dims: tuple[int, ...]):
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from commsched.frontends.fx import from_fx

    with FakeTensorMode():
        if what == "attention":  # q as the zoo traces it: a [B, 1, H, D] tensor's transpose; no mask
            b, h, hk, kv = dims
            q = torch.empty(b, 1, h, 128, dtype=torch.bfloat16).transpose(1, 2)
            k, v = (torch.empty(b, hk, kv, 128, dtype=torch.bfloat16) for _ in range(2))
            gm = make_fx(lambda q, k, v: torch.ops.aten._scaled_dot_product_flash_attention(q, k, v)[0])(q, k, v)
        else:
            m, k, n = dims
            gm = make_fx(torch.mm)(torch.empty(m, k, dtype=torch.bfloat16), torch.empty(k, n, dtype=torch.bfloat16))
    return from_fx(gm)


def dims(row: dict[str, Any]) -> tuple[int, ...]:
    keys = ("batch", "heads", "kv_heads", "kv_len") if row["what"] == "attention" else ("m", "k", "n")
    return tuple(int(row[k]) for k in keys)


def model_us(row: dict[str, Any], hardware: str) -> float:
    """The cost model's time (us) of one measured kernel, traced on fake tensors as the zoo traces it."""
    from commsched.cost import estimate_costs

    return float(estimate_costs(_graph(row["what"], dims(row)), hardware).node_s.sum()) * 1e6


def label(row: dict[str, Any]) -> str:
    if row["what"] == "attention":
        b, h, hk, kv = dims(row)
        return f"attention, batch {b}, {h} / {hk} heads, {kv} keys"
    m, k, n = dims(row)
    return f"mm, {m} x {k} @ {k} x {n}"


def summary(rows: list[dict[str, Any]], hardware: str) -> list[str]:
    """One line per (kernel kind, fitted / held out): model / measured, min, geometric mean, max."""
    lines = []
    here = rows[0]["gpu"] == FIT_GPU
    names = {True: "fitted on", False: "held out"} if here else {True: "the H200's fit rows", False: "the rest"}
    for what in ("attention", "mm"):
        for fitted in (True, False):
            mine = [r for r in rows if r["what"] == what and is_fit(r) == fitted]
            ratios = [model_us(r, hardware) / float(r["median_us"]) for r in mine]
            gm = math.exp(statistics.mean(math.log(x) for x in ratios))
            lines.append(f"- {what}, {names[fitted]} ({len(mine)} kernels): model / measured "
                         f"{min(ratios):.2f}-{max(ratios):.2f}, geometric mean {gm:.2f}")  # fmt: skip
    return lines


def table(path: str | Path, hardware: str) -> str:
    """The summary, then a Markdown table of the rows at batch 8 (attention) and 8 tokens (matmuls)."""
    rows = read_rows(path)
    head = [f"GPU: {rows[0]['gpu']}, torch {rows[0]['torch']}; model: `{hardware}`.", "", *summary(rows, hardware),
            "", "| kernel | bytes read | measured (us) | model (us) | model / measured | set |",
            "|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if (r["what"] == "attention" and r["batch"] == "8") or (r["what"] == "mm" and r["m"] == "8"):
            meas, model = float(r["median_us"]), model_us(r, hardware)
            head.append(f"| {label(r)} | {int(r['bytes']) / 2**20:.1f} MiB | {meas:.1f} | {model:.1f} | "
                        f"{model / meas:.2f} | {'fit' if is_fit(r) else 'held out'} |")  # fmt: skip
    return "\n".join(head)


def step_model_us(preset: str, world_size: int, layers: int, hardware: str) -> dict[str, tuple[float, float, int]]:
    """The cost model of one zoo TP decode step's kernels, unfused (eager runs every op alone), by kind (matmul,
    attention, other): (seconds with each kernel's launch overhead, without it, kernels), in us."""
    from commsched import hardware as hw_mod
    from commsched.cost import estimate_costs
    from commsched.cost.compute import forward_attention_extra_s
    from commsched.cost.estimate import graph_features
    from commsched.cost.opclass import OpClass
    from commsched.workloads import build

    g = build(preset, parallel="tp", world_size=world_size, layers=layers, mode="decode").graph
    hw = hw_mod.for_graph(hardware, g)
    hw_costs = estimate_costs(g, hw, fusion=False)
    launch_us = hw.compute.launch_overhead_s * 1e6
    features = graph_features(g)
    cls = features.cls
    out: dict[str, list[float]] = {}
    for i, t in enumerate(hw_costs.node_s.tolist()):
        if t <= 0 or cls[i] in (OpClass.COLLECTIVE, OpClass.FREE):
            continue
        kind = {OpClass.MATMUL: "matmul", OpClass.ATTENTION: "attention"}.get(OpClass(cls[i]), "other")
        kernels = 1 + int(kind == "attention" and forward_attention_extra_s(features.gemm[i : i + 1], hw)[0] > 0)
        row = out.setdefault(kind, [0.0, 0.0, 0])
        row[0] += t * 1e6
        row[1] += t * 1e6 - kernels * launch_us
        row[2] += kernels
    return {k: (v[0], v[1], int(v[2])) for k, v in out.items()}


def step_table(folder: str | Path, hardware: str) -> str:
    """Markdown: each stored decode step's kernels by kind, measured against the unfused model."""
    lines = ["| step (rank 0, TP 8, 8 layers) | kind | measured kernels: us (count) | model: us with launches / "
             "without (kernels) | model without launches / measured |", "|---|---|---|---|---|"]  # fmt: skip
    for path in sorted(Path(folder).glob("*.json")):
        m = json.loads(path.read_text())
        model = step_model_us(m["preset"], m["world_size"], m["layers"], hardware)
        for kind in ("matmul", "attention", "other"):
            with_l, without, n = model[kind]
            meas = m["kernel_us"][kind]
            step = f"{m['preset']} decode, batch {m['batch']}, {m['kv_len']} keys"
            lines.append(f"| {step} | {kind} | {meas:.0f} ({m['kernels'][kind]:.0f}) | {with_l:.0f} / {without:.0f} "
                         f"({n}) | {without / meas:.2f} |")  # fmt: skip
        total = sum(v[0] for v in model.values())
        lines.append(f"| {m['preset']}: the step | all | {sum(m['kernel_us'].values()):.0f} summed; "
                     f"{m['graph_step_us']:.0f} as a CUDA graph; {m['eager_span_us']:.0f} eager | {total:.0f} with "
                     f"launches | {total / m['graph_step_us']:.2f} of the CUDA graph |")  # fmt: skip
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("measured", nargs="?", default=str(DATA))
    parser.add_argument("--hardware", default="h200-sxm")
    parser.add_argument("--steps", action="store_true", help="whole decode steps (benchmarks/gpu/decode_step.py)")
    args = parser.parse_args(argv)
    print(step_table(STEPS[args.hardware], args.hardware) if args.steps else table(args.measured, args.hardware))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Estimate vs measured runtime of every op of a traced graph run with real tensors, on this CPU.

Usage: python benchmarks/bench_cost_cpu.py [--profile PATH] [--reps 9]
Without ``--profile`` it first runs ``commsched calibrate --device cpu`` (into a temporary folder). The program is a
transformer block (layer norm, fused QKV projection, causal scaled-dot-product attention, GELU MLP), forward and
backward, traced with make_fx on fake tensors and run op by op on real tensors with one intra-op thread (the
calibration's setting). Estimates are eager (``fusion=False``): an eager run executes every op as its own kernel.
"""

from __future__ import annotations

import argparse
import os
import statistics
import tempfile
import time
from pathlib import Path


def transformer_block_step(d: int = 256, heads: int = 4, tokens: int = 256, ff: int = 1024):
    import torch
    import torch.nn.functional as F
    from torch import nn

    class Block(nn.Module):
        def __init__(self) -> None:
            super().__init__()
            self.ln1, self.ln2 = nn.LayerNorm(d), nn.LayerNorm(d)
            self.qkv, self.o = nn.Linear(d, 3 * d), nn.Linear(d, d)
            self.up, self.down = nn.Linear(d, ff), nn.Linear(ff, d)

        def forward(self, x):
            b, s, _ = x.shape
            q, k, v = self.qkv(self.ln1(x)).view(b, s, 3, heads, d // heads).permute(2, 0, 3, 1, 4)
            a = F.scaled_dot_product_attention(q, k, v, is_causal=True).transpose(1, 2).reshape(b, s, d)
            x = x + self.o(a)
            return x + self.down(F.gelu(self.up(self.ln2(x))))

    torch.manual_seed(0)
    block = Block()
    params = dict(block.named_parameters())

    def step(x, params):
        out = torch.func.functional_call(block, params, (x,))
        loss = out.float().pow(2).mean()
        return [loss, *torch.autograd.grad(loss, [x, *params.values()])]

    x = torch.randn(1, tokens, d, requires_grad=True)
    return step, (x, params)


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--profile", type=Path, default=None, help="a calibrated profile (default: calibrate now)")
    ap.add_argument("--reps", type=int, default=9)
    args = ap.parse_args()
    import torch
    from torch.fx.experimental.proxy_tensor import make_fx

    from commsched import hardware
    from commsched.cli.calibrate import run_calibration
    from commsched.cost import estimate_costs
    from commsched.cost.measure_graph import time_fx_nodes
    from commsched.frontends.fx import from_fx
    from commsched.ir import OpKind

    print(f"load average before: {os.getloadavg()}")
    if args.profile is None:
        tmp = Path(tempfile.mkdtemp())
        t0 = time.perf_counter()
        path, hw = run_calibration("cpu", tmp / "cpu-local.toml", world=2)
        print(f"calibrated in {time.perf_counter() - t0:.1f} s -> {path}")
    else:
        hw = hardware.get(args.profile)
    torch.set_num_threads(1)
    step, inputs = transformer_block_step()
    gm = make_fx(step, tracing_mode="fake")(*inputs)
    g = from_fx(gm)
    times = time_fx_nodes(gm, *inputs, reps=args.reps)
    est = estimate_costs(g, hw, fusion=False)
    rows = []
    for i in range(len(g)):
        if g.kinds[i] in (OpKind.COMPUTE, OpKind.OTHER) and g.names[i] in times:
            rows.append((g.names[i], g.targets[i], times[g.names[i]], float(est.node_s[i])))
    print(f"\n{g}\n\n| op | target | measured | estimate | error |\n|---|---|---|---|---|")
    errors = []
    for name, target, measured, estimated in rows:
        e = estimated / measured - 1
        errors.append(abs(e))
        print(f"| {name} | `{target}` | {measured * 1e6:.1f} us | {estimated * 1e6:.1f} us | {e:+.0%} |")
    total_m, total_e = sum(r[2] for r in rows), sum(r[3] for r in rows)
    within = f"within 20 %: {sum(e <= 0.2 for e in errors)}; within 50 %: {sum(e <= 0.5 for e in errors)}"
    sums = f"sum measured {total_m * 1e3:.2f} ms vs estimated {total_e * 1e3:.2f} ms ({total_e / total_m - 1:+.0%})"
    print(f"\nops: {len(rows)}; median |error| {statistics.median(errors):.0%}; {within}; {sums}")
    if hw.table_path:
        from commsched.cost import MeasuredTable, plan_collective

        table = MeasuredTable.load(hw.table_path)
        errs = []
        print(
            "\n| collective | ranks | bytes | measured | fitted model (no table) | error |\n|---|---|---|---|---|---|"
        )
        for kind, n, nbytes, t in table.collectives:
            model = plan_collective(kind, nbytes, n, hw).time_s
            errs.append(abs(model / t - 1))
            print(f"| {kind} | {n} | {nbytes} | {t * 1e6:.0f} us | {model * 1e6:.0f} us | {model / t - 1:+.0%} |")
        print(f"\ncollectives: {len(errs)} points; median |error| of the fitted model {statistics.median(errs):.0%} "
              "(estimates use the measured table itself at these points)")  # fmt: skip
    print(f"load average after: {os.getloadavg()}")


if __name__ == "__main__":
    main()

"""Real pipeline runs against the prediction: torch.distributed.pipelining's schedules on local gloo ranks (issue 39).

For each pipeline size and repeat, one ``commsched.runtime.pipeline_run`` run of every schedule (they run in
rotation within it), then a markdown table: each schedule's predicted step (the pipeline simulator fed the stage
costs and P2P link measured in the same run) against its measured median, the ratio of each schedule's step to the
first schedule's (predicted and measured), and the numerics of the first step against the unpipelined model. The
load average before and after each run is printed: on a shared machine other jobs take cores from the ranks.

    python benchmarks/bench_pipeline_run.py --pp-size 2 --repeat 3
    python benchmarks/bench_pipeline_run.py --pp-size 2 --bandwidth 1gbit     # root: a shaped loopback
"""

from __future__ import annotations

import argparse
import contextlib
import os
import statistics
import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))


def _row(cfg_text: str, load: str, name: str, run, ratio: tuple[float, float]) -> str:
    t = run.measured
    ratio_err = ratio[0] / ratio[1] - 1.0
    return (f"| {cfg_text} | {load} | {name} | {run.predicted_s * 1e3:.1f} ms | {t.median_s * 1e3:.1f} ms "
            f"({t.p25_s * 1e3:.1f}-{t.p75_s * 1e3:.1f}) | {run.prediction_error:+.1%} | {ratio[0]:.3f} | "
            f"{ratio[1]:.3f} | {ratio_err:+.1%} | {run.loss_error:.1e} | {run.max_grad_error:.1e} |")  # fmt: skip


def main() -> None:
    from commsched.runtime.netns import shaped_network
    from commsched.runtime.pipeline_run import PipelineRunConfig, run_pipeline_local
    from commsched.workloads import resolve

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--pp-size", type=int, nargs="+", default=[2])
    ap.add_argument("--schedules", default="1F1B,GPipe,Interleaved1F1B")
    ap.add_argument("--microbatches", type=int, default=4)
    ap.add_argument("--layers", type=int, default=4)
    ap.add_argument("--seq-len", type=int, default=128)
    ap.add_argument("--batch", type=int, default=None, help="sequences per step (default: one per micro-batch)")
    ap.add_argument("--iters", type=int, default=8)
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--repeat", type=int, default=3)
    ap.add_argument("--bandwidth", nargs="+", default=[None], help="tc rates of a shaped loopback (root), or none")
    args = ap.parse_args()
    names = tuple(args.schedules.split(","))
    print("| config | load | schedule | predicted | measured median (p25-p75) | error | predicted / first's | "
          "measured / first's | ratio error | loss error | grad error |")  # fmt: skip
    print("|---|---|---|---|---|---|---|---|---|---|---|")
    ratio_errs, step_errs = {n: [] for n in names}, {n: [] for n in names}
    for bandwidth in args.bandwidth:
        for p in args.pp_size:
            batch = args.batch or args.microbatches
            spec = resolve("llama-tiny", parallel="none", world_size=1, layers=args.layers, seq_len=args.seq_len,
                           batch=batch, dtype="float32", attention="sdpa")  # fmt: skip
            cfg = PipelineRunConfig(spec=spec, pp_size=p, schedules=names, microbatches=args.microbatches,
                                    iters=args.iters, warmup=args.warmup)  # fmt: skip
            for _ in range(args.repeat):
                before = os.getloadavg()[0]
                ctx = shaped_network(bandwidth) if bandwidth and bandwidth != "none" else contextlib.nullcontext()
                with ctx as net:
                    report = run_pipeline_local(cfg, network=net, profile=False)
                load = f"{before:.1f}-{os.getloadavg()[0]:.1f}"
                text = f"P {p}, M {args.microbatches}, {args.layers} layers, seq {args.seq_len} x {batch}" + (
                    f", {bandwidth}" if net is not None else "")  # fmt: skip
                ratios = report.ratios()
                for name, run in report.schedules.items():
                    print(_row(text, load, name, run, ratios[name]), flush=True)
                    step_errs[name].append(run.prediction_error)
                    ratio_errs[name].append(ratios[name][0] / ratios[name][1] - 1.0)
                pts = ", ".join(f"{k:.0f} ranks {c:.2f}" for k, c in report.core_points)
                over = ", ".join(f"{n} {r.empty_step_s * 1e3:.0f} ms" for n, r in report.schedules.items())
                print(f"| | | P2P {report.p2p.transfer_s * 1e3:.2f} ms per {report.p2p.send_bytes} B; the ranks shared "
                      f"{report.cores:.2f} cores ({pts}); over empty stages: {over} | | | | | | | | |")  # fmt: skip
    print()
    for name in names:
        se, re_ = step_errs[name], ratio_errs[name]
        print(f"* {name}: step error median {statistics.median(se):+.1%} (|e| <= 10 % in "
              f"{sum(abs(e) <= 0.1 for e in se)} of {len(se)}); ratio error median {statistics.median(re_):+.1%} "
              f"(|e| <= 10 % in {sum(abs(e) <= 0.1 for e in re_)} of {len(re_)})")  # fmt: skip


if __name__ == "__main__":
    main()

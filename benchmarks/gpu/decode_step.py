"""A zoo decode step on one GPU, every kernel of it: rank 0 of PRESET under TP (torch's fake process group answers
its collectives, so nothing is communicated and no NCCL kernel runs), run eagerly with random weights and caches,
profiled with torch.profiler; and the same step replayed from a CUDA graph (no launch gaps).

Writes OUT_DIR/decode_step.json: per step, the CUDA kernels' summed time by kind (matmul, flash attention, the
rest) and count, the GPU span of a step (first kernel start to last kernel end) in eager mode, and the step's time
replayed from a CUDA graph (CUDA events, median of 20); and OUT_DIR/trace.json.gz, the profiler's trace.
``benchmarks/bench_decode.py step`` compares it with the cost model (without fusion: eager runs every op alone).

    PYTHONPATH=src python benchmarks/gpu/decode_step.py OUT_DIR [--preset llama3-70b] [--world-size 8] [--layers 8]
"""

from __future__ import annotations

import argparse
import gzip
import json
import statistics
import sys
from pathlib import Path

import torch

STEPS = 5


def kind_of(kernel: str) -> str:
    name = kernel.lower()
    if "flash" in name:
        return "attention"
    if any(s in name for s in ("gemm", "gemv", "cutlass", "xmma", "splitk", "sm90_", "sm80_", "cublas")):
        return "matmul"
    return "other"


def random_inputs(program, vocab: int) -> list[torch.Tensor]:
    """The step's inputs on the GPU: random weights and caches (their values do not change the kernels' times)."""
    out = []
    for t in program.empty_inputs():
        if t.dtype.is_floating_point:
            out.append((torch.randn(t.shape, device="cuda") * 0.02).to(t.dtype))
        else:
            out.append(torch.randint(0, vocab, t.shape, device="cuda", dtype=t.dtype))
    return out


def kernel_summary(trace_path: Path, steps: int) -> dict:
    """Per step: kernel seconds and counts by kind, and the GPU span (first kernel start to last end, over all
    steps, divided by their number), from the profiler's Chrome trace."""
    events = json.loads(trace_path.read_text())["traceEvents"]
    kernels = [e for e in events if e.get("cat") == "kernel" and "dur" in e]
    by_kind: dict[str, list[float]] = {}
    for e in kernels:
        by_kind.setdefault(kind_of(e["name"]), []).append(float(e["dur"]))
    start = min(float(e["ts"]) for e in kernels)
    end = max(float(e["ts"]) + float(e["dur"]) for e in kernels)
    return {
        "kernel_us": {k: sum(v) / steps for k, v in by_kind.items()},
        "kernels": {k: len(v) / steps for k, v in by_kind.items()},
        "eager_span_us": (end - start) / steps,
    }


def graph_step_us(step, inputs: list[torch.Tensor]) -> float | str:
    """Median us of the step replayed from a CUDA graph, or why it could not be captured."""
    try:
        stream = torch.cuda.Stream()
        stream.wait_stream(torch.cuda.current_stream())
        with torch.cuda.stream(stream):
            for _ in range(3):
                step(*inputs)
        torch.cuda.current_stream().wait_stream(stream)
        graph = torch.cuda.CUDAGraph()
        with torch.cuda.graph(graph):
            step(*inputs)
    except Exception as exc:  # a capture the fake collectives or an op refuse: reported, not fatal
        return f"not captured: {type(exc).__name__}: {str(exc).splitlines()[0][:160]}"
    times = []
    for _ in range(20):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        graph.replay()
        end.record()
        torch.cuda.synchronize()
        times.append(start.elapsed_time(end) * 1e3)
    return statistics.median(times)


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--preset", default="llama3-70b")
    ap.add_argument("--world-size", type=int, default=8)
    ap.add_argument("--layers", type=int, default=8)
    args = ap.parse_args(argv)
    if not torch.cuda.is_available():
        print("decode_step: needs a CUDA device", file=sys.stderr)
        return 2
    from commsched.frontends.fake_pg import fake_process_group
    from commsched.workloads import StepProgram, create_groups, resolve

    spec = resolve(args.preset, parallel="tp", world_size=args.world_size, layers=args.layers, mode="decode")
    args.out_dir.mkdir(parents=True, exist_ok=True)
    with fake_process_group(spec.plan.world_size, rank=0), torch.no_grad():
        program = StepProgram(spec, create_groups(spec.plan, 0), 0)
        inputs = random_inputs(program, spec.model.vocab_size)
        for _ in range(5):
            program.step(*inputs)
        torch.cuda.synchronize()
        with torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) as prof:
            for _ in range(STEPS):
                program.step(*inputs)
            torch.cuda.synchronize()
        trace = args.out_dir / "trace.json"
        prof.export_chrome_trace(str(trace))
        summary = kernel_summary(trace, STEPS)
        with open(trace, "rb") as f, gzip.open(args.out_dir / "trace.json.gz", "wb") as g:
            g.write(f.read())
        trace.unlink()
        summary["graph_step_us"] = graph_step_us(program.step, inputs)
    summary.update(preset=args.preset, world_size=args.world_size, layers=args.layers, batch=spec.batch,
                   kv_len=spec.kv_len, gpu=torch.cuda.get_device_name(), torch=torch.__version__)  # fmt: skip
    (args.out_dir / "decode_step.json").write_text(json.dumps(summary, indent=1) + "\n")
    print(json.dumps(summary, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

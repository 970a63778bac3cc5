"""Zoo training steps on one device, every kernel of them, aligned to the cost model's per-node estimate (issue 38).

For each case of a cases file (``benchmarks/data/gpu_train_cases.json``): rank 0 of the zoo step (torch's fake
process group answers its collectives with outputs of the right shape, so nothing is communicated and no NCCL
kernel runs), with random weights and tokens on ``--device``:

* **eager**: the traced step itself (the FX graph commsched costs, ``trace_step`` on ``--device``) run by an
  interpreter that wraps every node in a ``node:NAME`` profiler range; each kernel is given to the node whose range
  launched it (its ``cudaLaunchKernel`` lies inside the range), so every costed compute node gets a row with its
  kernels' measured time and the model's estimate (``estimate_costs(fusion=False)``), or is listed as unmatched with
  the reason. On a CPU there are no kernels: a node's outermost ``aten::`` ops stand in for them.
* **compiled**: ``StepProgram.step`` with every transformer block under ``torch.compile`` (as torchtitan compiles
  them and ``predict --compile`` assumes), compared per kernel class with the fused estimate
  (``estimate_costs(fusion=True)``): Inductor's fused kernels belong to no single node.

The step's time is measured separately, without the profiler: the plain step (the graph module eager, the program
compiled), CUDA events (wall clock on a CPU), median of ``--iters``.

Writes OUT_DIR/kernels.csv (one row per costed node of an eager case, one per kernel of a compiled case, one per
kernel launched outside any node's range), OUT_DIR/steps.csv (one row per case) and OUT_DIR/traces/CASE.json.gz
(the Kineto trace). ``benchmarks/bench_gpu.py train OUT_DIR/kernels.csv`` prints the per-class error.

    PYTHONPATH=src python benchmarks/gpu/train_step_kernels.py CASES.json OUT_DIR [--device cuda] [--only NAME]
"""

from __future__ import annotations

import argparse
import bisect
import csv
import gzip
import json
import shutil
import statistics
import sys
import time
from collections import defaultdict
from pathlib import Path
from typing import Any

import torch
import torch.fx

NODE_RANGE = "node:"  # the prefix of the profiler range around each node of an eager case
KERNEL_CLASSES = ("matmul", "attention", "elementwise", "reduction", "other")
CASE_KEYS = ("name", "split", "preset", "parallel", "world_size", "layers", "seq_len", "ac", "float8", "compile")
KERNEL_FIELDS = ("case", "split", "compile", "node", "target", "model_class", "model_us", "measured_us",
                 "kernels_per_step", "kernel_class", "kernel_names", "status", "reason")  # fmt: skip
STEP_FIELDS = ("case", "split", "compile", "device", "gpu", "torch", "preset", "parallel", "world_size", "layers",
               "seq_len", "ac", "float8", "model_compute_us", "kernel_us", "unattributed_us", "step_us",
               "nodes_costed", "nodes_matched", "nodes_unmatched")  # fmt: skip

# GPU kernel names by class, first match wins: cuBLAS / CUTLASS / cuBLASLt (nvjet) GEMMs and Inductor's matmul
# templates; flash / cuDNN / memory-efficient attention; Inductor's reductions (triton_red_, triton_per_) and ATen's
# reduce / norm / softmax kernels; everything else that runs on tensors is elementwise (ATen's vectorized /
# unrolled / elementwise kernels, copies, Inductor's pointwise triton_poi_)
_KERNEL_PATTERNS = (
    ("attention", ("flash", "fmha", "attention", "sdpa", "cudnn_generated_fort_native_sdpa")),
    ("matmul", ("gemm", "gemv", "cutlass", "xmma", "nvjet", "sm90_", "sm80_", "cublas", "triton_tem_", "_scaled_mm")),
    ("reduction", ("triton_red_", "triton_per_", "reduce", "norm", "softmax", "cross_entropy", "nll_loss", "cumsum",
                   "sort", "topk", "amax")),
    ("elementwise", ("elementwise", "vectorized", "unrolled", "triton_poi_", "copy", "fill", "cat", "index",
                     "gather", "scatter", "memcpy", "memset", "embedding")),
)  # fmt: skip


def kernel_class(name: str) -> tuple[str, str]:
    """(class, how it was classified) of a device kernel or, on a CPU, an ``aten::`` op: GPU names by the patterns
    above; ``aten::`` ops by the cost model's own classifier (:func:`commsched.cost.opclass.classify_target`),
    since CPU kernels carry no library name."""
    if name.startswith("aten::"):
        from commsched.cost.opclass import OpClass, classify_target

        cls, _ = classify_target(f"aten.{name.removeprefix('aten::')}.default", True)
        return {OpClass.MATMUL: "matmul", OpClass.ATTENTION: "attention", OpClass.REDUCTION: "reduction",
                OpClass.ELEMENTWISE: "elementwise"}.get(cls, "other"), "aten op (cost model's classifier)"  # fmt: skip
    low = name.lower()
    for cls, needles in _KERNEL_PATTERNS:
        if any(s in low for s in needles):
            return cls, "kernel name"
    return "other", "kernel name (no pattern matched)"


def model_class(cls: int) -> str:
    """The cost model's OpClass as a kernel class name."""
    from commsched.cost.opclass import OpClass

    return {OpClass.MATMUL: "matmul", OpClass.ATTENTION: "attention", OpClass.ELEMENTWISE: "elementwise",
            OpClass.REDUCTION: "reduction"}.get(OpClass(int(cls)), "other")  # fmt: skip


# ------------------------------------------------------------------ the step on the device


def case_spec(case: dict[str, Any], device: torch.device):
    """The case's resolved WorkloadSpec (flash attention on CUDA; SDPA elsewhere: the flash op has no CPU kernel)."""
    from commsched.workloads import resolve

    missing = [k for k in CASE_KEYS if k not in case]
    if missing:
        raise ValueError(
            f"case {case.get('name', '?')!r}: missing {', '.join(missing)}: expected {', '.join(CASE_KEYS)}"
        )
    options = {k: v for k, v in case.items() if k not in CASE_KEYS}  # tp_size, ep_size, batch, ...
    attention = "flash" if device.type == "cuda" else "sdpa"
    return resolve(case["preset"], parallel=case["parallel"], world_size=case["world_size"], layers=case["layers"],
                   seq_len=case["seq_len"], ac=case["ac"], float8=case["float8"], attention=attention,
                   **options)  # fmt: skip


def random_inputs(program, vocab: int, device: torch.device) -> list[torch.Tensor]:
    """The step's inputs on ``device``: random weights and tokens (their values do not change the kernels' times);
    the parameters require grad as the program's own inputs do."""
    out = []
    for t in program.empty_inputs():
        if t.dtype.is_floating_point:
            x = (torch.randn(t.shape, device=device) * 0.02).to(t.dtype)
            out.append(x.requires_grad_(t.requires_grad))
        else:
            out.append(torch.randint(0, vocab, t.shape, device=device, dtype=t.dtype))
    return out


class AnnotatedInterpreter(torch.fx.Interpreter):
    """Runs a GraphModule node by node, each ``call_function`` inside a ``node:NAME`` profiler range."""

    def run_node(self, n: torch.fx.Node) -> Any:
        if n.op != "call_function":
            return super().run_node(n)
        with torch.profiler.record_function(NODE_RANGE + n.name):
            return super().run_node(n)


def _sync(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.synchronize(device)


def step_us(run, device: torch.device, iters: int) -> float:
    """Median microseconds of ``run()``: CUDA events on a GPU, the wall clock elsewhere."""
    times = []
    for _ in range(iters):
        if device.type == "cuda":
            start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
            start.record()
            run()
            end.record()
            torch.cuda.synchronize(device)
            times.append(start.elapsed_time(end) * 1e3)
        else:
            t0 = time.perf_counter()
            run()
            times.append((time.perf_counter() - t0) * 1e6)
    return statistics.median(times)


def profile(run, device: torch.device, iters: int, trace: Path) -> None:
    """``iters`` calls of ``run()`` under torch.profiler, exported as a Chrome trace to ``trace``."""
    activities = [torch.profiler.ProfilerActivity.CPU]
    if device.type == "cuda":
        activities.append(torch.profiler.ProfilerActivity.CUDA)
    with torch.profiler.profile(activities=activities) as prof:
        for _ in range(iters):
            run()
        _sync(device)
    prof.export_chrome_trace(str(trace))


def compiled_blocks():
    """A context in which the zoo's transformer block is ``torch.compile`` d (torchtitan compiles each block; the
    embedding, the head and FSDP's hooks stay eager), restoring it on exit."""
    import contextlib

    from commsched.workloads import model

    @contextlib.contextmanager
    def patch():
        original = model.block
        model.block = torch.compile(original)
        try:
            yield
        finally:
            model.block = original

    return patch()


# ------------------------------------------------------------------ kernels from the trace


def read_kernels(trace: Path) -> tuple[list[tuple[str, float, int, int]], list[tuple[int, int, int, str]], bool]:
    """(kernels, node ranges, on_gpu) of a Chrome trace. Kernels: (name, us, launch ts, launch thread), the launch
    being the runtime call that shares the kernel's correlation id (on a CPU trace: the outermost ``aten::`` ops
    inside a node range, launched at their own start). Node ranges: (start, end, thread, node name)."""
    from commsched.cost.trace_import import load_trace

    ev, _, _ = load_trace(trace)
    events = [e for e in ev.events if isinstance(e, dict) and e.get("ph") == "X"]
    ranges = sorted((int(e["ts"]), int(e["ts"] + ev.us(e, e.get("dur", 0))), e.get("tid"),
                     ev.name(e)[len(NODE_RANGE):]) for e in events
                    if ev.name(e).startswith(NODE_RANGE) and e.get("cat") == "user_annotation")  # fmt: skip
    launches = {ev.args(e).get("correlation"): (int(e["ts"]), e.get("tid")) for e in events
                if e.get("cat") in ("cuda_runtime", "cuda_driver")}  # fmt: skip
    device = [e for e in events if e.get("cat") in ("kernel", "gpu_memcpy", "gpu_memset")]
    if device:
        kernels = []
        for e in device:
            ts, tid = launches.get(ev.args(e).get("correlation"), (-1, None))
            kernels.append((ev.name(e), ev.us(e, e.get("dur", 0)), ts, tid))
        return kernels, ranges, True
    ops = sorted((int(e["ts"]), int(e["ts"] + ev.us(e, e.get("dur", 0))), e.get("tid"), ev.name(e)) for e in events
                 if e.get("cat") == "cpu_op" and ev.name(e).startswith("aten::"))  # fmt: skip
    kernels, covered_until = [], defaultdict(lambda: -1)
    for start, end, tid, name in ops:  # outermost: not inside the previous outermost op of its thread
        if start >= covered_until[tid]:
            kernels.append((name, float(end - start), start, tid))
            covered_until[tid] = end
    return kernels, ranges, False


def attribute(kernels, ranges) -> tuple[dict[str, list[tuple[str, float]]], list[tuple[str, float]]]:
    """Per node, its kernels (name, us); and the kernels launched outside every node range."""
    starts = [r[0] for r in ranges]
    per_node: dict[str, list[tuple[str, float]]] = defaultdict(list)
    outside = []
    for name, us, ts, tid in kernels:
        j = bisect.bisect_right(starts, ts) - 1
        if j >= 0 and ts < ranges[j][1] and ranges[j][2] == tid:
            per_node[ranges[j][3]].append((name, us))
        else:
            outside.append((name, us))
    return per_node, outside


def _names(kernels: list[tuple[str, float]], limit: int = 3) -> str:
    by_name: dict[str, float] = defaultdict(float)
    for name, us in kernels:
        by_name[name] += us
    top = sorted(by_name, key=by_name.get, reverse=True)[:limit]
    return ";".join(n[:80] for n in top) + (f";+{len(by_name) - limit} more" if len(by_name) > limit else "")


def _kernel_class_of(kernels: list[tuple[str, float]]) -> str:
    """The class holding most of the kernels' time."""
    by_class: dict[str, float] = defaultdict(float)
    for name, us in kernels:
        by_class[kernel_class(name)[0]] += us
    return max(by_class, key=by_class.get) if by_class else ""


def eager_rows(case, graph, est, per_node, outside, iters: int, on_gpu: bool) -> list[dict[str, Any]]:
    """One row per costed compute node (matched to its kernels, or unmatched with the reason), per free node that
    launched a device kernel, and per kernel launched outside every node's range. On a CPU a free node's ``aten::``
    ops (views, detach, waits) are host bookkeeping, not kernels: skipped."""
    from commsched.cost.estimate import graph_features
    from commsched.cost.opclass import OpClass

    f = graph_features(graph)
    rows = []
    base = {"case": case["name"], "split": case["split"], "compile": False}
    for i in range(len(graph)):
        cls, name = int(f.cls[i]), graph.names[i]
        ran = per_node.get(name, [])
        if cls in (OpClass.FREE, OpClass.COLLECTIVE) and (not ran or not on_gpu):
            continue  # costs nothing, or is communication (the fake group runs none)
        measured = sum(us for _, us in ran) / iters
        costed = est.node_s[i] > 0
        status, reason = "matched", ""
        if not ran:
            status, reason = "unmatched", "ran no device kernel (a view, a no-op, or host work on this device)"
        elif not costed:
            status, reason = "unmatched", "kernels for a node the model charges nothing"
        rows.append({**base, "node": name, "target": graph.targets[i], "model_class": model_class(cls),
                     "model_us": est.node_s[i] * 1e6, "measured_us": measured, "kernels_per_step": len(ran) / iters,
                     "kernel_class": _kernel_class_of(ran), "kernel_names": _names(ran), "status": status,
                     "reason": reason})  # fmt: skip
    for name, us in _sum_by_name(outside).items():
        rows.append({**base, "node": "", "target": "", "model_class": "", "model_us": "", "measured_us": us / iters,
                     "kernels_per_step": "", "kernel_class": kernel_class(name)[0], "kernel_names": name[:120],
                     "status": "unattributed", "reason": "launched outside every node's range"})  # fmt: skip
    return rows


def _sum_by_name(kernels: list[tuple[str, float]]) -> dict[str, float]:
    out: dict[str, float] = defaultdict(float)
    for name, us in kernels:
        out[name] += us
    return out


def compiled_rows(case, graph, est, kernels, iters: int) -> list[dict[str, Any]]:
    """One row per kernel name of a compiled case, and per class the fused model's time (``model_us`` on rows with
    an empty ``kernel_names``): Inductor's kernels are compared with the model per class, not per node."""
    from commsched.cost.estimate import graph_features

    f = graph_features(graph)
    base = {"case": case["name"], "split": case["split"], "compile": True, "node": "", "target": ""}
    model_us: dict[str, float] = defaultdict(float)
    for i in range(len(graph)):  # FREE and COLLECTIVE nodes are "other": no compute kernel of the fake group's step
        model_us[model_class(int(f.cls[i]))] += est.node_s[i] * 1e6
    rows = [{**base, "model_class": cls, "model_us": model_us.get(cls, 0.0), "measured_us": "", "kernels_per_step": "",
             "kernel_class": "", "kernel_names": "", "status": "model", "reason": "fused estimate of the class"}
            for cls in KERNEL_CLASSES if cls != "other"]  # fmt: skip
    for name, us in _sum_by_name([(n, us) for n, us, _, _ in kernels]).items():
        rows.append({**base, "model_class": "", "model_us": "", "measured_us": us / iters, "kernels_per_step": "",
                     "kernel_class": kernel_class(name)[0], "kernel_names": name[:120], "status": "compiled",
                     "reason": "Inductor-compiled step: compared per class"})  # fmt: skip
    return rows


# ------------------------------------------------------------------ one case, all cases


def run_case(case: dict[str, Any], device: torch.device, hardware: str, out_dir: Path, warmup: int,
             iters: int) -> tuple[list[dict[str, Any]], dict[str, Any]]:  # fmt: skip
    """Trace, cost, run and profile one case; its kernels.csv rows and its steps.csv row."""
    from commsched.cost import estimate_costs
    from commsched.cost.estimate import graph_features
    from commsched.frontends.fake_pg import fake_process_group
    from commsched.frontends.fx import from_fx
    from commsched.workloads import StepProgram, create_groups
    from commsched.workloads.trace import trace_step, workload_meta

    spec = case_spec(case, device)
    compiled = bool(case["compile"])
    with fake_process_group(spec.plan.world_size, rank=0):
        groups = create_groups(spec.plan, 0)
        program = StepProgram(spec, groups, 0)
        gm = trace_step(program, device)
        graph = from_fx(gm, meta=workload_meta(program, groups))
        est = estimate_costs(graph, hardware, fusion=compiled)
        inputs = random_inputs(program, spec.model.vocab_size, device)
        trace = out_dir / "traces" / f"{case['name']}.json"
        if compiled:
            with compiled_blocks():
                run = lambda: program.step(*inputs)  # noqa: E731
                for _ in range(warmup):
                    run()
                _sync(device)
                measured_step_us = step_us(run, device, iters)
                profile(run, device, iters, trace)
        else:
            interp = AnnotatedInterpreter(gm)
            for _ in range(warmup):
                gm(*inputs)
            _sync(device)
            measured_step_us = step_us(lambda: gm(*inputs), device, iters)
            profile(lambda: interp.run(*inputs), device, iters, trace)
    kernels, ranges, on_gpu = read_kernels(trace)
    if compiled:
        rows = compiled_rows(case, graph, est, kernels, iters)
    else:
        per_node, outside = attribute(kernels, ranges)
        rows = eager_rows(case, graph, est, per_node, outside, iters, on_gpu)
    with open(trace, "rb") as f, gzip.open(trace.with_suffix(".json.gz"), "wb") as g:
        shutil.copyfileobj(f, g)
    trace.unlink()
    noded = [r for r in rows if r["status"] in ("matched", "unmatched")]
    classes = graph_features(graph).cls
    compute = [i for i in range(len(graph)) if model_class(int(classes[i])) != "other"]
    step = {"case": case["name"], "split": case["split"], "compile": compiled, "device": device.type,
            "gpu": torch.cuda.get_device_name(device) if device.type == "cuda" else "cpu", "torch": torch.__version__,
            **{k: case[k] for k in CASE_KEYS if k not in ("name", "split", "compile")},
            "model_compute_us": float(sum(est.node_s[i] for i in compute)) * 1e6,
            "kernel_us": sum(us for _, us, _, _ in kernels) / iters,
            "unattributed_us": sum(r["measured_us"] for r in rows if r["status"] == "unattributed"),
            "step_us": measured_step_us, "nodes_costed": len(noded),
            "nodes_matched": sum(r["status"] == "matched" for r in noded),
            "nodes_unmatched": sum(r["status"] == "unmatched" for r in noded)}  # fmt: skip
    return rows, step


def write_csv(path: Path, fields: tuple[str, ...], rows: list[dict[str, Any]]) -> None:
    """Write ``rows`` to ``path`` through a temporary file (a crash leaves the last complete file)."""
    tmp = path.with_suffix(".tmp")
    with open(tmp, "w", newline="") as f:
        w = csv.DictWriter(f, fieldnames=fields)
        w.writeheader()
        w.writerows(rows)
    tmp.replace(path)


def read_cases(path: Path, only: list[str]) -> list[dict[str, Any]]:
    """The cases of a cases file (``{"cases": [...]}``; each ``defaults`` entry filled in), those named in ``only``
    when given; ValueError naming the file and what was expected."""
    data = json.loads(path.read_text())
    if not isinstance(data, dict) or not isinstance(data.get("cases"), list):
        raise ValueError(f"{path}: expected an object with a 'cases' list")
    cases = [{**data.get("defaults", {}), **c} for c in data["cases"]]
    names = [c.get("name") for c in cases]
    unknown = sorted(set(only) - set(names))
    if unknown:
        raise ValueError(f"--only {', '.join(unknown)}: no such case in {path} (it has {', '.join(map(str, names))})")
    return [c for c in cases if not only or c["name"] in only]


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("cases", type=Path)
    ap.add_argument("out_dir", type=Path)
    ap.add_argument("--device", default="cuda")
    ap.add_argument("--hardware", default="h200-sxm", help="the profile the model costs the step on")
    ap.add_argument("--only", action="append", default=[], help="run only this case (repeatable)")
    ap.add_argument("--warmup", type=int, default=2)
    ap.add_argument("--iters", type=int, default=3)
    args = ap.parse_args(argv)
    device = torch.device(args.device)
    if device.type == "cuda" and not torch.cuda.is_available():
        print("train_step_kernels: --device cuda: no CUDA device here (use --device cpu for the CPU proof)",
              file=sys.stderr)  # fmt: skip
        return 2
    try:
        cases = read_cases(args.cases, args.only)
    except (OSError, ValueError) as exc:
        print(f"train_step_kernels: {exc}", file=sys.stderr)
        return 2
    (args.out_dir / "traces").mkdir(parents=True, exist_ok=True)
    all_rows, steps = [], []
    for case in cases:
        t0 = time.perf_counter()
        try:
            rows, step = run_case(case, device, args.hardware, args.out_dir, args.warmup, args.iters)
        except Exception as exc:  # one failing case (out of memory, an op the device lacks) must not lose the rest
            print(f"{case['name']}: FAILED {type(exc).__name__}: {str(exc).splitlines()[0][:300]}", flush=True)
            continue
        all_rows += rows
        steps.append(step)
        write_csv(args.out_dir / "kernels.csv", KERNEL_FIELDS, all_rows)  # after every case: a timeout keeps them
        write_csv(args.out_dir / "steps.csv", STEP_FIELDS, steps)
        print(f"{case['name']}: step {step['step_us']:.0f} us, kernels {step['kernel_us']:.0f} us, model "
              f"{step['model_compute_us']:.0f} us, nodes {step['nodes_matched']}/{step['nodes_costed']} matched "
              f"({time.perf_counter() - t0:.0f} s)", flush=True)  # fmt: skip
    return 0 if len(steps) == len(cases) else 1


if __name__ == "__main__":
    raise SystemExit(main())

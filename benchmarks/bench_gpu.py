"""GPU checks, measured (benchmarks/gpu/, torch only) vs the simulator and the cost model.

    python benchmarks/bench_gpu.py cases benchmarks/data/gpu_decompose_cases.json
    # on a GPU machine: python benchmarks/gpu/decompose_tp_streams.py CASES.json MEASURED.csv
    python benchmarks/bench_gpu.py compare benchmarks/data/gpu_decompose_h100.csv
    # on a GPU machine: python benchmarks/gpu/attention_causal.py MEASURED.csv
    python benchmarks/bench_gpu.py attention benchmarks/data/gpu_attention_h100.csv
    # on a GPU machine: python benchmarks/gpu/train_step_kernels.py benchmarks/data/gpu_train_cases.json OUT_DIR
    python benchmarks/bench_gpu.py train OUT_DIR/kernels.csv

Decomposed TP collectives (issue 18):

``cases`` traces llama3-8b TP+SP prefill (8 ranks, one layer) at two prompt lengths and writes the shapes of its
``all_gather -> mm`` and ``mm -> reduce_scatter`` sites (``decompose_tp.find_tp_sites``). ``compare`` builds, per
site and chunk count, the program ``decompose_tp`` emits, imports it and simulates it: with the cost model's times on
the profile (the communication stand-in timed as the model times a copy of its bytes) and with the kernels' measured
standalone times (per stand-in copy); all against the two-stream times measured on the GPU.
"""

from __future__ import annotations

import argparse
import csv
import json
import sys
from pathlib import Path
from typing import Any

import numpy as np

CHUNKS = (1, 2, 4, 8)
PRESET, PARALLEL, WORLD = "llama3-8b", "tp+sp", 8


def site_cases(seq_lens: tuple[int, ...] = (8192, 4096)) -> list[dict[str, Any]]:
    """The ``ag_mm`` sites of one traced TP+SP prefill layer per prompt length, as the GPU script's cases."""
    from commsched.rewrites.decompose_tp import find_tp_sites
    from commsched.workloads import build

    cases = []
    for seq in seq_lens:
        gm = build(PRESET, parallel=PARALLEL, world_size=WORLD, layers=1, mode="prefill", seq_len=seq).graph_module
        nodes = {n.name: n for n in gm.graph.nodes}
        for site in find_tp_sites(gm):
            mms = [nodes[m] for m in site.matmuls]
            if site.pattern == "mm_ar" or (site.pattern == "mm_rs" and len(mms) != 1):
                continue
            if site.pattern == "ag_mm":
                operand = nodes[site.collective].args[0].meta["val"]  # each rank's shard
            else:
                operand = mms[0].args[0].meta["val"]  # the matmul's left operand, whole
            weights = [int(m.args[1].meta["val"].shape[1]) for m in mms]
            dtype = str(operand.dtype).removeprefix("torch.")
            name = f"seq {seq}: {site.collective} ({site.pattern}: {', '.join(site.matmuls)})"
            cases.append({"name": name, "pattern": site.pattern, "seq_len": seq, "collective": site.collective,
                          "world": WORLD, "rows": int(operand.shape[0]), "hidden": int(operand.shape[1]),
                          "weights": weights, "dtype": dtype, "chunks": list(CHUNKS)})  # fmt: skip
    return cases


def site_program(case: dict[str, Any], chunks: int):
    """The case's site as a traced program (the collective on the world group of a fake 8-rank process group), split
    ``chunks`` ways by ``decompose_tp`` (``m`` for ``ag_mm``, ``n`` for ``mm_rs``); the commsched Graph of it."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from commsched.frontends.fake_pg import fake_process_group
    from commsched.frontends.fx import from_fx
    from commsched.rewrites.decompose_tp import TPSplit, decompose_tp, find_tp_sites

    c10d = torch.ops._c10d_functional
    dtype = getattr(torch, case["dtype"])
    world, rows, hidden, outs = case["world"], case["rows"], case["hidden"], case["weights"]
    with fake_process_group(world) as pg, FakeTensorMode():
        group = pg.group_name
        if case["pattern"] == "ag_mm":

            def step(x, *ws):
                g = c10d.wait_tensor(c10d.all_gather_into_tensor(x, world, group))
                return [torch.mm(g, w.t()) for w in ws]

            args = [torch.empty(rows, hidden, dtype=dtype)] + [torch.empty(n, hidden, dtype=dtype) for n in outs]
        else:

            def step(a, w):
                return c10d.wait_tensor(c10d.reduce_scatter_tensor(torch.mm(a, w.t()), "sum", world, group))

            args = [torch.empty(rows, hidden, dtype=dtype), torch.empty(outs[0], hidden, dtype=dtype)]
        gm = make_fx(step)(*args)
        if chunks > 1:
            (site,) = find_tp_sites(gm)
            gm = decompose_tp(gm, [TPSplit(site.collective, "m" if site.pattern == "ag_mm" else "n", chunks)]).gm
        return from_fx(gm)


def _copy_s(shape: tuple[int, ...], dtype: str, hardware: str) -> float:
    """The cost model's time for a device-to-device copy (``clone``) of a tensor of ``shape``."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from commsched.cost import estimate_costs
    from commsched.frontends.fx import from_fx

    with FakeTensorMode():
        gm = make_fx(lambda t: t.clone())(torch.empty(shape, dtype=getattr(torch, dtype)))
    return float(estimate_costs(from_fx(gm), hardware).node_s.sum())


def predicted_us(case: dict[str, Any], chunks: int, hardware: str, measured_ops: dict[tuple[str, int], float],
                 copies: tuple[str, ...] = ("copy",)) -> dict[str, float]:  # fmt: skip
    """Simulated step (us) of the split program: ``model`` with the cost model's times, and per stand-in copy
    ``copy`` in ``copies`` with the measured kernels' times and that copy's (a kernel the GPU run did not time keeps
    the model's); ``serial_model``: the model's sum (one stream, no overlap)."""
    import dataclasses

    from commsched.cost import estimate_costs
    from commsched.ir import OpKind
    from commsched.sim import simulate_costs

    g = site_program(case, chunks)
    model = estimate_costs(g, hardware)
    coll = np.flatnonzero(g.coll_type >= 0)
    stand_in = tuple(int(d) for d in _comm_shape(case, chunks))
    model_s = model.node_s.copy()
    model_s[coll] = _copy_s(stand_in, case["dtype"], hardware)
    kernels_s = model_s.copy()
    for i in np.flatnonzero(np.isin(g.kinds, (OpKind.COMPUTE, OpKind.OTHER))):
        key = _measured_key(g, int(i), case)
        if key in measured_ops:
            kernels_s[i] = measured_ops[key] * 1e-6
    runs = {"model": model_s}
    for copy in copies:
        runs[copy] = kernels_s.copy()
        runs[copy][coll] = measured_ops[(copy, 0)] * 1e-6
    out = {}
    for name, node_s in runs.items():
        costs = dataclasses.replace(model, node_s=node_s, coll_latency_s=np.zeros(len(g)))
        out[name] = simulate_costs(g, costs).makespan_s * 1e6
    out["serial_model"] = float(model_s.sum()) * 1e6
    return out


def _comm_shape(case: dict[str, Any], chunks: int) -> tuple[int, int]:
    """What the stand-in copies: the gathered chunk (``ag_mm``) or the reduce-scattered product chunk (``mm_rs``)."""
    if case["pattern"] == "ag_mm":
        return case["world"] * case["rows"] // chunks, case["hidden"]
    return case["rows"], case["weights"][0] // chunks


def _measured_key(g, i: int, case: dict[str, Any]) -> tuple[str, int] | None:
    """Which measured kernel node ``i`` is: (``mm`` / ``stack`` / ``cat``, weight index), by op and output width."""
    kind = str(g.targets[i]).split(".")[-2] if str(g.targets[i]).count(".") >= 2 else str(g.targets[i])
    kind = kind.removeprefix("aten.")
    if kind not in ("mm", "stack", "cat"):
        return None
    if case["pattern"] == "mm_rs":
        return (kind, 0)
    buffers = g.buffers(i)
    cols = int(buffers[0].shape[-1]) if buffers else -1
    return (kind, case["weights"].index(cols)) if cols in case["weights"] else None


def read_measured(path: str) -> list[dict[str, Any]]:
    from commsched.io import read_input_text

    return list(csv.DictReader(read_input_text(path, "measured CSV").splitlines()))


COPIES = {"copy": "two_stream", "copy_sm32": "two_stream_sm32"}
"""stand-in copies compared: torch's copy (fills the GPU) and a 32-CTA copy (NCCL-like), with their measured rows"""


def compare_rows(measured: list[dict[str, Any]], cases: list[dict[str, Any]], hardware: str) -> list[dict]:
    """Per case and chunk count: measured programs (``one_stream``, ``two_stream``, ...) and predicted ones
    (``model``; ``copy``, ``copy_sm32``: the simulator on the measured kernels with that stand-in)."""
    rows = []
    for case in cases:
        mine = [r for r in measured if r["case"] == case["name"]]
        for k in case["chunks"]:
            at_k = [r for r in mine if int(r["chunks"]) == k]
            if not at_k:
                continue
            prog = {r["measure"]: float(r["median_us"]) for r in at_k if r["op"] == "program"}
            ops = {(r["op"], int(r["index"])): float(r["median_us"]) for r in at_k if r["measure"] == "op"}
            copies = tuple(c for c in COPIES if (c, 0) in ops)
            pred = predicted_us(case, k, hardware, ops, copies)
            rows.append({"case": case["name"], "pattern": case["pattern"], "chunks": k, "measured": prog,
                         "predicted": pred})  # fmt: skip
    return rows


def kernel_errors(measured: list[dict[str, Any]], cases: list[dict[str, Any]], hardware: str) -> dict[str, list]:
    """Per kernel class (``mm``, ``stack`` / ``cat``, ``copy``): (measured us, model us) of every kernel timed alone."""
    from commsched.cost import estimate_costs
    from commsched.ir import OpKind

    out: dict[str, list] = {"mm": [], "stack / cat": [], "copy": []}
    for case in cases:
        mine = [r for r in measured if r["case"] == case["name"] and r["measure"] == "op"]
        for k in case["chunks"]:
            ops = {(r["op"], int(r["index"])): float(r["median_us"]) for r in mine if int(r["chunks"]) == k}
            if not ops:
                continue
            g = site_program(case, k)
            model_us = estimate_costs(g, hardware).node_s * 1e6
            seen = set()
            for i in np.flatnonzero(np.isin(g.kinds, (OpKind.COMPUTE, OpKind.OTHER))):
                key = _measured_key(g, int(i), case)
                if key in ops and key not in seen:
                    seen.add(key)
                    out["mm" if key[0] == "mm" else "stack / cat"].append((ops[key], float(model_us[i])))
            copy_us = _copy_s(tuple(int(d) for d in _comm_shape(case, k)), case["dtype"], hardware) * 1e6
            out["copy"].append((ops[("copy", 0)], copy_us))
    return out


def compare_table(measured_path: str, hardware: str, cases_path: str) -> str:
    """Markdown table: measured vs predicted per site and chunk count (us, and x the unsplit program), and a
    summary of the simulator's error on the measured kernels."""
    from commsched.io import read_input_json

    measured, cases = read_measured(measured_path), read_input_json(cases_path, "cases")
    rows = compare_rows(measured, cases, hardware)
    meta = measured[0]
    lines = [f"GPU: {meta['gpu']}, driver {meta['driver']}, torch {meta['torch']} (CUDA {meta['cuda']}); "
             f"predicted on `{hardware}`. Each cell: us (x the unsplit program).", "",
             "| site | k | measured, 1 stream | measured, 2 streams: torch copy | simulated on its kernels | "
             "measured, 2 streams: 32-CTA copy | simulated on its kernels | simulated, cost model |",
             "|---|---|---|---|---|---|---|---|"]  # fmt: skip
    first: dict[str, dict[str, Any]] = {}
    errors: dict[str, list[float]] = {c: [] for c in COPIES}
    for r in rows:
        base = first.setdefault(r["case"], r)
        m, p, bm, bp = r["measured"], r["predicted"], base["measured"], base["predicted"]

        def cell(value: float | None, at_one: float | None) -> str:
            return "-" if value is None or not at_one else f"{value:.1f} ({value / at_one:.2f})"

        for copy, measure in COPIES.items():
            if copy in p and measure in m:
                errors[copy].append(p[copy] / m[measure] - 1)
        lines.append(
            f"| {r['case']} | {r['chunks']} | {cell(m.get('one_stream'), bm.get('one_stream'))} | "
            f"{cell(m.get('two_stream'), bm.get('two_stream'))} | {cell(p.get('copy'), bp.get('copy'))} | "
            f"{cell(m.get('two_stream_sm32'), bm.get('two_stream_sm32'))} | "
            f"{cell(p.get('copy_sm32'), bp.get('copy_sm32'))} | {cell(p['model'], bp['model'])} |"
        )
    lines.append("")
    for copy, errs in errors.items():
        if errs:
            e = np.abs(errs)
            lines.append(f"simulated on the measured kernels (`{copy}`): |error| median {100 * np.median(e):.0f} %, "
                         f"worst {100 * e.max():.0f} % over {len(e)} programs")  # fmt: skip
    for name, pairs in kernel_errors(measured, cases, hardware).items():
        err = np.array([model / meas - 1 for meas, model in pairs])
        lines.append(f"cost model vs kernels alone, {name}: model/measured - 1 median {100 * np.median(err):+.0f} %, "
                     f"range {100 * err.min():+.0f} % to {100 * err.max():+.0f} % over {len(err)} kernels")  # fmt: skip
    return "\n".join(lines)


def attention_model_us(row: dict[str, Any], hardware: str) -> float:
    """The cost model's time (us) for one measured flash attention pass (the zoo's ops, traced on fake tensors)."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from commsched.cost import estimate_costs
    from commsched.frontends.fx import from_fx
    from commsched.ir import OpKind

    causal = row["causal"] == "True"
    flash = torch.ops.aten._scaled_dot_product_flash_attention

    def step(q, k, v, grad):
        out = flash(q, k, v, 0.0, causal)
        o, lse, cum_q, cum_k, max_q, max_k, seed, offset, _ = out
        return torch.ops.aten._scaled_dot_product_flash_attention_backward(
            grad, q, k, v, o, lse, cum_q, cum_k, max_q, max_k, 0.0, causal, seed, offset
        )

    shape = tuple(int(row[k]) for k in ("batch", "heads", "seq", "head_dim"))
    with FakeTensorMode():
        gm = make_fx(step)(*(torch.empty(shape, dtype=torch.bfloat16) for _ in range(4)))
    g = from_fx(gm)
    node_s = estimate_costs(g, hardware).node_s
    which = [i for i in range(len(g)) if g.kinds[i] != OpKind.VIEW
             and ("backward" in str(g.targets[i])) == (row["pass"] == "backward") and node_s[i] > 0]  # fmt: skip
    return float(node_s[which].sum()) * 1e6


def causal_block_fraction(row: dict[str, Any], units: int = 132) -> float:
    """The cost model's causal / full ratio for a measured pass: a forward's
    (:func:`commsched.cost.compute.forward_attention_efficiency`, full over causal) or a backward's
    (:func:`commsched.cost.compute.causal_fraction`)."""
    from commsched.cost.compute import causal_fraction, forward_attention_efficiency

    seq, bh = int(row["seq"]), int(row["batch"]) * int(row["heads"])
    if row["pass"] == "backward":
        return causal_fraction(bh, seq // 128, seq // 128, units)
    full, causal = (forward_attention_efficiency(bh, seq, seq, c, units, 128) for c in (False, True))
    return full / causal


def attention_table(measured_path: str, hardware: str) -> str:
    """Markdown table: each measured flash attention pass against the cost model, and causal / not causal."""
    rows = read_measured(measured_path)
    meas = {(r["batch"], r["heads"], r["seq"], r["pass"], r["causal"]): float(r["median_us"]) for r in rows}
    lines = [f"GPU: {rows[0]['gpu']}, torch {rows[0]['torch']}; model: `{hardware}`.", "",
             "| batch x heads x seq (head_dim 128) | pass | measured: not causal / causal (us) | causal / not | "
             "block schedule: causal / not | model: not causal / causal (us) | model / measured: not causal / causal |",
             "|---|---|---|---|---|---|---|"]  # fmt: skip
    for r in rows:
        if r["causal"] != "False":
            continue
        key = (r["batch"], r["heads"], r["seq"], r["pass"])
        m0, m1 = meas[(*key, "False")], meas[(*key, "True")]
        p0 = attention_model_us(r, hardware)
        p1 = attention_model_us({**r, "causal": "True"}, hardware)
        frac = causal_block_fraction(r)
        lines.append(f"| {r['batch']} x {r['heads']} x {r['seq']} | {r['pass']} | {m0:.0f} / {m1:.0f} | "
                     f"{m1 / m0:.2f} | {frac:.2f} | {p0:.0f} / {p1:.0f} | {p0 / m0:.2f} / {p1 / m1:.2f} |")  # fmt: skip
    return "\n".join(lines)


def chunk_model_us(q_len: int, kv_len: int, heads: int, hardware: str) -> float:
    """The cost model's time (us) for a causal flash attention forward of ``q_len`` queries against ``kv_len``
    keys (one sequence, head_dim 128), as a chunk of a split prompt traces it."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from commsched.cost import estimate_costs
    from commsched.frontends.fx import from_fx

    def step(q, k, v):
        return torch.ops.aten._scaled_dot_product_flash_attention(q, k, v, 0.0, True)[0]

    with FakeTensorMode():
        q = torch.empty(1, heads, q_len, 128, dtype=torch.bfloat16)
        k, v = (torch.empty(1, heads, kv_len, 128, dtype=torch.bfloat16) for _ in range(2))
        g = from_fx(make_fx(step)(q, k, v))
    return float(estimate_costs(g, hardware).node_s.sum()) * 1e6


def chunk_table(measured_path: str, hardware: str, heads: int = 4) -> str:
    """Markdown table: a prompt's causal attention forward whole and in chunks, measured (the sum over the chunks)
    against the cost model, each also as x the whole; then the causal mask's check."""
    rows = read_measured(measured_path)
    fwd = [r for r in rows if r["what"] == "forward"]
    lines = [f"GPU: {rows[0]['gpu']}, torch {rows[0]['torch']}; model: `{hardware}`.", "",
             "| chunks | queries x keys per chunk | measured (us) | x whole | model (us) | x whole |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    whole_m = whole_p = 0.0
    for chunks in sorted({int(r["chunks"]) for r in fwd}):
        mine = [r for r in fwd if int(r["chunks"]) == chunks]
        m = sum(float(r["median_us"]) for r in mine)
        p = sum(chunk_model_us(int(r["q_len"]), int(r["kv_len"]), heads, hardware) for r in mine)
        whole_m, whole_p = (m, p) if chunks == 1 else (whole_m, whole_p)
        shapes = ", ".join(f"{r['q_len']} x {r['kv_len']}" for r in mine)
        lines.append(f"| {chunks} | {shapes} | {m:.0f} | {m / whole_m:.2f} | {p:.0f} | {p / whole_p:.2f} |")
    for r in rows:
        if r["what"].endswith("mask"):
            lines.append(
                f"\nFlash attention's causal output ({r['q_len']} queries, {r['kv_len']} keys) against the "
                f"math attention with a {r['what']}: max abs error {float(r['max_abs_err']):.4f}."
            )
    return "\n".join(lines)


GEMM_USES = {"qkv": 1, "output": 1, "gate_up": 2, "down": 1}
"""how many times a layer multiplies by each measured weight shape (gate and up share theirs)"""


def gemm_model_us(m: int, k: int, n: int, hardware: str) -> float:
    """The cost model's time (us) for a bf16 ``[m, k] @ [k, n]``, traced on fake tensors."""
    import torch
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.fx.experimental.proxy_tensor import make_fx

    from commsched.cost import estimate_costs
    from commsched.frontends.fx import from_fx

    with FakeTensorMode():
        a, b = torch.empty(m, k, dtype=torch.bfloat16), torch.empty(k, n, dtype=torch.bfloat16)
        g = from_fx(make_fx(torch.mm)(a, b))
    return float(estimate_costs(g, hardware).node_s.sum()) * 1e6


def gemm_chunk_table(measured_path: str, hardware: str) -> str:
    """Markdown table: one layer's matmuls (:data:`GEMM_USES`) whole and in chunks of the sequence, measured (the
    sum over the chunks) against the cost model, each also as x the whole."""
    rows = read_measured(measured_path)
    whole_rows = max(int(r["m"]) for r in rows)
    lines = [f"GPU: {rows[0]['gpu']}, torch {rows[0]['torch']}; model: `{hardware}`.", "",
             "| chunks | rows per chunk | measured (us) | x whole | model (us) | x whole |",
             "|---|---|---|---|---|---|"]  # fmt: skip
    base: tuple[float, float] | None = None
    for m in sorted({int(r["m"]) for r in rows}, reverse=True):
        chunks = whole_rows // m
        mine = [r for r in rows if int(r["m"]) == m]
        meas = chunks * sum(GEMM_USES[r["weight"]] * float(r["median_us"]) for r in mine)
        model = chunks * sum(GEMM_USES[r["weight"]] * gemm_model_us(m, int(r["k"]), int(r["n"]), hardware)
                             for r in mine)  # fmt: skip
        base = base or (meas, model)
        lines.append(f"| {chunks} | {m} | {meas:.0f} | {meas / base[0]:.2f} | {model:.0f} | {model / base[1]:.2f} |")
    return "\n".join(lines)


# ------------------------------------------------------------------ training steps' kernels (issue 38)

TRAIN_CLASSES = ("matmul", "attention", "elementwise", "reduction", "other")


def train_class_sums(rows: list[dict[str, str]]) -> dict[tuple[str, str, str], dict[str, list[float]]]:
    """Per (case, eager | compiled, split): per kernel class [measured us, model us] per step, from
    ``train_step_kernels.py``'s kernels.csv. A row counts in its model class (the cost model's class of its node;
    a compiled case's per-class model rows), else in its kernels' class (kernels of no costed node, Inductor's)."""
    out: dict[tuple[str, str, str], dict[str, list[float]]] = {}
    for r in rows:
        mode = "compiled" if r["compile"] == "True" else "eager"
        sums = out.setdefault((r["case"], mode, r["split"]), {c: [0.0, 0.0] for c in TRAIN_CLASSES})
        cls = r["model_class"] or r["kernel_class"] or "other"
        sums[cls][0] += float(r["measured_us"] or 0)
        sums[cls][1] += float(r["model_us"] or 0)
    return out


def _ratio(measured: float, model: float) -> str:
    return f"{measured / model:.2f}" if model > 0 and measured > 0 else "-"


def train_table(kernels_path: str) -> str:
    """Markdown: per case and kernel class measured / model (raw), the per-class factors fitted on the ``fit``
    cases of each mode (eager, compiled), and on the ``heldout`` cases the error left after them
    (|measured - factor x model| / measured); then the whole step (CUDA-event step time and summed kernel time)
    against the model's summed compute."""
    sums = train_class_sums(_read_csv(kernels_path))
    steps_path = Path(kernels_path).with_name("steps.csv")
    steps = {r["case"]: r for r in _read_csv(str(steps_path))} if steps_path.exists() else {}
    factor: dict[tuple[str, str], float] = {}
    for mode in ("eager", "compiled"):
        for cls in TRAIN_CLASSES:
            fit = [v[cls] for (_, m, split), v in sums.items() if m == mode and split == "fit"]
            measured, model = sum(f[0] for f in fit), sum(f[1] for f in fit)
            if measured > 0 and model > 0:
                factor[(mode, cls)] = measured / model
    head = "| case | mode | split | " + " | ".join(f"{c} meas/model" for c in TRAIN_CLASSES) + " | step / model |"
    lines = [head, "|" + "---|" * (len(TRAIN_CLASSES) + 4)]
    errors: dict[tuple[str, str], list[float]] = {}
    for (case, mode, split), v in sorted(sums.items(), key=lambda kv: (kv[0][1], kv[0][2], kv[0][0])):
        cells = [_ratio(*v[c]) for c in TRAIN_CLASSES]
        step = steps.get(case)
        whole = _ratio(float(step["step_us"]), float(step["model_compute_us"])) if step else "-"
        lines.append(f"| {case} | {mode} | {split} | " + " | ".join(cells) + f" | {whole} |")
        if split != "heldout":
            continue
        for cls in TRAIN_CLASSES:
            measured, model = v[cls]
            if measured > 0 and model > 0 and (mode, cls) in factor:
                errors.setdefault((mode, cls), []).append(abs(measured - factor[(mode, cls)] * model) / measured)
    lines += ["", "| mode | class | fitted factor (meas/model on fit cases) | held-out cases | median error | "
              "worst error |", "|---|---|---|---|---|---|"]  # fmt: skip
    for (mode, cls), f in sorted(factor.items()):
        err = errors.get((mode, cls), [])
        med = f"{100 * float(np.median(err)):.1f} %" if err else "-"
        worst = f"{100 * max(err):.1f} %" if err else "-"
        lines.append(f"| {mode} | {cls} | {f:.2f} | {len(err)} | {med} | {worst} |")
    devices = sorted({f"{r['gpu']} (torch {r['torch']})" for r in steps.values()})
    lines += ["", f"measured on: {', '.join(devices) or 'unknown (no steps.csv beside the kernels)'}"]
    return "\n".join(lines)


def _read_csv(path: str) -> list[dict[str, str]]:
    with open(path, newline="") as f:
        return list(csv.DictReader(f))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    sub = parser.add_subparsers(dest="command", required=True)
    sub.add_parser("cases", help="write the GPU script's cases").add_argument("out")
    cmp = sub.add_parser("compare", help="measured vs predicted from a GPU run's CSV")
    cmp.add_argument("measured")
    cmp.add_argument("--hardware", default="h100-sxm")
    cmp.add_argument("--cases", default=str(Path(__file__).parent / "data" / "gpu_decompose_cases.json"))
    att = sub.add_parser("attention", help="flash attention measured vs the cost model")
    att.add_argument("measured")
    att.add_argument("--hardware", default="h100-sxm")
    chk = sub.add_parser("chunks", help="a prompt's attention whole and in chunks, measured vs the cost model")
    chk.add_argument("measured")
    chk.add_argument("--hardware", default="h200-sxm")
    gem = sub.add_parser("gemm-chunks", help="a layer's matmuls whole and in chunks, measured vs the cost model")
    gem.add_argument("measured")
    gem.add_argument("--hardware", default="h200-sxm")
    trn = sub.add_parser("train", help="a training step's kernels per class, measured vs the cost model")
    trn.add_argument("kernels", help="kernels.csv of benchmarks/gpu/train_step_kernels.py (steps.csv beside it)")
    args = parser.parse_args(argv)
    if args.command == "train":
        print(train_table(args.kernels))
        return 0
    if args.command == "cases":
        from commsched.io import atomic_write_text

        atomic_write_text(Path(args.out), json.dumps(site_cases(), indent=1) + "\n")
        print(f"wrote {args.out}")
        return 0
    if args.command == "attention":
        print(attention_table(args.measured, args.hardware))
        return 0
    if args.command == "chunks":
        print(chunk_table(args.measured, args.hardware))
        return 0
    if args.command == "gemm-chunks":
        print(gemm_chunk_table(args.measured, args.hardware))
        return 0
    print(compare_table(args.measured, args.hardware, args.cases))
    return 0


if __name__ == "__main__":
    sys.exit(main())

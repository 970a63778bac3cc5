"""``commsched plan``'s terminal report: the ranked layouts and what makes the winner win (exposed communication,
pipeline bubble, recompute), against the runner-up and the best layout without overlap optimisation."""

from __future__ import annotations

from typing import Any

from commsched.report.rates import fmt_mfu, fmt_rate
from commsched.report.tables import new_table
from commsched.report.units import fmt_bytes

COLUMNS = ("#", "layout", "step", "tokens/s/GPU", "MFU", "peak memory", "exposed comm", "bubble", "recompute",
           "framework step")  # fmt: skip


def _ms(seconds: float) -> str:
    return f"{seconds * 1e3:.1f} ms"


def workload_text(req: Any) -> str:
    """What one step runs: the global batch (train), the prompts (prefill) or the sequences decoding."""
    if req.mode == "prefill":
        return f"prefill of {req.batch} prompts x {req.seq} tokens (KV cache {req.kv})"
    if req.mode == "decode":
        return f"decode of {req.batch} sequences attending {req.seq} positions (KV cache {req.kv})"
    return f"global batch {req.batch} x seq {req.seq}"


def plan_table(result: Any, top: int) -> Any:
    """The best ``top`` layouts, best first (a rich Table)."""
    req, hw = result.request, result.hardware
    title = (f"plan: {req.preset} on {req.gpus} x {hw.name} ({hw.compute.hbm_capacity_bytes / 2**30:.0f} GiB), "
             f"{workload_text(req)}")  # fmt: skip
    table = new_table(title, COLUMNS, left=2)
    for rank, j in enumerate(result.ranked[:top], 1):
        table.add_row(str(rank), j.layout.label(), _ms(j.step_s), fmt_rate(j.tokens_per_s_per_gpu), fmt_mfu(j.mfu),
                      fmt_bytes(j.peak_memory_bytes), _ms(j.exposed_comm_s), f"{100 * j.bubble_fraction:.1f} %",
                      _ms(j.recompute_s), _ms(j.framework_step_s))  # fmt: skip
    return table


def _spent(j: Any) -> dict[str, float]:
    return {"exposed comm": j.exposed_comm_s, "bubble": j.bubble_fraction * j.step_s, "recompute": j.recompute_s}


def why_lines(result: Any) -> list[str]:
    """What makes the winner win: its step against the runner-up's and the best framework-order layout's, and
    the seconds each spends on exposed communication, bubbles and recompute (winner minus other)."""
    w = result.winner
    lines = [f"winner: {w.layout.label()}: step {_ms(w.step_s)} ({w.kept}), "
             + ", ".join(f"{k} {_ms(v)}" for k, v in _spent(w).items()) + f"; judged at {w.how}"]  # fmt: skip
    others = (("runner-up", result.runner_up), ("best without overlap optimisation", result.best_without_optimisation))
    for name, other in others:
        if other is None or other.layout == w.layout:
            continue
        mine, theirs = _spent(w), _spent(other)
        diffs = ", ".join(f"{k} {1e3 * (mine[k] - theirs[k]):+.1f} ms" for k in mine)
        lines.append(f"vs {name} ({other.layout.label()}, step {_ms(other.step_s)}, framework order "
                     f"{_ms(other.framework_step_s)}): {100 * (1 - w.step_s / other.step_s):.1f} % faster; "
                     f"{diffs}")  # fmt: skip
    lines.append(f"{result.candidates_judged} layouts judged of {result.enumerated} enumerated "
                 f"({result.pruned_memory} pruned by the memory bound, {result.pruned_bound} by the step bound, "
                 f"{result.over_memory} over HBM when simulated, {len(result.failed)} failed; "
                 f"{result.not_optimised} not optimised: could not beat the best step, or nothing to hide) in "
                 f"{result.wall_s:.1f} s")  # fmt: skip
    if result.request.inference:
        lines += _inference_lines(result)
    v = result.verified
    if v is not None and v.get("error") is None:
        lines.append(f"winner at every layer: step {_ms(v['full_step_s'])} (scaled estimate {_ms(v['scaled_step_s'])}, "
                     f"{100 * v['difference']:+.2f} %)")  # fmt: skip
    elif v is not None:
        lines.append(f"winner at every layer: failed: {v['error']}")
    return lines


def _inference_lines(result: Any) -> list[str]:
    """An inference plan's step is its latency: the winner's against the fastest row's; and why no TOML."""
    from commsched.plan.toml_out import NO_INFERENCE_TOML

    what = "a generated token per sequence" if result.request.mode == "decode" else "the prompts' first token"
    w, fastest = result.winner, min(result.ranked, key=lambda j: j.step_s)
    line = f"latency (the step: {what}): winner {_ms(w.step_s)}"
    if fastest.layout != w.layout:
        line += (f"; lowest {_ms(fastest.step_s)} ({fastest.layout.label()}, "
                 f"{fmt_rate(fastest.tokens_per_s_per_gpu)} tokens/s/GPU)")  # fmt: skip
    return [line, NO_INFERENCE_TOML]


def explain_lines(explained: Any) -> list[str]:
    """``plan --explain``: the given layout's step and what it spends, then each change with its simulated gain in
    tokens/s per GPU, best first (those over the HBM and those that failed said so)."""
    b = explained.base
    if b.error is not None:
        return [f"{b.layout.label()}: could not be judged: {b.error}"]
    over = "" if b.fits else " (over the HBM)"
    spent = ", ".join(f"{k} {_ms(v)}" for k, v in _spent(b).items())
    lines = [f"{b.layout.label()}: step {_ms(b.step_s)}, {fmt_rate(b.tokens_per_s_per_gpu)} tokens/s/GPU, peak "
             f"{fmt_bytes(b.peak_memory_bytes)}{over}; {spent}"]  # fmt: skip
    for c in explained.changes:
        if c.error is not None:
            lines.append(f"  {c.what}: could not be judged: {c.error}")
            continue
        spent = ", ".join(f"{k} {1e3 * (v - _spent(b)[k]):+.1f} ms" for k, v in _spent(c).items())
        over = "" if c.fits else f" (over the HBM: {fmt_bytes(c.peak_memory_bytes)})"
        lines.append(f"  {100 * c.gain(b):+6.1f} %  {c.what}: step {_ms(c.step_s)}, peak "
                     f"{fmt_bytes(c.peak_memory_bytes)}{over}; {spent}")  # fmt: skip
    return lines


def plan_html(result: Any, top: int) -> str:
    """``plan --html``: the ranked table and, for the winner, the breakdown against the runner-up and the best layout
    without overlap optimisation (a self-contained page)."""
    import html

    from commsched.report.html import html_table, page_head

    req, hw = result.request, result.hardware
    rows = [[rank, j.layout.label(), _ms(j.step_s), fmt_rate(j.tokens_per_s_per_gpu), fmt_mfu(j.mfu),
             fmt_bytes(j.peak_memory_bytes), _ms(j.exposed_comm_s), f"{100 * j.bubble_fraction:.1f} %",
             _ms(j.recompute_s), _ms(j.framework_step_s)] for rank, j in enumerate(result.ranked[:top], 1)]  # fmt: skip
    named = [("winner", result.winner), ("runner-up", result.runner_up),
             ("best without overlap optimisation", result.best_without_optimisation)]  # fmt: skip
    breakdown = [[name, j.layout.label(), _ms(j.step_s), *(_ms(v) for v in _spent(j).values()), j.kept, j.how]
                 for name, j in named if j is not None]  # fmt: skip
    context = {"GPUs": req.gpus, "hardware": hw.name, "step": workload_text(req),
               "judged": result.candidates_judged, "enumerated": result.enumerated}  # fmt: skip
    parts = page_head(f"commsched plan: {req.preset}", context)
    parts += ["<h2>Ranked layouts</h2>", html_table(list(COLUMNS), rows, numeric_from=2)]
    parts += ["<h2>What makes the winner win</h2>",
              html_table(["", "layout", "step", *_spent(result.winner), "kept", "judged at"], breakdown,
                         numeric_from=2, text=("kept", "judged at"))]  # fmt: skip
    parts += [f"<p>{html.escape(line)}</p>" for line in why_lines(result)]
    return "\n".join([*parts, "</body></html>"])

"""The pipeline simulator's event loop, Python (``pipeline/engine.py``) against compiled (``pipeline/engine_jit.py``):
CPU time of ``simulate_program`` on torch's lowered schedules (best of 5 after two warm-up runs each, one process),
the compiled loop alone and the stage tables it starts from.

Usage: python benchmarks/bench_pipeline_engine.py
"""

from __future__ import annotations

import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parents[1] / "src"))

import numpy as np

CASES = [("ZBVZeroBubble", 16, 64, 2), ("Interleaved1F1B", 8, 32, 2), ("1F1B", 8, 32, 1)]


def _costs(p: int, v: int, rng: np.random.Generator):
    from commsched.pipeline import StageCosts

    s = p * v
    return StageCosts(forward_s=rng.uniform(1e-3, 3e-3, s), backward_input_s=rng.uniform(1e-3, 3e-3, s),
                      backward_weight_s=rng.uniform(1e-3, 3e-3, s), send_bytes=rng.integers(1 << 20, 1 << 26, s),
                      activation_bytes=1 << 28, static_bytes=1 << 30, unshard_s=1e-3, reduce_grad_s=2e-3)  # fmt: skip


def _cpu_s(fn) -> float:
    t = time.process_time()
    fn()
    return time.process_time() - t


def _case(name: str, p: int, m: int, v: int, rng: np.random.Generator) -> str:
    from commsched.hardware import for_graph
    from commsched.pipeline import engine_jit, lower_schedule, simulate_program
    from commsched.pipeline.costs import p2p_times_ns, stage_times
    from commsched.sim import jit
    from commsched.sim.model import StreamModel

    prog, costs = lower_schedule(name, p, m, v), _costs(p, v, rng)

    def run():
        return simulate_program(prog, costs, "h100-sxm", ranks_between_stages=32)

    best = {}
    for enabled in (False, True):
        jit.ENABLED = enabled
        run(), run()
        best[enabled] = min(_cpu_s(run) for _ in range(5))
    times = stage_times(costs, prog)
    xfer = p2p_times_ns(prog, times.send_bytes, "h100-sxm", 32)
    model = StreamModel(compute_slowdown=float(for_graph("h100-sxm", world_size=p * 32).compute_slowdown))
    loop = min(_cpu_s(lambda: engine_jit.run_compiled(prog, times, xfer, model)) for _ in range(5))
    rows = sum(len(a) for a in prog.actions)
    return (
        f"{name} P={p} M={m} V={v} ({rows} rows): simulate_program Python {best[False] * 1e3:.1f} ms, "
        f"compiled {best[True] * 1e3:.1f} ms (x{best[False] / best[True]:.1f}); the loop alone {loop * 1e3:.1f} ms"
    )


def main() -> None:
    rng = np.random.default_rng(0)
    for case in CASES:
        print(_case(*case, rng))


if __name__ == "__main__":
    main()

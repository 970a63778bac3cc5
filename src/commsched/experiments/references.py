"""What an optimised step is judged against, in the same run with the same costs and simulator.

* **The framework** (what the user runs today): the ``framework`` pass (``passes/baselines/framework.py``: FSDP2's
  one-unit prefetch, DDP's bucket overlap, else torch.compile's default order) on the program the framework runs.
  For a zoo step with FSDP that is the step traced with one all_gather / reduce_scatter per FSDP unit
  (``fsdp_bucket="block"``, as ``fully_shard`` on each block groups its parameters), not the per-parameter trace the
  search starts from.
* **torch's best configuration**: torch's ``schedule_overlap_bucketing`` plain, with collective bucketing, and with
  FSDP pre-bucketing + bucketing (``peers/torch_overlap.py``, fed our costs), each rewritten program re-imported,
  costed and simulated here; the fastest valid one.
* **The traced order**: the program as traced, with every collective waited where it was issued. No framework runs
  it; it is kept as a detail.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from commsched.hardware import Hardware
from commsched.ir import Graph
from commsched.sim import SimResult

TORCH_CONFIGS: tuple[tuple[str, dict[str, Any]], ...] = (
    ("torch plain", {"bucket": False}),
    ("torch bucketing", {"bucket": True, "pre_bucketing_fsdp_collectives": False}),
    ("torch pre-bucketing + bucketing", {"bucket": True}),
)
"""torch's ``schedule_overlap_bucketing`` configurations (identical in torch 2.13-2.15), as
``run_torch_overlap_scheduler`` knobs"""


@dataclass(frozen=True)
class Reference:
    """One reference step: its label, what it is (``"framework"``, ``"torch"``, ``"traced"``), its simulation
    (None when it could not be built, with the reason in ``note``) and the wall time it took."""

    label: str
    kind: str
    sim: SimResult | None
    note: str = ""
    wall_s: float | None = None

    def to_dict(self) -> dict[str, Any]:
        s = self.sim
        return {
            "label": self.label,
            "kind": self.kind,
            "step_s": None if s is None else s.makespan_s,
            "exposed_comm_s": None if s is None else s.exposed_comm_s,
            "peak_memory_bytes": None if s is None else s.peak_memory_bytes,
            "collectives": None if s is None else len(s.graph.collectives),
            "note": self.note,
            "wall_s": self.wall_s,
        }


@dataclass(frozen=True)
class References:
    """The three references of one step (see the module docstring)."""

    traced: Reference
    framework: Reference
    torch: tuple[Reference, ...] = field(default_factory=tuple)

    @property
    def torch_best(self) -> Reference | None:
        """The fastest of torch's configurations that ran and gave a valid order (None if none did)."""
        ran = [r for r in self.torch if r.sim is not None]
        return min(ran, key=lambda r: r.sim.makespan_s) if ran else None

    def to_dict(self) -> dict[str, Any]:
        best = self.torch_best
        return {
            "traced": self.traced.to_dict(),
            "framework": self.framework.to_dict(),
            "torch": [r.to_dict() for r in self.torch],
            "torch_best": None if best is None else best.label,
        }


def framework_program(preset: str, build_kwargs: dict[str, Any]) -> Any | None:
    """The zoo step as the framework runs it, when that differs from the search's program: with FSDP, the trace with
    one collective per FSDP unit (``fsdp_bucket="block"``); None otherwise (the search's program is the framework's)."""
    from commsched.workloads import build

    if "fsdp" not in str(build_kwargs.get("parallel", "")) or build_kwargs.get("fsdp_bucket") == "block":
        return None
    return build(preset, **{**build_kwargs, "fsdp_bucket": "block"})


def _framework_reference(graph: Graph, hw: Hardware) -> Reference:
    from commsched.cost import estimate_costs
    from commsched.passes import schedule
    from commsched.passes.baselines.framework import framework_label
    from commsched.sim import simulate_costs

    t0 = time.perf_counter()
    costs = estimate_costs(graph, hw)
    s = schedule(graph, costs, "framework")
    sim = simulate_costs(graph, costs, s.order)
    return Reference(framework_label(graph), "framework", sim, "; ".join(s.stats[0].notes), time.perf_counter() - t0)


def _torch_reference(label: str, knobs: dict[str, Any], gm: Any, graph: Graph, hw: Hardware) -> Reference:
    from commsched.cost import estimate_costs
    from commsched.frontends.fx import from_fx
    from commsched.peers import run_torch_overlap_scheduler
    from commsched.sim import simulate_costs

    costs = estimate_costs(graph, hw)
    try:
        r = run_torch_overlap_scheduler(gm, graph, costs, **knobs)
    except Exception as exc:  # a configuration torch cannot run on this program is a row, not a crash
        return Reference(label, "torch", None, f"failed: {type(exc).__name__}: {str(exc).splitlines()[0]}")
    if r.valid is False:
        return Reference(label, "torch", None, f"invalid order: {r.invalid_reason}", r.wall_s)
    if not knobs.get("bucket", True):  # a permutation of this program: simulate the order as it is
        return Reference(label, "torch", simulate_costs(graph, costs, np.asarray(r.order)), "", r.wall_s)
    g2 = from_fx(r.gm, group_sizes=graph.group_sizes(), meta=graph.meta)
    return Reference(label, "torch", simulate_costs(g2, estimate_costs(g2, hw)), "", r.wall_s)


def reference_steps(
    graph: Graph,
    hw: Hardware,
    *,
    gm: Any = None,
    framework_graph: Graph | None = None,
    torch: bool = True,
    progress: Callable[[str], None] | None = None,
) -> References:
    """The references of ``graph`` on ``hw`` (a cluster, as ``hardware.for_graph`` gives): the traced order, the
    framework's order on ``framework_graph`` (default: ``graph``) and, with ``gm`` (the FX module ``graph`` was
    imported from) and ``torch``, torch's three configurations."""
    from commsched.cost import estimate_costs
    from commsched.sim import simulate_costs

    say = progress or (lambda _msg: None)
    traced = Reference("traced order", "traced", simulate_costs(graph, estimate_costs(graph, hw)))
    say("the framework's order")
    framework = _framework_reference(framework_graph if framework_graph is not None else graph, hw)
    rows: list[Reference] = []
    if gm is not None and torch:
        for label, knobs in TORCH_CONFIGS:
            say(label)
            rows.append(_torch_reference(label, knobs, gm, graph, hw))
    return References(traced, framework, tuple(rows))

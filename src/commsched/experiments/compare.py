"""Side-by-side comparison of schedulers on one graph: the input order, each seed pass, our ``overlap`` scheduler,
the CP-SAT optimum where feasible and torch's own OverlapScheduler (when the FX GraphModule is available), every
order simulated by the same simulator with the same costs, so the table compares schedulers, not cost models. With
the GraphModule (and ``programs``), also the schedulers that change the program: torch with collective bucketing,
torch with FSDP pre-bucketing + bucketing, and ``commsched.optimize``, each rewritten program costed by the same model
on the same hardware."""

from __future__ import annotations

import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any

import numpy as np

from commsched.cost.model import CostEstimate
from commsched.experiments.references import TORCH_CONFIGS
from commsched.ir import Graph

SEED_PASSES = (
    "sink_waits",
    "raise_comms",
    "reorder_compute_for_overlap",
    "reorder_communication_preserving_peak_memory",
    "sink_waits_iterative",
)


@dataclass
class CompareRow:
    scheduler: str
    makespan_s: float | None = None
    exposed_comm_s: float | None = None
    overlap_ratio: float | None = None
    peak_memory_bytes: int | None = None
    wall_s: float | None = None
    gap_to_bound: float | None = None  # makespan / lower bound - 1
    note: str = ""


@dataclass
class CompareResult:
    rows: list[CompareRow]
    lower_bound_s: float
    bound_binding: str
    input_peak_bytes: int
    meta: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        return {
            "lower_bound_s": self.lower_bound_s,
            "bound_binding": self.bound_binding,
            "input_peak_bytes": self.input_peak_bytes,
            "meta": self.meta,
            "rows": [asdict(r) for r in self.rows],
        }

    def row(self, name: str) -> CompareRow:
        return next(r for r in self.rows if r.scheduler == name)


def compare_schedulers(
    graph: Graph,
    costs: CostEstimate,
    *,
    gm: Any = None,
    seed_passes: tuple[str, ...] = SEED_PASSES,
    exact_max_nodes: int = 300,
    exact_time_limit_s: float = 20.0,
    torch_knobs: dict[str, Any] | None = None,
    progress: Callable[[str], None] | None = None,
    programs: bool = True,
) -> CompareResult:
    """Run every scheduler on ``graph`` and simulate each order; see the module docstring. ``programs``: also the
    program-changing rows (needs ``gm`` and ``costs`` estimated from a hardware profile)."""
    from commsched.passes import MemoryBudget, schedule
    from commsched.sim import simulate_costs

    say = progress or (lambda _msg: None)
    base = simulate_costs(graph, costs)
    lb = base.lower_bound_s
    rows: list[CompareRow] = []

    def add(name: str, order: np.ndarray | None, wall: float | None, note: str = "", streams=None) -> None:
        if order is None:
            rows.append(CompareRow(name, wall_s=wall, note=note))
            return
        res = simulate_costs(graph, costs, order, streams)
        rows.append(
            CompareRow(
                scheduler=name,
                makespan_s=res.makespan_s,
                exposed_comm_s=res.exposed_comm_s,
                overlap_ratio=res.overlap_ratio,
                peak_memory_bytes=res.peak_memory_bytes,
                wall_s=wall,
                gap_to_bound=res.makespan_s / lb - 1.0 if lb > 0 else None,
                note=note,
            )
        )

    add("input order", np.arange(len(graph), dtype=np.int32), None)
    runs: list[tuple[str, list[str], dict[str, Any]]] = [(p, [p], {}) for p in seed_passes]
    runs.append(("torch passes (seed preset)", ["torch"], {}))
    runs.append(("overlap (ours)", ["overlap"], {}))
    runs.append(("overlap (ours, reorder_collectives)", ["overlap"], {"reorder_collectives": True}))
    for name, passes, knobs in runs:
        say(name)
        t0 = time.perf_counter()
        try:
            s = schedule(graph, costs, passes, **knobs)
        except Exception as exc:  # a pass that cannot handle this graph is a row, not a crash
            add(name, None, time.perf_counter() - t0, note=f"failed: {exc}")
            continue
        add(name, s.order, time.perf_counter() - t0, streams=s.streams)
    if len(graph) <= exact_max_nodes:
        say("exact (CP-SAT)")
        from commsched.memory import memory_profile
        from commsched.passes.exact import solve_exact

        ours = schedule(graph, costs, "default").order
        t0 = time.perf_counter()
        try:
            res = solve_exact(
                graph,
                costs,
                memory_budget_bytes=int(memory_profile(graph).peak_bytes * 1.05),
                time_limit_s=exact_time_limit_s,
                hint=ours,
            )
            add(
                "exact (CP-SAT)",
                res.order,
                time.perf_counter() - t0,
                note=f"{res.status}; proven bound {res.lower_bound_s * 1e3:.3f} ms (no interference/link sharing)",
            )
        except RuntimeError as exc:
            add("exact (CP-SAT)", None, time.perf_counter() - t0, note=str(exc))
    if gm is not None:
        say("torch OverlapScheduler")
        from commsched.peers import run_torch_overlap_scheduler

        try:
            tp = run_torch_overlap_scheduler(gm, graph, costs, **(torch_knobs or {}))
            note = "" if tp.valid else f"invalid: {tp.invalid_reason}"
            add("torch OverlapScheduler", tp.order, tp.wall_s, note=note)
            torch_peak = rows[-1].peak_memory_bytes
            if torch_peak is not None and tp.valid:
                # the same memory: ours with torch's peak as its hard budget, so neither wins by spending memory
                say("overlap at torch's peak")
                t0 = time.perf_counter()
                try:
                    s = schedule(
                        graph,
                        costs,
                        "overlap",
                        reorder_collectives=True,
                        memory_budget=MemoryBudget(bytes=torch_peak),
                    )
                    add("overlap (ours, reorder, torch's peak as budget)", s.order, time.perf_counter() - t0)
                except Exception as exc:
                    add("overlap (ours, reorder, torch's peak as budget)", None, None, note=f"failed: {exc}")
        except Exception as exc:
            add("torch OverlapScheduler", None, None, note=f"failed: {type(exc).__name__}: {exc}")
        if programs:
            rows.extend(program_rows(graph, costs, gm, lb, torch_knobs or {}, say))
    return CompareResult(rows, lb, base.bound.binding, base.peak_memory_bytes)


PROGRAM_CONFIGS = tuple(
    (f"torch OverlapScheduler, {label.removeprefix('torch ')}", knobs)
    for label, knobs in TORCH_CONFIGS
    if knobs["bucket"]
)
"""torch's configurations that change the program (its collectives), besides the plain scheduler above"""


def program_rows(graph: Graph, costs: CostEstimate, gm: Any, lower_bound_s: float, torch_knobs: dict, say) -> list:
    """Rows for the schedulers that change the program: torch's bucketing configurations and ``optimize``. Each
    rewritten program is re-imported, costed on the hardware ``costs`` was estimated for (our collective model for
    the merged collectives) and simulated; the note gives its collectives and its own lower bound ("vs bound" is
    against the traced program's)."""
    from commsched.cost import estimate_costs
    from commsched.frontends.fx import from_fx
    from commsched.optimize import optimize
    from commsched.peers import run_torch_overlap_scheduler
    from commsched.rewrites.bucket_plan import resolve_hardware
    from commsched.sim import simulate_costs

    try:
        hw = resolve_hardware(costs)
    except ValueError as exc:  # hand-made costs: nothing to cost a rewritten program with
        return [CompareRow(name, note=f"skipped: {exc}") for name, _ in PROGRAM_CONFIGS]
    sizes = graph.group_sizes()

    def row(name: str, g, sim, wall: float | None) -> CompareRow:
        note = f"{len(g.collectives)} collectives; this program's bound {sim.lower_bound_s * 1e3:.3f} ms"
        gap = sim.makespan_s / lower_bound_s - 1.0 if lower_bound_s > 0 else None
        return CompareRow(name, sim.makespan_s, sim.exposed_comm_s, sim.overlap_ratio, sim.peak_memory_bytes, wall,
                          gap, note)  # fmt: skip

    out = []
    for name, knobs in PROGRAM_CONFIGS:
        say(name)
        try:
            r = run_torch_overlap_scheduler(gm, graph, costs, **knobs, **torch_knobs)
            g2 = from_fx(r.gm, group_sizes=sizes, meta=graph.meta)
            out.append(row(name, g2, simulate_costs(g2, estimate_costs(g2, hw)), r.wall_s))
        except Exception as exc:  # a configuration torch cannot run on this graph is a row, not a crash
            out.append(CompareRow(name, note=f"failed: {type(exc).__name__}: {str(exc).splitlines()[0]}"))
    say("optimize (ours)")
    o = optimize(gm, hw, group_sizes=sizes)
    out.append(row("optimize (ours)", o.graph, o.after, o.wall_s))
    return out


COMPARE_FN = "commsched.experiments.compare:compare_task"


def compare_task(spec: dict[str, Any]) -> dict[str, Any]:
    """One target of :func:`compare_many`, on any worker: the graph (sent as its JSON dict) or the preset (traced
    here), costed on the profile (sent as a ``Hardware``) and compared; ``{"target", "result"}`` or
    ``{"target", "error"}``, plain data."""
    from commsched.cost import estimate_costs
    from commsched.execute.base import error_text, versions
    from commsched.hardware import for_graph, nodes_for_world, world_size_of

    stage = "trace"
    try:
        if spec["graph"] is not None:
            from commsched.frontends.json_io import graph_from_dict

            graph, gm = graph_from_dict(spec["graph"], spec["target"]), None
        else:
            from commsched.workloads import build

            w = build(spec["target"], **spec["build"])
            graph, gm = w.graph, (w.graph_module if spec["torch"] else None)
        stage = "compare"
        profile = spec["hardware"]
        nodes = spec["num_nodes"] or nodes_for_world(world_size_of(graph) or 1, profile.gpus_per_node)
        hw = for_graph(profile, num_nodes=nodes)
        result = compare_schedulers(graph, estimate_costs(graph, hw), gm=gm, **spec["knobs"])
    except Exception as exc:  # one target that fails must not sink the others
        return {"target": spec["target"], "error": error_text(stage, exc)}
    result.meta.update({"target": spec["target"], "hardware": spec["hardware_name"], "num_nodes": hw.num_nodes,
                        "nodes": len(graph), **versions()})  # fmt: skip
    return {"target": spec["target"], "result": result.to_dict()}


def compare_many(
    targets: list[str],
    *,
    hardware: str,
    num_nodes: int | None = None,
    build: dict[str, Any] | None = None,
    torch_peer: bool = True,
    executor: Any = None,
    **knobs: Any,
) -> list[dict[str, Any]]:
    """:func:`compare_schedulers` on several graphs (JSON files, read here and sent by content) or zoo presets
    (traced on the worker with ``build`` options), each a task on ``executor`` (default: the local pool); one
    ``{"target", "result"}`` (``CompareResult.to_dict()``) or ``{"target", "error"}`` per target, in order.
    ``knobs``: ``exact_max_nodes``, ``exact_time_limit_s``. The CP-SAT row stops at a wall-clock limit, so it is
    outside the every-backend-agrees guarantee; the other rows are pure functions of the target."""
    from pathlib import Path

    from commsched import hardware as hw_profiles
    from commsched.execute.local import LocalExecutor
    from commsched.frontends.json_io import graph_to_dict, load_graph

    profile = hw_profiles.get(hardware)  # resolved here: a user profile travels by content
    specs = []
    for target in targets:
        graph = graph_to_dict(load_graph(target)) if Path(target).exists() else None
        specs.append({"target": target, "graph": graph, "build": build or {}, "torch": torch_peer, "knobs": knobs,
                      "hardware": profile, "hardware_name": hardware, "num_nodes": num_nodes})  # fmt: skip
    own = executor is None
    executor = LocalExecutor() if own else executor
    try:
        return executor.map(COMPARE_FN, specs, fail=lambda spec, text: {"target": spec["target"], "error": text})
    finally:
        if own:
            executor.close()


def result_from_dict(data: dict[str, Any]) -> CompareResult:
    """The inverse of :meth:`CompareResult.to_dict`."""
    rows = [CompareRow(**r) for r in data["rows"]]
    return CompareResult(rows, data["lower_bound_s"], data["bound_binding"], data["input_peak_bytes"], data["meta"])

"""What a variant family of :func:`commsched.optimize` may know: the one module every family imports.

A **family** (one module under :mod:`commsched.optimize.families`, one line in its registry) proposes programs that
differ from the traced one (bucketed, split, decomposed, with fewer gathers). Given the search's :class:`State` (the
traced program, the variants so far with the incumbent among them, the memory budget, the cost function), it returns
a list in the order the report lists them: :class:`Variant` s (scheduled and simulated, by the core's :class:`Judge`)
and :class:`Tried` verdicts for what it did not build or the core pruned, each saying why (with the bound that
pruned it). A family builds programs; the core judges them: it probes candidates (:data:`PROBE`), picks and prunes
finalists by lower bound, runs the full ``overlap`` search, runs the work on an executor where one is given, and
keeps the fastest variant within the budget. A family imports this module and the layers below ``optimize``
(``ir``, ``cost``, ``rewrites``, ``sim``), never another family or the core.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any, Protocol

from commsched.cost import CostEstimate
from commsched.ir import Graph
from commsched.passes import Schedule, ScheduleError, schedule
from commsched.sim import SimResult, simulate_costs

PROBE = {"variants": (("input", True),), "max_peak_repairs": 0, "budget_retries": 0, "reorder_collectives": False}
"""the first judgement of a candidate: one list-scheduling attempt that keeps the program order's priorities under
the future-aware memory guard (it nearly always fits), about a fifth of the full search. Simulating a bucket plan in
the order it was planned on instead misjudges plans that only pay off once rescheduled (e.g. llama3-70b FSDP+TP at
512 ranks under torch's peak: it pruned the plan that wins by 2.5 %)"""
NO_INCUMBENT_NS = 2**62
"""the incumbent step before any variant fits the budget: prunes nothing"""


@dataclasses.dataclass
class Tried:
    """One program variant the search simulated, and what became of it."""

    label: str
    collectives: int | None
    """collectives in the variant's program (None: not built, e.g. the same plan as another)"""
    makespan_s: float | None = None
    peak_memory_bytes: int | None = None
    verdict: str = ""
    """'kept', or why it lost: slower than the kept one, over the memory budget, the same plan as another, failed"""
    probe_s: float | None = None
    """a candidate's step time after the one-attempt probe (:data:`PROBE`) that ranks candidates for the full search"""

    def __str__(self) -> str:
        """One line in human units, naming only what was measured: ``label: verdict (34 collectives, step ...)``."""
        from commsched.report.units import fmt_bytes, fmt_seconds

        figures = (
            (self.collectives, lambda n: f"{n} collectives"),
            (self.probe_s, lambda t: f"probe {fmt_seconds(t)}"),
            (self.makespan_s, lambda t: f"step {fmt_seconds(t)}"),
            (self.peak_memory_bytes, lambda b: f"peak {fmt_bytes(b)}"),
        )
        shown = ", ".join(show(v) for v, show in figures if v is not None)
        return f"{self.label}: {self.verdict}" + (f" ({shown})" if shown else "")


@dataclasses.dataclass
class Variant:
    """A program the search scheduled and simulated, with its lineage: ``family`` (the registry name of the family
    that built it; "" for the traced program) and ``plan``, how it was made from the traced module (an object with
    ``apply_fx(gm, graph)`` giving the module to keep, e.g. a :class:`BucketedPlan`; None: the traced program)."""

    label: str
    graph: Graph
    costs: CostEstimate
    schedule: Schedule
    sim: SimResult
    plan: Any = None
    probe_s: float | None = None
    family: str = ""

    def built(self) -> Variant:
        """The variant with its graph and schedule (a stand-in judged on an executor's worker builds them here)."""
        return self


@dataclasses.dataclass
class BucketedPlan:
    """A program's collectives merged by a bucket plan (:func:`commsched.rewrites.plan_buckets`, planned on
    ``order``; None: the program order) — the plan of a bucketed variant, and the bucketing other families apply
    after their own transform. Its FX rewrite is built once (:meth:`module`)."""

    plan: Any
    order: Any = None
    _module: Any = dataclasses.field(default=None, repr=False, compare=False)

    @property
    def config(self) -> Any:
        """The :class:`commsched.rewrites.BucketConfig` the plan was made with."""
        return self.plan.config

    def module(self, gm: Any, graph: Graph) -> Any:
        """The FX rewrite of ``gm`` (IR ``graph``) by this plan, built once, not recompiled (node names as on the IR,
        see :mod:`commsched.rewrites.bucket_graph`)."""
        from commsched.rewrites import apply_bucket_plan

        if self._module is None:
            self._module = apply_bucket_plan(gm, graph, self.plan, self.order, recompile=False).gm
        return self._module

    def take_module(self, gm: Any, graph: Graph) -> Any:
        """:meth:`module`, handed over: the caller rewrites it in place, so it is no longer this plan's program."""
        out, self._module = self.module(gm, graph), None
        return out

    def apply_fx(self, gm: Any, graph: Graph) -> Any:
        return self.module(gm, graph)

    def __getstate__(self) -> dict:
        return {**self.__dict__, "_module": None}  # to a worker: the plan, not a module


@dataclasses.dataclass
class ModulePlan:
    """A program given as its own module (a retraced step, e.g. split into micro-batches), and the bucket plan
    applied after it, if any (``buckets`` on ``graph``, the module's IR)."""

    gm: Any
    buckets: BucketedPlan | None = None
    graph: Graph | None = None

    def apply_fx(self, gm: Any, graph: Graph) -> Any:
        """The module (``gm`` / ``graph``, the traced step, are what it was made from), bucketed if planned."""
        return self.gm if self.buckets is None else self.buckets.module(self.gm, self.graph)


@dataclasses.dataclass
class Candidate:
    """A program a family proposes for the probe: its ``label``, its ``plan`` (kept as the variant's), and its IR and
    costs (``build()``, called once by the judge). ``group``: finalists are chosen per group (e.g. the order a bucket
    plan was made on). ``recipe``: (task function ``"module:name"``, payload) that builds the IR on an executor's
    worker (``fn(payload) -> Graph``; costed there alike), where a family can offer it."""

    label: str
    plan: Any
    build: Callable[[], tuple[Graph, CostEstimate]]
    group: str = "all"
    recipe: tuple[str, Any] | None = None


@dataclasses.dataclass
class Probed:
    """A candidate after its probe: the probe's step (ns), its place among the probed (ties: the earlier wins),
    its collectives, its program's lower bound (ns), the probe's peak (bytes), and its IR and costs where built
    here (None: on an executor's worker)."""

    ns: int
    index: int
    candidate: Candidate
    collectives: int
    bound_ns: int
    peak_bytes: int
    graph: Graph | None = None
    costs: CostEstimate | None = None


@dataclasses.dataclass
class State:
    """What a family sees of the search: the traced module ``gm`` (None: a Graph was given, no rewrite possible) and
    its IR ``graph`` with ``costs``; ``cost``, the function that costs any program alike; ``hw``; the scheduling
    ``knobs`` (``reorder_collectives``, ``memory_budget``: absolute); ``finalists`` per group; ``granularities``,
    the bucket caps; and ``variants``, everything judged so far (the traced program first)."""

    gm: Any
    graph: Graph
    costs: CostEstimate
    cost: Callable[[Graph], CostEstimate]
    hw: Any
    knobs: dict
    finalists: int
    granularities: tuple
    variants: list = dataclasses.field(default_factory=list)

    @property
    def limit_bytes(self) -> int:
        """The memory budget: no variant above it may be kept."""
        return self.knobs["memory_budget"].bytes

    @property
    def suffix(self) -> str:
        """What a fully scheduled candidate's label adds to its probe's."""
        return ", collectives reordered" if self.knobs.get("reorder_collectives") else ""

    def fastest(self, variants: list | None = None, family: str | None = None) -> Variant | None:
        """The fastest variant within the budget among ``variants`` (default: all so far), of ``family`` if given."""
        fits = [v for v in (self.variants if variants is None else variants) if isinstance(v, Variant)
                and (family is None or v.family == family) and v.sim.peak_memory_bytes <= self.limit_bytes]  # fmt: skip
        return min(fits, key=lambda v: v.sim.makespan_ns, default=None)

    def incumbent_ns(self, variants: list | None = None) -> int:
        """The fastest step within the budget so far (ns), or :data:`NO_INCUMBENT_NS`."""
        best = self.fastest(variants)
        return NO_INCUMBENT_NS if best is None else best.sim.makespan_ns

    def bucketing(self, variants: list | None = None) -> tuple | None:
        """(bucket config, its label, e.g. ``cap 0.9``) of the fastest bucketed variant within the budget, or None:
        the bucketing other families apply after their transform."""
        best = self.fastest(variants, family=BUCKETING)
        if best is None:
            return None
        return best.plan.config, best.label.split("(", 1)[1].split(", planned on")[0]


BUCKETING = "bucketing"
"""the registry name of the bucketing family, whose variants other families build on (:meth:`State.bucketing`)"""


class Judge(Protocol):
    """The core's judging, as a family calls it (one implementation per executor: the same verdicts)."""

    def scheduled(self, label: str, g: Graph, costs: CostEstimate, plan: Any = None) -> Variant | Tried:
        """``g`` fully scheduled by ``overlap`` with the search's knobs and simulated, or why not."""

    def probe(self, candidates: list[Candidate]) -> list[Probed | Tried]:
        """Each candidate built and probed (:data:`PROBE`), in order: its figures, or why it has none."""

    def finals(self, probed: dict[str, list[Probed]], rival: str, best_ns: int = NO_INCUMBENT_NS,
               finalists: int | None = None) -> list:  # fmt: skip
        """Per group, the ``finalists`` (default: the search's) best probes fully scheduled unless their lower bound
        is above a step within the budget found so far (``best_ns``, then each full search's: pruned, with both
        figures); the others keep the probe's verdict (slower than ``rival``). In probe rank order per group."""

    def retraced(self, label: str, traced_how: str, build: Callable[[], Any], prior: list) -> list:
        """A program retraced as its own module (``build()``: in its traced order, ``traced_how``), judged in two
        program orders (its parts interleaved node by node, and as traced): each pruned by its lower bound against
        the best of ``prior`` or fully scheduled (``plan``: a :class:`ModulePlan`)."""

    def bucketed(self, graph: Graph, costs: CostEstimate, order: Any, finalists: int, caps: tuple, prior: list,
                 done: Any = ()) -> list:  # fmt: skip
        """The bucketing family's search on program ``graph`` (bucket caps ``caps``, plans made on its program order
        and on ``order``; ``prior``: the variants its finalists must beat; ``done``: labels already judged): how
        another family buckets its own program."""


class Family(Protocol):
    """A variant family: ``name`` (its registry key), ``transform`` (True: a program transform, tried only when
    ``optimize(transforms=True)``) and :meth:`variants`."""

    name: str
    transform: bool

    def variants(self, state: State, judge: Judge) -> list:
        """Its variants and verdicts (module docstring), in report order."""


def schedule_variant(label: str, g: Graph, costs: CostEstimate, knobs: dict, plan: Any = None,
                     order: Any = None) -> Variant | Tried:  # fmt: skip
    """``g`` scheduled by ``overlap`` with ``knobs``, started from ``order`` (default: the program order; it sets the
    scheduler's priorities and each group's collective order unless ``knobs`` let it reorder them), and simulated;
    a failure (e.g. no order within the budget) is a verdict, never a failed search."""
    try:
        s = schedule(g, costs, "default", order=order, **knobs)
    except ScheduleError:  # its own program order is over the budget and no schedule brings it under
        return Tried(label, len(g.collectives), verdict="over the memory budget (no order fits)")
    except Exception as exc:  # one variant that cannot be scheduled must not sink the search
        return Tried(label, len(g.collectives), verdict=f"failed: {exc}")
    return Variant(label, g, costs, s, simulate_costs(g, costs, s.order), plan)


def bound_ns(sim: SimResult) -> int:
    """The simulator's lower bound of ``sim``'s program in ns (any order of it: :mod:`commsched.sim.bounds`)."""
    return round(sim.lower_bound_s * 1e9)


def bound_pruned(bound: int, best_ns: int) -> str | None:
    """The verdict of a program that cannot win: its lower bound is above the best step already found (strictly: a
    tie could still win on memory); None when it must be searched."""
    if bound <= best_ns:
        return None
    return (
        f"pruned: its lower bound {bound / 1e6:.3f} ms is above the best step found before it ({best_ns / 1e6:.3f} ms)"
    )


__all__ = ["BUCKETING", "NO_INCUMBENT_NS", "PROBE", "BucketedPlan", "Candidate", "Family", "Judge", "ModulePlan",
           "Probed", "State", "Tried", "Variant", "bound_ns", "bound_pruned", "schedule_variant"]  # fmt: skip

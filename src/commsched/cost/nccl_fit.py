"""Fit a hardware profile's collective constants to nccl-tests logs (issue 17, part 3).

:func:`fit_profile` chooses the profile fields the logs constrain and moves them, within physical bounds, to minimise
the squared error in log time between :func:`commsched.cost.collectives.plan_collective` and the measured times
(each log weighing the same, whatever its number of sizes):

* multi-node logs: ``inter_node.nic_efficiency`` and each protocol's ``inter_hop_us`` and ``base_latency_us``;
* one-node logs: the ``intra_node`` efficiencies (``nvls_*`` only on a profile with NVLS) and each protocol's
  ``intra_hop_us`` and ``base_latency_us``.

A field none of the fitted sizes is sensitive to (e.g. LL's hop latency when LL never wins above 1 MiB) keeps its
base value and is reported as not constrained. A fitted value on one of its bounds where the fit would move past it
is an error (:class:`FitBoundError`, issue 19): the model cannot reproduce the logs with physical numbers there.

Errors are ``model busbw / measured busbw - 1`` per size (``measured time / model time - 1``, as
:class:`commsched.cost.nccl_tests.SizeComparison`), before (the base profile) and after (the fitted one). Sizes below
``min_bytes`` (1 MiB by default) are shown but not fitted; a size outside the fitted sizes, a node count outside the
fitted ones or a collective not fitted is flagged as an extrapolation, with the reason.

The search (numpy only, deterministic) runs in normalised coordinates over the bounds: differential evolution, since
the envelope of the fastest (algorithm, protocol) has several basins, then bounded Nelder-Mead and coordinate grid
passes. Among fits of (nearly) equal error it prefers the one nearest the base values: logs of one node count pin
only sums of latencies (a tree pays ``base + 2 x levels x hop``), so how they split is the base profile's word.
"""

from __future__ import annotations

import dataclasses
import math
import os
import statistics
from collections.abc import Callable, Sequence
from importlib import resources
from pathlib import Path

import numpy as np

from commsched.cost.collectives import bus_factor, plan_collective
from commsched.cost.nccl_tests import MODELLED, ONE_MIB, NcclTestsLog, log_placement, read_nccl_tests
from commsched.hardware import Hardware

_US = 1e-6
_EDGE = 1e-3  # normalised distance from a bound that counts as on it
_INSENSITIVE = 1e-9  # relative loss change below which a field is not constrained by the logs
_PULL = 1e-4  # weight of the normalised distance from the base values, added to the loss in the search

NETWORK_FIELDS = ("inter_node.nic_efficiency", "intra_node.nvls_tree_efficiency")
"""the fields of a network profile a fit moves, besides each protocol's ``inter_hop_us`` (NVLS-tree's NVLS phase is
paced by the network phase, so its efficiency across nodes belongs to the network; only on a GPU with NVLS)"""
_EFFICIENCY = (0.05, 1.0)  # achieved / peak: above 1 is faster than the hardware, below 0.05 is a broken system
_LATENCY_US = (0.0, 1000.0)  # a fixed cost is >= 0; a millisecond per step or launch is no working collective
_INTRA_FIELDS = {"ring_efficiency": "ring_efficiency", "all_to_all_efficiency": "all_to_all_efficiency",
                 "nvls_efficiency": "nvls_efficiency", "nvls_latency_us": "nvls_latency_s",
                 "nvls_tree_efficiency": "nvls_tree_efficiency"}  # fmt: skip
_PROTOCOL_FIELDS = {"base_latency_us": "base_latency_s", "intra_hop_us": "intra_hop_latency_s",
                    "inter_hop_us": "inter_hop_latency_s"}  # fmt: skip


class FitBoundError(ValueError):
    """A fitted field sits on one of its physical bounds and the fit would go past it."""


@dataclasses.dataclass(frozen=True)
class FittedParameter:
    """One profile field (``key``: its TOML path and unit, e.g. ``protocols.simple.inter_hop_us``)."""

    key: str
    base: float
    value: float
    lo: float
    hi: float
    status: str  # "fitted", "not constrained" (base value kept), "at lower bound", "at upper bound"


@dataclasses.dataclass(frozen=True)
class FitSize:
    """One size of one log: measured, the base profile's model (before) and the fitted one's (after)."""

    source: str
    line: int
    collective: str
    nranks: int
    num_nodes: int
    size_bytes: int
    measured_time_s: float
    before_time_s: float
    after_time_s: float
    after_algorithm: str  # "algorithm/protocol" of the fitted model
    fitted: bool  # counted in the fit (and in the median / worst)
    extrapolated: str | None  # why the fitted model extrapolates here, None inside the fitted range

    def _busbw_GBps(self, time_s: float) -> float:
        return bus_factor(self.collective, self.nranks) * self.size_bytes / time_s * 1e-9

    @property
    def measured_busbw_GBps(self) -> float:
        return self._busbw_GBps(self.measured_time_s)

    @property
    def before_busbw_GBps(self) -> float:
        return self._busbw_GBps(self.before_time_s)

    @property
    def after_busbw_GBps(self) -> float:
        return self._busbw_GBps(self.after_time_s)

    @property
    def before_err(self) -> float:
        """Base model busbw / measured busbw - 1 (> 0: the model is too fast)."""
        return self.measured_time_s / self.before_time_s - 1.0

    @property
    def after_err(self) -> float:
        """Fitted model busbw / measured busbw - 1."""
        return self.measured_time_s / self.after_time_s - 1.0


def _summary(sizes: Sequence[FitSize], after: bool) -> tuple[float, float]:
    """(median, worst) |error| over ``sizes``; NaN for none."""
    errs = [abs(s.after_err if after else s.before_err) for s in sizes]
    return (statistics.median(errs), max(errs)) if errs else (math.nan, math.nan)


@dataclasses.dataclass(frozen=True)
class _Case:
    """A log ready for the model: its placement and the sizes it contributes."""

    log: NcclTestsLog
    collective: str
    nranks: int
    num_nodes: int
    per_node: int
    sizes: tuple[int, ...]  # every size > 0
    times_s: tuple[float, ...]


@dataclasses.dataclass(frozen=True)
class FitResult:
    """The fitted profile, its fields before and after, and the error per size of the fitted logs."""

    base: Hardware
    hardware: Hardware  # the base with the fitted fields replaced (same shape as the base)
    parameters: tuple[FittedParameter, ...]
    sizes: tuple[FitSize, ...]  # every size of every fitted log; ``fitted`` marks those in the fit
    sources: tuple[str, ...]
    min_bytes: int
    size_range_bytes: tuple[int, int]  # smallest and largest fitted size
    node_counts: tuple[int, ...]  # of the fitted logs
    collectives: tuple[str, ...]  # of the fitted logs
    network_only: bool = False  # only the network's fields were fitted (a network profile, any GPU above it)

    def summary(self, *, after: bool = True) -> tuple[float, float]:
        """(median, worst) |busbw error| over the fitted sizes, after (or before) the fit."""
        return _summary([s for s in self.sizes if s.fitted], after)

    def overrides(self) -> dict[str, float]:
        """TOML key -> fitted value (file units) of the fields the fit changed."""
        return {p.key: p.value for p in self.parameters if p.status != "not constrained"}

    def evaluate(
        self,
        logs: Sequence[NcclTestsLog | str | os.PathLike[str]],
        *,
        num_nodes: int | None = None,
        gpus_per_node: int | None = None,
    ) -> tuple[FitSize, ...]:
        """Every size of other (held-out) logs at their placements (``num_nodes`` / ``gpus_per_node`` as in
        :func:`fit_profile`), before and after, flagged where the fit extrapolates."""
        cases = _cases(_read(logs), num_nodes, gpus_per_node, min_bytes=0)
        return tuple(s for c in cases for s in _case_sizes(c, self.base, self.hardware, self, fitted=False))

    def to_json(self) -> dict:
        """Plain JSON types: the fields, the fitted sizes and the summary."""
        med_b, worst_b = self.summary(after=False)
        med_a, worst_a = self.summary(after=True)
        return {
            "hardware": self.base.name, "sources": list(self.sources), "min_bytes": self.min_bytes,
            "network_only": self.network_only,
            "parameters": [dataclasses.asdict(p) for p in self.parameters],
            "sizes": [size_json(s) for s in self.sizes],
            "median_abs_err_before": med_b, "worst_abs_err_before": worst_b,
            "median_abs_err_after": med_a, "worst_abs_err_after": worst_a,
        }  # fmt: skip


def size_json(s: FitSize) -> dict:
    """One :class:`FitSize` with its busbw and errors, in plain JSON types."""
    return {**dataclasses.asdict(s), "measured_busbw_GBps": s.measured_busbw_GBps,
            "before_busbw_GBps": s.before_busbw_GBps, "after_busbw_GBps": s.after_busbw_GBps,
            "before_err": s.before_err, "after_err": s.after_err}  # fmt: skip


# ------------------------------------------------------------------------------------------- fields of a profile
def _get(hw: Hardware, key: str) -> float:
    """A profile field by its TOML key, in file units."""
    section, *rest = key.split(".")
    if section == "inter_node":
        return hw.inter_node.nic_efficiency
    if section == "intra_node":
        value = getattr(hw.intra_node, _INTRA_FIELDS[rest[0]])
        return value / _US if rest[0].endswith("_us") else value
    proto = next(p for p in hw.protocols if p.name == rest[0])
    return getattr(proto, _PROTOCOL_FIELDS[rest[1]]) / _US


def with_fields(hw: Hardware, values: dict[str, float]) -> Hardware:
    """``hw`` with the fields ``values`` names (TOML keys, file units) replaced; nothing is range-checked."""
    inter, intra, protos = {}, {}, {p.name: {} for p in hw.protocols}
    for key, v in values.items():
        section, *rest = key.split(".")
        if section == "inter_node" and rest == ["nic_efficiency"]:
            inter["nic_efficiency"] = v
        elif section == "intra_node" and rest[0] in _INTRA_FIELDS:
            intra[_INTRA_FIELDS[rest[0]]] = v * _US if rest[0].endswith("_us") else v
        elif section == "protocols" and rest[0] in protos and rest[1] in _PROTOCOL_FIELDS:
            protos[rest[0]][_PROTOCOL_FIELDS[rest[1]]] = v * _US
        else:
            raise KeyError(f"not a fittable profile field: {key!r}")
    return dataclasses.replace(
        hw,
        inter_node=dataclasses.replace(hw.inter_node, **inter),
        intra_node=dataclasses.replace(hw.intra_node, **intra),
        protocols=tuple(dataclasses.replace(p, **protos[p.name]) for p in hw.protocols),
    )


def candidate_fields(hw: Hardware, cases_nodes: Sequence[int], collectives: Sequence[str]) -> dict[str, tuple]:
    """TOML key -> (lo, hi) of every field logs on ``cases_nodes`` nodes of ``collectives`` can move."""
    out: dict[str, tuple[float, float]] = {}
    multi, single = any(n > 1 for n in cases_nodes), any(n == 1 for n in cases_nodes)
    if multi:
        out["inter_node.nic_efficiency"] = _EFFICIENCY
    if single:
        if set(collectives) - {"all_to_all", "broadcast"}:
            out["intra_node.ring_efficiency"] = _EFFICIENCY
        if "all_to_all" in collectives:
            out["intra_node.all_to_all_efficiency"] = _EFFICIENCY
    if hw.intra_node.nvls and "all_reduce" in collectives and single:
        out["intra_node.nvls_efficiency"] = (_EFFICIENCY[0], 2.0)  # the profile schema's bound: NVLS reduces in-switch
        out["intra_node.nvls_latency_us"] = _LATENCY_US
    if hw.intra_node.nvls and "all_reduce" in collectives and multi:
        # NVLS-tree across nodes, relative to one node's NVLS: the network phase paces it, but it keeps at least half
        # (assumed; the public 2-node logs show 0.91); lower would let it stand in for a slow network, whose place is
        # the NIC efficiency (or a network profile with the right line rate)
        out["intra_node.nvls_tree_efficiency"] = (0.5, 1.0)
    for p in hw.protocols:
        out[f"protocols.{p.name}.base_latency_us"] = _LATENCY_US
        if single:
            out[f"protocols.{p.name}.intra_hop_us"] = _LATENCY_US
        if multi:
            out[f"protocols.{p.name}.inter_hop_us"] = _LATENCY_US
    return out


# ------------------------------------------------------------------------------------------------ logs and model
def _read(logs: Sequence[NcclTestsLog | str | os.PathLike[str]]) -> list[NcclTestsLog]:
    out: list[NcclTestsLog] = []
    for item in logs:
        out.extend([item] if isinstance(item, NcclTestsLog) else read_nccl_tests(item))
    return out


def _cases(logs: list[NcclTestsLog], num_nodes: int | None, gpus_per_node: int | None, min_bytes: int) -> list[_Case]:
    """The logs' placements; ValueError naming a log the model cannot take or without a size >= ``min_bytes``."""
    cases = []
    for log in logs:
        where = f"{log.source}:{log.line}"
        if log.collective not in MODELLED:
            what = log.collective or "an unnamed collective (pass --collective)"
            raise ValueError(f"{where}: cannot fit {what}: the model covers {', '.join(MODELLED)}")
        ranks, nodes, per_node = log_placement(log, num_nodes=num_nodes, gpus_per_node=gpus_per_node)
        if ranks < 2:
            raise ValueError(f"{where}: {ranks} rank: a collective of one rank costs nothing to fit")
        measured = sorted(log.measured_time_s().items())
        if not any(size >= min_bytes for size, _ in measured):
            raise ValueError(f"{where}: no size >= {min_bytes} bytes to fit (pass all sizes to use smaller ones)")
        cases.append(_Case(log, log.collective, ranks, nodes, per_node, tuple(s for s, _ in measured),
                           tuple(t for _, t in measured)))  # fmt: skip
    return cases


def _model_s(case: _Case, hw: Hardware, size: int) -> tuple[float, str]:
    plan = plan_collective(case.collective, size, case.nranks, hw.with_nodes(case.num_nodes, case.per_node))
    return plan.time_s, f"{plan.algorithm}/{plan.protocol}"


def _extrapolation(case: _Case, size: int, fit: FitResult) -> str | None:
    lo, hi = fit.size_range_bytes
    why = []
    if not lo <= size <= hi:
        why.append(f"size outside the fitted {lo}-{hi} B")
    if case.num_nodes not in fit.node_counts:
        why.append(f"{case.num_nodes} nodes, fitted on {'/'.join(map(str, fit.node_counts))}")
    if case.collective not in fit.collectives:
        why.append(f"{case.collective} not fitted")
    return "; ".join(why) or None


def _case_sizes(case: _Case, before: Hardware, after: Hardware, fit: FitResult, *, fitted: bool) -> list[FitSize]:
    out = []
    for size, t in zip(case.sizes, case.times_s):
        t_before, _ = _model_s(case, before, size)
        t_after, algo = _model_s(case, after, size)
        out.append(FitSize(case.log.source, case.log.line, case.collective, case.nranks, case.num_nodes, size, t,
                           t_before, t_after, algo, fitted and size >= fit.min_bytes,
                           _extrapolation(case, size, fit)))  # fmt: skip
    return out


def _loss_function(base: Hardware, keys: list[str], cases: list[_Case], min_bytes: int) -> Callable:
    """values (file units, in ``keys`` order) -> mean over logs of the mean squared log-time error."""
    picked = [[(s, math.log(t)) for s, t in zip(c.sizes, c.times_s) if s >= min_bytes] for c in cases]

    def loss(values: Sequence[float]) -> float:
        hw = with_fields(base, dict(zip(keys, values)))
        total = 0.0
        for case, points in zip(cases, picked):
            errs = []
            for size, log_t in points:
                t, _ = _model_s(case, hw, size)
                errs.append((math.log(t) - log_t) ** 2 if t > 0 else math.inf)
            total += sum(errs) / len(errs)
        return total / len(cases)

    return loss


# ------------------------------------------------------------------------------------------------------- search
def _value(u: float, key: str, lo: float, hi: float) -> float:
    """Normalised coordinate in [0, 1] -> field value: quadratic for latencies (resolution near 0), else linear."""
    return lo + (hi - lo) * (u * u if key.endswith("_us") else u)


def _coordinate(v: float, key: str, lo: float, hi: float) -> float:
    x = min(max((v - lo) / (hi - lo), 0.0), 1.0)
    return math.sqrt(x) if key.endswith("_us") else x


def _nelder_mead(f: Callable, x0: np.ndarray, *, step: float = 0.08, max_evals: int = 1500) -> tuple[np.ndarray, float]:
    """Minimise ``f`` over the unit box from ``x0`` (points clipped into the box)."""
    n = len(x0)
    simplex = [x0.copy()]
    for i in range(n):
        x = x0.copy()
        x[i] = x[i] + step if x[i] + step <= 1.0 else x[i] - step
        simplex.append(x)
    fs = [f(x) for x in simplex]
    evals = n + 1
    while evals < max_evals:
        order = np.argsort(fs)
        simplex, fs = [simplex[k] for k in order], [fs[k] for k in order]
        if fs[-1] - fs[0] <= 1e-12 * (abs(fs[0]) + 1e-12) and max(np.ptp(np.array(simplex), axis=0)) < 1e-6:
            break
        centre = np.mean(simplex[:-1], axis=0)
        xr = np.clip(2 * centre - simplex[-1], 0.0, 1.0)
        fr = f(xr)
        evals += 1
        if fr < fs[0]:
            xe = np.clip(3 * centre - 2 * simplex[-1], 0.0, 1.0)
            fe = f(xe)
            evals += 1
            simplex[-1], fs[-1] = (xe, fe) if fe < fr else (xr, fr)
        elif fr < fs[-2]:
            simplex[-1], fs[-1] = xr, fr
        else:
            xc = centre + 0.5 * ((xr if fr < fs[-1] else simplex[-1]) - centre)
            fc = f(xc)
            evals += 1
            if fc < min(fr, fs[-1]):
                simplex[-1], fs[-1] = xc, fc
            else:  # shrink towards the best point
                simplex = [simplex[0]] + [simplex[0] + 0.5 * (x - simplex[0]) for x in simplex[1:]]
                fs = [fs[0]] + [f(x) for x in simplex[1:]]
                evals += n
    best = int(np.argmin(fs))
    return simplex[best], fs[best]


def _grid_pass(f: Callable, x: np.ndarray, fx: float, points: int = 17) -> tuple[np.ndarray, float]:
    """One pass over the coordinates, each set to the best of a grid over [0, 1] (the others held)."""
    x = x.copy()
    for i in range(len(x)):
        for g in np.linspace(0.0, 1.0, points):
            trial = x.copy()
            trial[i] = g
            ft = f(trial)
            if ft < fx:
                x, fx = trial, ft
    return x, fx


def _evolve(f: Callable, x0: np.ndarray, *, per_dim: int = 8, generations: int = 60) -> tuple[np.ndarray, float]:
    """Differential evolution (rand/1/bin) over the unit box, ``x0`` in the first population; a fixed seed."""
    rng = np.random.default_rng(17)
    d = len(x0)
    pop = rng.uniform(0.0, 1.0, (per_dim * d, d))
    pop[0] = x0
    fit = np.array([f(x) for x in pop])
    n = len(pop)
    for _ in range(generations):
        for i in range(n):
            a, b, c = pop[rng.choice(np.delete(np.arange(n), i), 3, replace=False)]
            cross = rng.uniform(size=d) < 0.9
            cross[rng.integers(d)] = True
            trial = np.where(cross, np.clip(a + 0.7 * (b - c), 0.0, 1.0), pop[i])
            ft = f(trial)
            if ft <= fit[i]:
                pop[i], fit[i] = trial, ft
    k = int(np.argmin(fit))
    return pop[k], float(fit[k])


def _search(f: Callable, x0: np.ndarray, rounds: int = 4) -> tuple[np.ndarray, float]:
    """Differential evolution (the envelope of the fastest algorithm has several basins), then Nelder-Mead and a
    grid pass in turn until a round gains nothing. Deterministic."""
    x, fx = _evolve(f, x0)
    for _ in range(rounds):
        x_new, f_new = _nelder_mead(f, x)
        x_new, f_new = _grid_pass(f, x_new, f_new)
        if f_new >= fx * (1 - 1e-9):
            break
        x, fx = x_new, f_new
    return x, fx


def _classify(
    loss: Callable, keys: list[str], bounds: dict[str, tuple[float, float]], values: list[float], base: list[float]
) -> list[FittedParameter]:
    """Each field's status at the optimum ``values`` (changed in place where a field is reset to its base)."""
    out = []
    for i, key in enumerate(keys):
        lo, hi = bounds[key]
        f0 = loss(values)
        delta = max(0.05 * abs(values[i]), 1e-3 * (hi - lo))

        def at(v: float, i: int = i) -> float:
            return loss([*values[:i], v, *values[i + 1 :]])

        probes = [at(min(max(values[i] + d, lo), hi)) for d in (-delta, delta)]
        if all(abs(p - f0) <= _INSENSITIVE * max(f0, 1e-300) for p in probes) and at(base[i]) <= f0 * (1 + 1e-9):
            values[i] = base[i]
            status = "not constrained"
        elif _coordinate(values[i], key, lo, hi) <= _EDGE and at(lo - delta) < f0 * (1 - 1e-6):
            status = "at lower bound"
        elif _coordinate(values[i], key, lo, hi) >= 1 - _EDGE and at(hi + delta) < f0 * (1 - 1e-6):
            status = "at upper bound"
        else:
            status = "fitted"
        out.append(FittedParameter(key, base[i], values[i], lo, hi, status))
    return out


def _bound_error(params: Sequence[FittedParameter], sources: Sequence[str]) -> FitBoundError:
    hits = [p for p in params if p.status.startswith("at ")]
    what = ", ".join(f"{p.key} = {p.value:g} ({p.status.removeprefix('at ')} {p.lo if 'lower' in p.status else p.hi:g})"
                     for p in hits)  # fmt: skip
    logs = ", ".join(os.path.basename(s) for s in sources)
    return FitBoundError(
        f"the fit to {logs} hits a bound: {what}; the model cannot reproduce these logs with physical values there "
        "(allow_bounds / --allow-bounds keeps it)"
    )


def fit_profile(
    logs: Sequence[NcclTestsLog | str | os.PathLike[str]],
    hardware: str | os.PathLike[str] | Hardware,
    *,
    num_nodes: int | None = None,
    gpus_per_node: int | None = None,
    min_bytes: int = ONE_MIB,
    allow_bounds: bool = False,
    network_only: bool = False,
) -> FitResult:
    """Fit ``hardware``'s collective fields to ``logs`` (see the module docstring): least squares in log time over
    the sizes >= ``min_bytes`` (0: all), each log at its placement (:func:`log_placement`, ``num_nodes`` /
    ``gpus_per_node`` as there). ValueError for a log the model cannot take; :class:`FitBoundError` naming the
    field and the bound for a fit that hits one, unless ``allow_bounds``. ``network_only``: fit only the network's
    fields (:data:`NETWORK_FIELDS` and each protocol's ``inter_hop_us``; multi-node logs), so that the result is a
    network profile that holds under any GPU profile (:func:`save_overlay` ``network=True``)."""
    from commsched import hardware as hw_mod

    base = hardware if isinstance(hardware, Hardware) else hw_mod.get(hardware)
    cases = _cases(_read(logs), num_nodes, gpus_per_node, min_bytes)
    bounds = candidate_fields(base, [c.num_nodes for c in cases], [c.collective for c in cases])
    if network_only:
        if all(c.num_nodes == 1 for c in cases):
            raise ValueError(f"{cases[0].log.source}: a network fit needs a log across nodes; these are one-node logs")
        bounds = {k: b for k, b in bounds.items() if k in NETWORK_FIELDS or k.endswith(".inter_hop_us")}
    keys = list(bounds)
    loss = _loss_function(base, keys, cases, min_bytes)
    base_values = [_get(base, k) for k in keys]
    to_values = lambda u: [_value(float(x), k, *bounds[k]) for x, k in zip(u, keys)]  # noqa: E731
    u0 = np.array([_coordinate(v, k, *bounds[k]) for v, k in zip(base_values, keys)])
    # a whisper of pull towards the base picks, among equally good fits, the one nearest the base profile
    u, _ = _search(lambda x: loss(to_values(x)) + _PULL * float(np.mean((x - u0) ** 2)), u0)
    values = to_values(u)
    params = _classify(loss, keys, bounds, values, base_values)
    sources = tuple(dict.fromkeys(c.log.source for c in cases))
    if not allow_bounds and any(p.status.startswith("at ") for p in params):
        raise _bound_error(params, sources)
    fitted_sizes = [s for c in cases for s in c.sizes if s >= min_bytes]
    fitted_hw = with_fields(base, {p.key: p.value for p in params})
    if any(c.num_nodes > 1 for c in cases):  # the network's fields now come from measurements: no warning across nodes
        fitted_hw = dataclasses.replace(fitted_hw, inter_node=dataclasses.replace(fitted_hw.inter_node, fitted=True))
    result = FitResult(
        base=base,
        hardware=fitted_hw,
        parameters=tuple(params),
        sizes=(),
        sources=sources,
        min_bytes=min_bytes,
        size_range_bytes=(min(fitted_sizes), max(fitted_sizes)),
        node_counts=tuple(sorted({c.num_nodes for c in cases})),
        collectives=tuple(sorted({c.collective for c in cases})),
        network_only=network_only,
    )
    sizes = [s for c in cases for s in _case_sizes(c, base, result.hardware, result, fitted=True)]
    return dataclasses.replace(result, sizes=tuple(sizes))


# ------------------------------------------------------------------------------------------------------ overlay
def check_overlay_path(path: str | os.PathLike[str], *, force: bool = False) -> Path:
    """``path`` if an overlay may be written there: never into the package's shipped profiles, and not over an
    existing file unless ``force`` (ValueError / FileExistsError, one line)."""
    out = Path(path).expanduser()
    shipped = Path(str(resources.files("commsched.hardware") / "profiles")).resolve()
    if shipped == out.resolve().parent or shipped in out.resolve().parents:
        raise ValueError(f"{out}: refusing to write into the shipped profiles ({shipped}): pass another -o path")
    if out.exists() and not force:
        raise FileExistsError(f"{out} exists: pass --force to replace it, or another -o path")
    if out.suffix != ".toml":
        raise ValueError(f"{out}: expected a .toml path (profiles are found by that suffix)")
    return out


def _pct(x: float) -> str:
    return f"{100 * x:.1f} %"


def overlay_header(fit: FitResult, stamp: str) -> str:
    """The comment lines of an overlay: where it comes from, the logs, the fields and the fit error."""
    med_b, worst_b = fit.summary(after=False)
    med_a, worst_a = fit.summary()
    cases = {(s.source, s.line): s for s in fit.sizes}
    flag, what = (" --network", "the network under") if fit.network_only else ("", "the profile")
    lines = [
        f"Written by `commsched calibrate --nccl-tests --fit{flag}` on {stamp}: {what} {fit.base.name!r}",
        f"({fit.base.source or 'given as a Hardware'}) with the fields below fitted to nccl-tests logs",
        f"(commsched.cost.nccl_fit: least squares in log time over the sizes >= {fit.min_bytes} B). Logs:",
        *(
            f"  {src}:{line} ({s.collective}, {s.nranks} ranks on {s.num_nodes} nodes)"
            for (src, line), s in cases.items()
        ),
        "Fields (base -> fitted):",
        *(f"  {p.key}: {p.base:g} -> {p.value:g} ({p.status})" for p in fit.parameters),
        f"|busbw error| over the {sum(s.fitted for s in fit.sizes)} fitted sizes: median {_pct(med_b)} -> "
        f"{_pct(med_a)}, worst {_pct(worst_b)} -> {_pct(worst_a)} (base -> fitted).",
        f"Outside {fit.size_range_bytes[0]}-{fit.size_range_bytes[1]} B, node counts "
        f"{'/'.join(map(str, fit.node_counts))} and {', '.join(fit.collectives)} the fit extrapolates.",
        "Every other number is the base profile's (its source comments are in the base file).",
    ]
    if fit.base.table_path:
        lines.append(f"The base's measured table ({fit.base.table_path}) is left out: it would hide the fitted model.")
    return "\n".join(lines)


def save_overlay(fit: FitResult, path: str | os.PathLike[str], *, force: bool = False) -> Path:
    """Write the fitted profile as a full profile TOML named after ``path`` (atomically; see
    :func:`check_overlay_path`); it loads with ``hardware.get(path)``. A network-only fit is written as a network
    profile instead (:func:`commsched.hardware.save_network`): ``hardware.get("GPU@PATH")`` under any GPU."""
    import datetime

    from commsched import hardware as hw_mod

    out = check_overlay_path(path, force=force)
    stamp = datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%d %H:%M UTC")
    if fit.network_only:
        inter = fit.hardware.inter_node
        gbit = inter.nic_bandwidth_bytes_per_s * 8 / 1e9
        what = f"{inter.nics_per_node} x {gbit:g} Gb/s per node, fitted to nccl-tests logs"
        return hw_mod.save_network(fit.hardware, out, description=what, header=overlay_header(fit, stamp))
    hw = dataclasses.replace(
        fit.hardware, name=out.stem, description=f"{fit.base.description}; collective fields fitted to nccl-tests logs"
    )
    return hw_mod.save_profile(hw.with_nodes(1, fit.base.gpus_per_node), out, header=overlay_header(fit, stamp))

"""Pass registry, the pass contract, the types passes exchange and the knobs that configure them.

A pass is ``fn(g, order, ctx) -> PassResult``: it receives the graph, the current order (a permutation of node ids,
int32) and a :class:`PassContext` (costs, its own frozen config, ordering constraints fixed by earlier passes), and
returns a new order. Passes never mutate the graph. The pipeline checks every result with ``check_schedule``.

Knobs are the fields of the pass configs. :class:`KnobNamespace` routes a pipeline's knobs to its passes (a flat
``NAME=value`` to every pass that has field NAME, ``PASS={NAME: value}`` to one pass) and checks and converts every
value against the field's annotation (:func:`convert_knob`) before any pass runs.
"""

from __future__ import annotations

import dataclasses
import functools
import numbers
import types
import typing
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass, field
from typing import Any, Literal

import numpy as np

from commsched.cost.model import CostEstimate
from commsched.ir import Graph
from commsched.passes.budget import MemoryBudget


@dataclass(frozen=True, kw_only=True)
class PassConfig:
    """Base of every pass config (frozen; built from the pipeline's knobs by field name). Every field is checked
    and converted against its annotation on construction (:func:`convert_knob`)."""

    def __post_init__(self) -> None:
        for name, annotation in config_fields(type(self)).items():
            value = getattr(self, name)
            converted = convert_knob(value, annotation, name)
            if converted is not value:
                object.__setattr__(self, name, converted)


@dataclass(frozen=True, kw_only=True)
class NoConfig(PassConfig):
    pass


@dataclass
class PassContext:
    """What a pass may read besides the graph and the order."""

    costs: CostEstimate
    config: PassConfig
    # ordering constraints (src before dst) fixed by earlier passes, e.g. decide_global_ordering_of_comms
    extra_src: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    extra_dst: np.ndarray = field(default_factory=lambda: np.zeros(0, np.int32))
    streams: np.ndarray | None = None  # compute stream per node, when a multi-stream pass assigned them


@dataclass
class PassStats:
    """What a pass did: one row per collective (or wait) it considered, and counts of refusals by reason."""

    name: str
    wall_s: float = 0.0
    rows: list[dict[str, Any]] = field(default_factory=list)
    refused: dict[str, int] = field(default_factory=dict)
    notes: list[str] = field(default_factory=list)

    def refuse(self, reason: str) -> None:
        self.refused[reason] = self.refused.get(reason, 0) + 1


@dataclass
class PassResult:
    order: np.ndarray
    stats: PassStats
    streams: np.ndarray | None = None
    # new ordering constraints this pass fixes for the passes after it (src before dst)
    extra_src: np.ndarray | None = None
    extra_dst: np.ndarray | None = None
    # a pass that may change a group's collective order says so; the checker then skips that check
    reorders_collectives: bool = False


PassFn = Callable[[Graph, np.ndarray, PassContext], PassResult]


@dataclass(frozen=True)
class PassSpec:
    name: str
    fn: PassFn
    config_cls: type[PassConfig]
    description: str

    @property
    def baseline(self) -> bool:
        """A reproduction of torch's seed passes (``passes/baselines/``), kept to compare against, not ours."""
        return self.fn.__module__.startswith("commsched.passes.baselines.")


PASSES: dict[str, PassSpec] = {}


def register_pass(name: str, config_cls: type[PassConfig] = NoConfig) -> Callable[[PassFn], PassFn]:
    """Register ``fn`` under ``name``; a second registration of the same name is an error."""

    def deco(fn: PassFn) -> PassFn:
        if name in PASSES:
            raise ValueError(f"pass {name!r} is already registered (by {PASSES[name].fn.__module__})")
        first_paragraph = (fn.__doc__ or "").strip().split("\n\n")[0]
        PASSES[name] = PassSpec(name, fn, config_cls, " ".join(first_paragraph.split()))
        return fn

    return deco


# ---------------------------------------------------------------------------------------------------------- knobs
class _Mismatch(Exception):
    """A knob value that does not fit its annotation (turned into one ValueError naming the knob)."""


@functools.cache
def config_fields(config_cls: type[PassConfig]) -> dict[str, Any]:
    """Field name -> resolved annotation of a pass config (the knobs it takes)."""
    hints = typing.get_type_hints(config_cls)
    return {f.name: hints[f.name] for f in dataclasses.fields(config_cls)}


def describe_type(annotation: Any) -> str:
    """How a knob's annotation reads in an error message: the type, and the allowed values of a Literal."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is MemoryBudget:
        return "a memory budget (1.05 or '1.05x' times the input peak, '40GiB', or None)"
    if annotation is type(None):
        return "None"
    if origin is Literal:
        return "one of " + ", ".join(repr(a) for a in args)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(describe_type(a) for a in sorted(args, key=lambda a: a is type(None)))
    if origin is tuple:
        if len(args) == 2 and args[1] is Ellipsis:
            return f"a tuple of {describe_type(args[0])}"
        return "(" + "; ".join(describe_type(a) for a in args) + ")"
    if origin in (dict, Mapping):
        return f"a mapping of {describe_type(args[0])} to {describe_type(args[1])}"
    if annotation is bool:
        return "bool (true or false)"
    return getattr(annotation, "__name__", str(annotation))


def _convert(value: Any, annotation: Any, knob: str) -> Any:
    """``value`` as ``annotation`` says (int -> float, list -> tuple, 'true' -> True, str -> MemoryBudget);
    raises _Mismatch when it does not fit."""
    origin, args = typing.get_origin(annotation), typing.get_args(annotation)
    if annotation is Any:
        return value
    if annotation is MemoryBudget:
        return MemoryBudget.parse(value, knob)  # its own error names the knob and the spellings
    if annotation is type(None):
        if value is None:
            return None
        raise _Mismatch
    if origin in (typing.Union, types.UnionType):
        if value is None and type(None) in args:
            return None
        for alternative in (a for a in args if a is not type(None)):
            try:
                return _convert(value, alternative, knob)
            except _Mismatch:
                continue
        raise _Mismatch
    if origin is Literal:
        for choice in args:  # True == 1, so the type must match too
            if value == choice and type(value) is type(choice):
                return choice
        raise _Mismatch
    if annotation is bool:
        if isinstance(value, str) and value.lower() in ("true", "false"):
            return value.lower() == "true"
        if isinstance(value, bool):
            return value
        raise _Mismatch
    if annotation in (int, float):  # numbers.Integral / Real take numpy scalars too; an int is a float, not back
        wanted = numbers.Integral if annotation is int else numbers.Real
        if isinstance(value, bool) or not isinstance(value, wanted):
            raise _Mismatch
        return value if type(value) is annotation else annotation(value)
    if annotation is str:
        if isinstance(value, str):
            return value
        raise _Mismatch
    if origin is tuple:
        if not isinstance(value, list | tuple):
            raise _Mismatch
        if len(args) == 2 and args[1] is Ellipsis:
            return tuple(_convert(v, args[0], knob) for v in value)
        if len(value) != len(args):
            raise _Mismatch
        return tuple(_convert(v, a, knob) for v, a in zip(value, args, strict=True))
    if origin in (dict, Mapping):
        if not isinstance(value, Mapping):
            raise _Mismatch
        return {_convert(k, args[0], knob): _convert(v, args[1], knob) for k, v in value.items()}
    return value  # an annotation this checker does not know: the pass checks it


def convert_knob(value: Any, annotation: Any, knob: str) -> Any:
    """``value`` converted to a config field's ``annotation`` (bool, int, float, str, Literal, tuple, mapping,
    None, MemoryBudget and unions of them); a one-line ValueError naming ``knob``, the expected type and the
    allowed values when it does not fit."""
    try:
        return _convert(value, annotation, knob)
    except _Mismatch:
        raise ValueError(f"knob {knob}={value!r}: expected {describe_type(annotation)}") from None


@dataclass(frozen=True)
class KnobNamespace:
    """The knobs of a pipeline: every field of every registered pass in it.

    A flat knob ``NAME=value`` sets field NAME on every pass of the pipeline that has it; a pass namespace
    ``PASS={NAME: value}`` sets it on that pass only, over a flat value. :meth:`configs` checks names, types and
    allowed values and builds each pass's config, so a bad knob fails before any pass runs.
    """

    passes: tuple[str, ...]
    """the registered passes of the pipeline, in order, each once"""

    @classmethod
    def of(cls, pipeline: Iterable[str | Callable[..., Any]]) -> KnobNamespace:
        """The namespace of a resolved pass list (names and callables; a callable takes no knobs)."""
        names = [p for p in pipeline if isinstance(p, str)]
        unknown = [p for p in names if p not in PASSES]
        if unknown:
            raise ValueError(f"unknown pass {unknown[0]!r}; known passes: {sorted(PASSES)}")
        return cls(tuple(dict.fromkeys(names)))

    def fields(self, pass_name: str) -> dict[str, Any]:
        return config_fields(PASSES[pass_name].config_cls)

    def has(self, knob: str) -> bool:
        """Whether a flat knob ``knob`` sets a field of some pass of the pipeline."""
        return any(knob in self.fields(p) for p in self.passes)

    def _unknown(self, names: list[str], pass_name: str | None = None) -> ValueError:
        if pass_name is not None:
            known = ", ".join(self.fields(pass_name)) or "none"
            return ValueError(f"unknown knob(s) {[f'{pass_name}.{n}' for n in names]}: {pass_name}'s knobs are {known}")
        known = ", ".join(sorted({k for p in self.passes for k in self.fields(p)})) or "none"
        return ValueError(
            f"unknown knob(s) {names} for passes {list(self.passes)}: known knobs are {known}, "
            f"or PASS.NAME / PASS={{NAME: value}} for one pass"
        )

    def configs(self, knobs: Mapping[str, Any]) -> dict[str, PassConfig]:
        """One checked config per pass of the pipeline, built from ``knobs`` (see the class docstring)."""
        flat = {k: v for k, v in knobs.items() if k not in PASSES}
        unknown = [k for k in flat if not self.has(k)]
        if unknown:
            raise self._unknown(unknown)
        for name in (k for k in knobs if k in PASSES):
            if name not in self.passes:
                raise ValueError(
                    f"knob namespace {name!r} names a pass that is not in the pipeline {list(self.passes)}"
                )
            if not isinstance(knobs[name], Mapping):
                raise ValueError(f"knob {name}={knobs[name]!r}: a pass namespace takes a dict of that pass's knobs")
        out: dict[str, PassConfig] = {}
        for p in self.passes:
            fields, own = self.fields(p), knobs.get(p, {})
            unknown = [k for k in own if k not in fields]
            if unknown:
                raise self._unknown(unknown, p)
            given = {k: (flat[k], k) for k in fields if k in flat} | {k: (v, f"{p}.{k}") for k, v in own.items()}
            values = {k: convert_knob(v, fields[k], label) for k, (v, label) in given.items()}
            out[p] = PASSES[p].config_cls(**values)
        return out

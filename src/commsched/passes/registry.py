"""Pass registry, the pass contract and the types passes exchange.

A pass is ``fn(g, order, ctx) -> PassResult``: it receives the graph, the current order (a permutation of node ids,
int32) and a :class:`PassContext` (costs, its own frozen config, ordering constraints fixed by earlier passes), and
returns a new order. Passes never mutate the graph. The pipeline checks every result with ``check_schedule``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

import numpy as np

from commsched.cost.model import CostEstimate
from commsched.ir import Graph


@dataclass(frozen=True, kw_only=True)
class PassConfig:
    """Base of every pass config (frozen; built from the pipeline's knobs by field name)."""


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

    def extra_preds(self, n: int) -> tuple[np.ndarray, np.ndarray]:
        """CSR (ptr, idx) of the extra ordering constraints, grouped by their dst."""
        from commsched.ir.graph import _csr

        return _csr(n, self.extra_src, self.extra_dst)


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


def build_config(config_cls: type[PassConfig], knobs: dict[str, Any], used: set[str]) -> PassConfig:
    """Instantiate ``config_cls`` from the knobs it has fields for (records which knobs were used)."""
    names = {f.name for f in dataclasses.fields(config_cls)}
    mine = {k: v for k, v in knobs.items() if k in names}
    used.update(mine)
    return config_cls(**mine)

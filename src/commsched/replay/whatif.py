"""What-ifs on replayable work: new durations from scale selectors and a hardware profile, never new timestamps.

Selectors (``--scale SELECTOR=FACTOR``, factors multiply where several match an item):

* ``stream:N``: the device work of stream ``N`` (a GPU stream id, ``7``; a thread id on a CPU-only trace; or the
  stream's full name, ``"stream 7"``);
* ``kernel:REGEX``: device work whose name matches the Python regular expression (``re.search``);
* ``comm`` / ``compute``: all communication / all computation.

Only device work is scaled; host segments and gaps keep their measured durations. ``--hardware PROFILE`` first
re-costs every collective whose kind, size and group the trace records with commsched's collective model
(:func:`commsched.cost.collectives.collective_time_s`); the scales then apply on top.

A what-if that changes nothing is an error, not a silent no-op: a selector that matches no work of the trace
(``comm`` where no communication was found, a ``kernel:REGEX`` no name matches, an unknown stream), ``--hardware``
on a trace that records no collective, and a scale that would take the step past the simulator's horizon
(:data:`commsched.sim.model.HORIZON_NS`).
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass

import numpy as np

from commsched.replay.work import COMM, COMPUTE, ReplayTrace
from commsched.sim.model import HORIZON_NS


@dataclass(frozen=True)
class Scale:
    """One ``SELECTOR=FACTOR``: ``what`` is stream, kernel, comm or compute; ``arg`` the stream id or regex."""

    what: str
    arg: str
    factor: float

    @property
    def text(self) -> str:
        """The selector as the user writes it: ``comm=2``, ``kernel:^nccl=0.5``."""
        return f"{self.what}{':' + self.arg if self.arg else ''}={self.factor:g}"

    def matches(self, trace: ReplayTrace) -> np.ndarray:
        """Mask of the items this selector scales (device work only)."""
        work = trace.work
        if self.what == "comm":
            return trace.role == COMM
        if self.what == "compute":
            return trace.role == COMPUTE
        if self.what == "kernel":
            rx = re.compile(self.arg)
            return work & np.fromiter((bool(rx.search(n)) for n in trace.names), bool, len(trace))
        ids = [s for s, name in enumerate(trace.streams) if name == self.arg or name.split()[-1] == self.arg]
        return work & np.isin(trace.stream, ids)


def parse_scale(text: str) -> Scale:
    """``stream:N=F``, ``kernel:REGEX=F``, ``comm=F`` or ``compute=F`` (F a finite number >= 0); ValueError saying
    what was expected."""
    selector, sep, value = text.rpartition("=")
    what, colon, arg = selector.partition(":")
    expected = "expected stream:N=F, kernel:REGEX=F, comm=F or compute=F with F >= 0, e.g. stream:7=0.5"
    try:
        factor = float(value)
    except ValueError:
        factor = math.nan
    if not sep or not math.isfinite(factor) or factor < 0:
        raise ValueError(f"--scale {text!r}: factor {value!r} is not a finite number >= 0; {expected}")
    if what in ("comm", "compute") and not colon:
        return Scale(what, "", factor)
    if what in ("stream", "kernel") and colon and arg:
        if what == "kernel":
            try:
                re.compile(arg)
            except re.error as exc:
                raise ValueError(f"--scale {text!r}: bad regular expression {arg!r}: {exc}") from None
        return Scale(what, arg, factor)
    raise ValueError(f"--scale {text!r}: unknown selector {selector!r}; {expected}")


_NOTHING = {
    "comm": "no communication was found in the trace (no NCCL collective, no kernel named like a communication "
    "library's); name its kernels with --comm-pattern REGEX",
    "compute": "the trace has no computation (every work item is communication or a memory copy)",
}


def check_scales(trace: ReplayTrace, scales: list[Scale]) -> None:
    """ValueError naming a selector that matches no work of the trace (a typo, or communication the trace's kernel
    names do not reveal, would silently do nothing)."""
    for sc in scales:
        if sc.what == "stream" and not any(n == sc.arg or n.split()[-1] == sc.arg for n in trace.streams):
            names = ", ".join(n.split()[-1] for n, dev in zip(trace.streams, trace.device, strict=True) if dev)
            raise ValueError(f"{trace.path}: --scale stream:{sc.arg}: no such stream; expected one of {names}")
        if sc.what != "stream" and not sc.matches(trace).any():
            why = _NOTHING.get(sc.what, f"no work item's name matches {sc.arg!r}; expected a regex of a kernel name")
            raise ValueError(f"{trace.path}: --scale {sc.text}: {why}")


def recost_collectives(trace: ReplayTrace, dur_ns: np.ndarray, hardware: str) -> tuple[np.ndarray, int]:
    """Durations with every recorded collective timed by the collective model on ``hardware`` (a profile name or
    path; as many nodes as the largest group needs). Returns (durations, collectives re-costed)."""
    from commsched import hardware as hw_mod
    from commsched.cost.collectives import collective_time_s

    try:  # an unknown profile is an error even where nothing would be re-costed
        base = hw_mod.get(hardware)
    except (ValueError, FileNotFoundError) as exc:
        raise ValueError(f"--hardware {hardware}: {exc}") from None
    if not trace.collectives:
        raise ValueError(f"{trace.path}: --hardware {hardware}: the trace records no collective (kind and size, as "
                         "NCCL kernels with 'Collective name' carry them); nothing to re-cost")  # fmt: skip
    largest = max(c.group_size for c in trace.collectives.values())
    hw = base.with_nodes(hw_mod.nodes_for_world(largest, base.gpus_per_node), None)
    out = dur_ns.copy()
    for i, c in trace.collectives.items():
        out[i] = round(collective_time_s(c.kind, c.nbytes, c.group_size, hw) * 1e9)
    return out, len(trace.collectives)


def apply_scales(trace: ReplayTrace, dur_ns: np.ndarray, scales: list[Scale]) -> np.ndarray:
    """Durations with every selector's factor applied to the items it matches (int ns, rounded). ValueError naming
    the largest scale when all the work, run one after another, could pass the simulator's horizon."""
    factor = np.ones(len(trace))
    for sc in scales:
        factor[sc.matches(trace)] *= sc.factor
    with np.errstate(over="ignore", invalid="ignore"):  # 1e308 x a duration is inf here and an error below
        scaled = dur_ns * factor
        worst_ns = float(np.sum(scaled)) + len(trace)  # every item serialised, a rounding ns each
    if scales and not worst_ns < HORIZON_NS:
        big = max(scales, key=lambda sc: sc.factor)
        raise ValueError(
            f"{trace.path}: --scale {big.text}: the scaled work adds up to {worst_ns * 1e-9:.3g} s; expected a "
            f"step under {HORIZON_NS * 1e-9:.3g} s (the simulator's horizon): use a smaller factor"
        )
    return np.rint(scaled).astype(np.int64)

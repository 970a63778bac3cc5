"""torch's own per-layer activation checkpointing choice, run on a zoo model: ``torch.distributed._tools.sac_ilp``
(a MILP over per-module AC, fed by ``MemTracker``, ``RuntimeEstimator`` and ``SACEstimator``), the peer of the AC
policy family (:mod:`commsched.optimize.families.ac_policy`; ``benchmarks/bench_ac_policy.py``).

As torch's own test runs it (``test/distributed/_tools/test_sac_ilp.py``): the model as an ``nn.Module`` on fake
tensors, one forward and backward under each tool, ``aggregate_stats``, ``parse_module_info``, ``sac_milp``. The model
is the zoo's (its own functions, single rank, blocks as modules ``layers.<i>``), on the CPU, so two things stand in
for a GPU: torch's roofline (``operator-level-cost-model``) reads the profile's peak flops and HBM bandwidth instead
of asking CUDA (an op with outputs of several dtypes, flash attention's, is timed at its first output's: torch's
roofline refuses it), and where ``pwlf`` is not installed, the trade-off curve's two-segment fit is a continuous
least-squares fit whose breakpoint is searched over the curve's points (``pwlf`` searches it by differential
evolution). Torch's answer, a fraction of each block's activation memory to discard, is mapped to the zoo's policies
by :func:`as_block_policies`.
"""

from __future__ import annotations

import contextlib
import dataclasses
import io
import sys
import types
from typing import Any
from unittest import mock

import numpy as np
import torch

GIB = 2**30


@dataclasses.dataclass(frozen=True)
class SacIlpPlan:
    """``sac_milp``'s answer: per block, the fraction of its activation memory to discard (0: not checkpointed);
    its recompute time (ms, torch's roofline) and peak bound (bytes; -1: no plan fits); the same model's peak with no
    AC (``baseline_bytes``, sac_milp's memory formula) and the budget it was given (bytes)."""

    discard: tuple[float, ...]
    recompute_ms: float
    peak_bytes: int
    baseline_bytes: int
    budget_bytes: int


class _Unit(torch.nn.Module):
    """One zoo unit as a module running its zoo function. A block keeps its parameters in a child, so that it is
    not a leaf module (sac_milp checkpoints no leaf); the embedding and the head hold theirs (leaves: nothing of
    theirs is checkpointed, and torch's SAC estimator has no trade-off for them)."""

    def __init__(self, params: dict[str, torch.Tensor], fn: Any, *, block: bool = False) -> None:
        super().__init__()
        self.p = torch.nn.ParameterDict({k: torch.nn.Parameter(v) for k, v in params.items()}) if block else None
        if not block:
            for k, v in params.items():
                self.register_parameter(k, torch.nn.Parameter(v))
        self.fn = fn

    def forward(self, *args: Any) -> Any:
        params = dict(self.p.items()) if self.p is not None else dict(self.named_parameters())
        return self.fn(params, *args)


class ZooTransformer(torch.nn.Module):
    """The zoo model of ``spec`` on one rank (no parallelism): ``forward(tokens, labels)`` is the training loss."""

    def __init__(self, spec: Any) -> None:
        from commsched.workloads import model
        from commsched.workloads.program import StepProgram
        from commsched.workloads.real import single_rank_spec

        super().__init__()
        one = dataclasses.replace(single_rank_spec(spec), ac="none", optimizer="none")
        program = StepProgram(one, groups={}, rank=0)
        cfg, s, comm = one.model, program.shapes, program.comm
        self.spec = one
        units: dict[str, dict[str, torch.Tensor]] = {}
        for p in one.layout:
            units.setdefault(p.unit, {})[p.key] = torch.empty(p.local_shape, dtype=one.dtype)
        rope = model.rope_tables(cfg, torch.arange(s.seq), one.dtype)
        self.embed = _Unit(units["embed"], lambda p, t: model.embed(p, t, s, comm))
        self.layers = torch.nn.ModuleList(
            _Unit(units[f"layers.{i}"], lambda p, h: model.block(p, h, cfg, s, comm, rope, None), block=True)
            for i in range(cfg.n_layers)
        )
        self.final = _Unit(units["final"], lambda p, h, y: model.head_loss(p, h, y, cfg, s, comm))

    def forward(self, tokens: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
        h = self.embed(tokens)
        for block in self.layers:
            h = block(h)
        return self.final(h, labels)


def module_info(spec: Any, hardware: Any) -> Any:
    """torch's ``ModuleInfo`` of the zoo model of ``spec``: memory (``MemTracker``), runtime and SAC trade-offs
    (``RuntimeEstimator``, ``SACEstimator``, roofline on ``hardware``'s peak numbers), on fake CPU tensors."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.distributed._tools.ilp_utils import aggregate_stats
    from torch.distributed._tools.mem_tracker import MemTracker
    from torch.distributed._tools.runtime_estimator import RuntimeEstimator
    from torch.distributed._tools.sac_estimator import SACEstimator

    with FakeTensorMode(), _roofline_on(hardware), _pwlf_stand_in(), contextlib.redirect_stdout(io.StringIO()):
        model = ZooTransformer(spec)
        s = model.spec
        tokens = torch.randint(0, s.model.vocab_size, (s.batch, s.seq_len))
        labels = torch.randint(0, s.model.vocab_size, (s.batch, s.seq_len))
        mem = MemTracker()
        mem.track_external(model)
        with mem as mt:
            for step in range(2):  # as torch's test: the second step's statistics
                model(tokens, labels).backward()
                model.zero_grad(set_to_none=True)
                if step == 0:
                    mt.reset_mod_stats()
        runtime = RuntimeEstimator()
        with runtime(estimate_mode_type="operator-level-cost-model"):
            model(tokens, labels).backward()
        sac = SACEstimator()
        with sac(estimate_mode_type="operator-level-cost-model"):
            loss = model(tokens, labels)
        loss.backward()
        return aggregate_stats(model, mem, runtime, sac, torch.device("cpu"))


def ilp_graph(spec: Any, hardware: Any) -> Any:
    """sac_milp's input: the module tree of the zoo model of ``spec`` with torch's statistics
    (:func:`module_info`, then ``parse_module_info``). One per model; :func:`sac_ilp_plan` solves it per budget."""
    from torch.distributed._tools.ilp_utils import parse_module_info

    return parse_module_info(module_info(spec, hardware))


def sac_ilp_plan(g: Any, world_size: int, budget_ratio: float) -> SacIlpPlan:
    """``sac_milp`` on ``g`` (:func:`ilp_graph`), the blocks ``layers.<i>`` the AC units, under ``budget_ratio``
    times its own no-AC peak (the same relative budget as commsched's: each tool's memory model counts different
    things), ``world_size``: FSDP's degree (parameters and gradients sharded)."""
    from torch.distributed._tools.sac_ilp import sac_milp

    baseline = ilp_baseline_bytes(g, world_size)
    budget = int(baseline * budget_ratio)
    units = [n["fqn"] for n in g.nodes if n["fqn"].rsplit(".", 2)[-2:-1] == ["layers"]]
    decisions, recompute_ms, peak = sac_milp(g, memory_budget=budget / GIB, world_size=world_size, ac_units=units)
    discard = tuple(float(decisions.get(fqn, 0.0)) for fqn in units)
    return SacIlpPlan(discard, float(recompute_ms), int(peak), baseline, budget)


def ilp_baseline_bytes(g: Any, world_size: int) -> int:
    """The peak sac_milp's memory formula gives with no AC: max over modules of activations, activation gradients,
    and parameters and gradients divided over ``world_size``."""
    p1 = g.nodes[0]["param_per_module"]
    return int(max(n["act_total"] + n["act_grad_per_module"] + (p1 + n["grad_total"]) / world_size for n in g.nodes))


def as_block_policies(plan: SacIlpPlan, selective_discard: float) -> tuple[str, ...]:
    """The zoo's policy closest to each block's discard fraction, never discarding less: ``none`` at 0,
    ``selective-op`` up to ``selective_discard`` (the fraction of a block's saved activations it drops), else
    ``full``."""
    return tuple("none" if r <= 0 else "selective-op" if r <= selective_discard else "full" for r in plan.discard)


@contextlib.contextmanager
def _roofline_on(hardware: Any):
    """torch's roofline estimate with ``hardware``'s peak flops and HBM bandwidth in place of the CUDA device's
    (``torch.utils._runtime_estimation`` reads both from ``torch._inductor.utils``)."""
    from torch.utils import _runtime_estimation as rt

    peaks = dict(hardware.compute.peak_flops)

    def tflops(dtype: torch.dtype) -> float:
        return peaks.get(str(dtype).removeprefix("torch."), peaks["bfloat16"]) / 1e12

    gbps = hardware.compute.hbm_bandwidth_bytes_per_s / 1e9
    from torch.distributed._tools import runtime_estimator as re

    def compute_time(func_packet, args, kwargs, out, out_dtypes, *rest):  # type: ignore[no-untyped-def]
        # flash attention's outputs are bf16 and its fp32 logsumexp; torch's roofline takes one dtype: the output's
        first = next((t.dtype for t in torch.utils._pytree.tree_leaves(out) if isinstance(t, torch.Tensor)), None)
        dtypes = {first} if len(out_dtypes) > 1 and first in out_dtypes else out_dtypes
        return rt.get_compute_time(func_packet, args, kwargs, out, dtypes, *rest)

    with mock.patch.object(rt, "get_device_tflops", tflops), mock.patch.object(rt, "get_gpu_dram_gbps", lambda: gbps), \
            mock.patch.object(re, "get_compute_time", compute_time), \
            mock.patch.object(torch.cuda, "is_available", lambda: True):  # fmt: skip
        yield


@contextlib.contextmanager
def _pwlf_stand_in():
    """``pwlf`` as ``SACEstimator`` calls it, where it is not installed (see the module docstring)."""
    try:
        import pwlf  # noqa: F401
    except ImportError:
        module = types.ModuleType("pwlf")
        module.PiecewiseLinFit = PiecewiseLinFit
        with mock.patch.dict(sys.modules, {"pwlf": module}):
            yield
        return
    yield


class PiecewiseLinFit:
    """The part of ``pwlf.PiecewiseLinFit`` that ``SACEstimator`` uses: a continuous piecewise-linear least-squares
    fit of ``y`` over ``x`` (``fit(n_segments)``, then ``calc_slopes()``, ``intercepts``, ``fit_breaks``), its
    breakpoints chosen among the points by exhaustive search."""

    def __init__(self, x: Any, y: Any) -> None:
        self.x, self.y = np.asarray(x, dtype=float), np.asarray(y, dtype=float)
        self.fit_breaks = np.array([self.x.min(), self.x.max()])
        self.intercepts = np.zeros(1)
        self._slopes = np.zeros(1)

    def fit(self, n_segments: int) -> np.ndarray:
        import itertools

        inner = np.unique(self.x)[1:-1]
        best = None
        for breaks in itertools.combinations(inner, min(max(n_segments - 1, 0), len(inner))):
            edges = np.array([self.x.min(), *breaks, self.x.max()])
            basis = np.column_stack([np.ones_like(self.x), self.x - edges[0],
                                     *[np.maximum(self.x - b, 0.0) for b in breaks]])  # fmt: skip
            beta, *_ = np.linalg.lstsq(basis, self.y, rcond=None)
            sse = float(np.sum((basis @ beta - self.y) ** 2))
            if best is None or sse < best[0]:
                best = (sse, edges, beta)
        _, edges, beta = best
        slopes = np.cumsum(beta[1:])
        starts = beta[0] + np.concatenate([[0.0], np.cumsum(slopes[:-1] * np.diff(edges)[:-1])])
        self.fit_breaks, self._slopes = edges, slopes
        self.intercepts = starts - slopes * edges[:-1]
        return edges

    def calc_slopes(self) -> np.ndarray:
        return self._slopes

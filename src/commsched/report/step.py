"""One schedule, one number: the predicted step of an order (and its compute streams), as every command reports it.

The simulator runs kernels on different compute streams at full speed each; the ``multi_stream`` pass judges its
placements with a contention charge on top (``compute_interference`` x the time kernels overlap). A schedule records
that charge (``Schedule.compute_interference``, the schedule file's ``compute_interference``), and :func:`predict`
adds it, so ``schedule``, ``simulate --order`` and the pass's own verdict give the same step time.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np

from commsched.cost import CostEstimate
from commsched.ir import Graph
from commsched.sim import SimResult, simulate_costs


@dataclass(frozen=True)
class StepPrediction:
    """A simulated step plus the contention charge of its compute streams (0 with one compute stream)."""

    sim: SimResult
    contention_s: float = 0.0

    @property
    def makespan_s(self) -> float:
        """The step time: the simulator's makespan plus the contention charge."""
        return self.sim.makespan_s + self.contention_s

    def summary(self, hardware: Any = None) -> dict[str, Any]:
        """``SimResult.summary()`` with ``makespan_s`` the step time, plus ``simulated_makespan_s``,
        ``contention_s``, and ``mfu`` and ``tokens_per_s`` over the step time (:mod:`commsched.report.rates`: None
        without ``hardware``'s peak for the graph's dtype, or without its tokens per step): what ``simulate --json``
        and ``schedule --json`` print."""
        from commsched.report.rates import step_rates

        return {
            **self.sim.summary(),
            "makespan_s": self.makespan_s,
            "bound_ratio": self.makespan_s / self.sim.lower_bound_s if self.sim.lower_bound_s > 0 else 1.0,
            "simulated_makespan_s": self.sim.makespan_s,
            "contention_s": self.contention_s,
            **step_rates(self.sim, hardware, makespan_s=self.makespan_s).to_dict(),
        }


def predict(
    g: Graph,
    costs: CostEstimate,
    order: np.ndarray | Sequence[int | str] | None = None,
    streams: np.ndarray | None = None,
    compute_interference: float = 0.0,
) -> StepPrediction:
    """Simulate ``order`` on ``streams`` and add ``compute_interference`` x the time kernels on different compute
    streams overlap (the charge ``multi_stream`` judged with; ``Schedule.compute_interference``)."""
    sim = simulate_costs(g, costs, order, streams)
    if compute_interference <= 0 or sim.num_compute_streams < 2:
        return StepPrediction(sim)
    from commsched.passes.multi_stream import contention_ns

    return StepPrediction(sim, round(compute_interference * contention_ns(sim, g)) * 1e-9)

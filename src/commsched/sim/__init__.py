"""Discrete-event simulation of one step: compute streams, one FIFO comm stream per process group, link sharing,
compute/comm interference, memory over time, lower bounds (see ``engine.py`` for the semantics).

>>> res = simulate_costs(g, costs, order)    # or simulate(g, "h100-sxm", order) once the cost model is in
>>> res.makespan_s, res.exposed_comm_s, res.overlap_ratio, res.peak_memory_bytes, res.bound_ratio
"""

from commsched.sim.bounds import LowerBound, lower_bound
from commsched.sim.result import SimResult
from commsched.sim.simulate import resolve_order, simulate, simulate_costs

__all__ = ["LowerBound", "SimResult", "lower_bound", "resolve_order", "simulate", "simulate_costs"]

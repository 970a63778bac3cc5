"""Discrete-event simulation of one step: compute streams, one FIFO comm stream per process group, link sharing,
compute/comm interference, memory over time, lower bounds. The timing rules are in ``model.py``, the loops that
walk a program through them in ``engine.py`` (single compute stream, several) and ``comm.py`` (the comm streams).

>>> res = simulate_costs(g, costs, order)    # or simulate(g, "h100-sxm", order)
>>> res.makespan_s, res.exposed_comm_s, res.overlap_ratio, res.peak_memory_bytes, res.bound_ratio
"""

from commsched.sim.bounds import LowerBound, lower_bound
from commsched.sim.model import StreamModel, durations_ns
from commsched.sim.result import SimResult
from commsched.sim.simulate import simulate, simulate_costs

__all__ = ["LowerBound", "SimResult", "StreamModel", "durations_ns", "lower_bound", "simulate", "simulate_costs"]

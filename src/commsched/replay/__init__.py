"""Replay PyTorch profiler traces with the simulator (``commsched replay``).

``read_trace`` (:mod:`.kineto`, CPU-only traces by :mod:`.cpu_trace`) turns a trace into items on streams with
their dependencies (:mod:`.work`); ``replay`` / ``replay_traces`` (:mod:`.run`) simulate them through
:func:`commsched.sim.simulate_costs` (:mod:`.graph`) with what-ifs (:mod:`.whatif`) and compare with the measured
timeline; several ranks are aligned by collective sequence.
"""

from commsched.replay.kineto import DEFAULT_COMM_PATTERNS, read_trace
from commsched.replay.run import MultiReplay, ReplayReport, replay, replay_traces
from commsched.replay.whatif import Scale, parse_scale

__all__ = [
    "DEFAULT_COMM_PATTERNS",
    "MultiReplay",
    "ReplayReport",
    "Scale",
    "parse_scale",
    "read_trace",
    "replay",
    "replay_traces",
]

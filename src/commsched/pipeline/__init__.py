"""Pipeline parallelism: torch's schedules as each pipeline rank's action list, simulated rank by rank.

``actions.py`` takes the schedules from torch's own generators and lowering (needs torch); ``costs.py`` is what the
stages cost and the P2P transfers' times (the collective model's ``sendrecv``); ``simulate.py`` runs every rank's
actions with their dependencies across ranks and reports step, bubbles, exposed communication and memory.

>>> from commsched.pipeline import StageCosts, simulate_pipeline
>>> res = simulate_pipeline("1F1B", 4, 8, None, StageCosts(forward_s=1e-3, backward_s=2e-3), free_comm=True)
>>> res.step_s, res.bubble_fraction, [r.bubble_s for r in res.per_rank]
"""

from commsched.pipeline.actions import SCHEDULES, ActionKind, PipelineProgram, lower_schedule, program_from_torch
from commsched.pipeline.costs import StageCosts
from commsched.pipeline.simulate import (
    DeadlockError,
    PipelineResult,
    RankResult,
    simulate_pipeline,
    simulate_program,
)

__all__ = [
    "SCHEDULES",
    "ActionKind",
    "DeadlockError",
    "PipelineProgram",
    "PipelineResult",
    "RankResult",
    "StageCosts",
    "lower_schedule",
    "program_from_torch",
    "simulate_pipeline",
    "simulate_program",
]

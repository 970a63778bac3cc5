"""``commsched plan`` (issue 40): the best parallel layout of a model on a cluster, each candidate judged by the
simulator on its traced program (:mod:`commsched.plan.search`), the winner written as a torchtitan job config
(:mod:`commsched.plan.toml_out`)."""

from commsched.plan.layout import Layout, PlanRequest
from commsched.plan.search import Judged, PlanResult, plan

__all__ = ["Judged", "Layout", "PlanRequest", "PlanResult", "plan"]

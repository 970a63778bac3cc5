"""Real execution: apply a schedule to the FX graph, run it on torch.distributed, measure against the prediction.

* :func:`apply_schedule` reorders (and annotates the streams of) an FX GraphModule in place.
* :func:`run_local` / :func:`run_rank` run a zoo step's original and scheduled orders on real process groups (local
  processes, optionally inside a :func:`shaped_network`; or one rank of a torchrun launch) and report measured vs
  predicted step times.
* :func:`commsched_backend` / :class:`CommschedPostGradPass`: torch.compile integration.
"""

from commsched.lazy import lazy_getattr
from commsched.runtime.apply import STREAM_META_KEY, apply_schedule, copy_graph_module, fx_order
from commsched.runtime.netns import ShapedNetwork, ShapedNetworkUnavailable, parse_rate, parse_time, shaped_network

__all__ = [
    "STREAM_META_KEY",
    "CommschedPostGradPass",
    "RunConfig",
    "ShapedNetwork",
    "ShapedNetworkUnavailable",
    "apply_schedule",
    "commsched_backend",
    "copy_graph_module",
    "fx_order",
    "launched_by_torchrun",
    "parse_rate",
    "parse_time",
    "run_local",
    "run_rank",
    "schedule_fx",
    "shaped_network",
]

_LAZY = {
    "RunConfig": "commsched.runtime.executor",
    "run_rank": "commsched.runtime.executor",
    "run_local": "commsched.runtime.launch",
    "launched_by_torchrun": "commsched.runtime.launch",
    "commsched_backend": "commsched.runtime.compile",
    "CommschedPostGradPass": "commsched.runtime.compile",
    "schedule_fx": "commsched.runtime.compile",
}


# the executor pulls in the workload zoo and torch.distributed: loaded on first use
__getattr__ = lazy_getattr(__name__, _LAZY)

"""The workload zoo: Llama 3 and Mixtral training / inference steps traced at any world size without a GPU.

``build("llama3-8b", parallel="fsdp", world_size=64, layers=4)`` returns a :class:`Workload` with the FX
GraphModule, the commsched Graph and ``meta``. ``StepProgram(spec, groups, rank)`` runs the same step on real
tensors and a real process group.
"""

from commsched.workloads.mesh import INFERENCE_PARALLELISMS, MODES, PARALLELISMS, ParallelPlan, create_groups, make_plan
from commsched.workloads.params import ParamInfo, init_full_params, param_layout, shard_for_rank
from commsched.workloads.presets import PRESETS, ModelConfig, get_preset
from commsched.workloads.program import StepProgram, WorkloadSpec, resolve
from commsched.workloads.trace import Workload, build, trace_spec

__all__ = [
    "INFERENCE_PARALLELISMS",
    "MODES",
    "PARALLELISMS",
    "PRESETS",
    "ModelConfig",
    "ParallelPlan",
    "ParamInfo",
    "StepProgram",
    "Workload",
    "WorkloadSpec",
    "build",
    "create_groups",
    "get_preset",
    "init_full_params",
    "make_plan",
    "param_layout",
    "resolve",
    "shard_for_rank",
    "trace_spec",
]

"""What bounds a simulated step, and what would move it, in plain words (the first lines of a report).

The words come from the simulator's own lower bound (``sim/bounds.py``: ``LowerBound``): the term that binds names
the resource that sets the step (a process group's communication stream, the compute stream, or a chain of
dependent ops), and the numbers are that term against the others. The levers are the changes that shrink the
binding term; they are suggestions the simulator has not judged (``commsched optimize`` judges the program
transforms it knows).
"""

from __future__ import annotations

from typing import Any

from commsched.hardware import Hardware
from commsched.report.units import fmt_seconds
from commsched.sim import SimResult

ROLE_NAMES = {"fsdp": "FSDP", "efsdp": "expert FSDP", "tp": "TP", "dp": "data-parallel", "ep": "EP", "world": "world"}
"""mesh dimension -> the name a user knows the group by"""

LEVERS = {
    "FSDP": ["FSDP over fewer ranks with replicas (HSDP)", "TP to shrink each rank's gathers", "float8 all_gathers",
             "larger buckets where latency dominates"],
    "expert FSDP": ["more EP ranks", "experts kept unsharded"],
    "TP": ["a smaller TP degree", "TP's collectives split into chunks that overlap their matmuls (decomposed TP)"],
    "EP": ["fewer tokens per all_to_all (capacity factor, top-k)",
           "one micro-batch's all_to_all under another's compute (split batch)"],
    "data-parallel": ["sharded gradients (FSDP / ZeRO) in place of all_reduce", "larger buckets"],
}  # fmt: skip
"""role -> changes that move fewer bytes over that group or hide more of them"""


def _group_role(res: SimResult, group_name: str) -> str:
    """The user's name for process group ``group_name`` ("FSDP", "TP", ...), from the workload metadata; the most
    specific mesh dimension whose group it is (the whole world only when nothing else fits)."""
    dims = [d for d, info in res.graph.meta.get("groups", {}).items() if info.get("name") == group_name]
    named = [ROLE_NAMES.get(d, d) for d in dims if d != "world"]
    if res.graph.meta.get("parallel") == "fsdp+ep" and "world" in dims:
        named.insert(0, "FSDP")
    if named:
        return named[0]
    return "world" if dims else f"'{group_name}'"


def _group_phrase(res: SimResult, group_name: str, hardware: Hardware | None) -> str:
    grp = next((g for g in res.graph.groups if g.name == group_name), None)
    role = _group_role(res, group_name)
    if grp is None:
        return f"the {role} group"
    span = ""
    if hardware is not None and hardware.gpus_per_node > 0:
        nodes = -(-grp.size * max(grp.stride, 1) // hardware.gpus_per_node) if grp.size > 1 else 1
        span = f", across {min(nodes, grp.size)} nodes" if nodes > 1 else ", inside one node"
    return f"the {grp.size}-rank {role} group{span}"


def _binding_group(binding: str) -> str | None:
    """The group named by a binding term ('comm:G', 'exposed comm:G', 'comm heads and tails:G'), else None."""
    head, _, group = binding.rpartition(":")
    return group if head in ("comm", "exposed comm", "comm heads and tails") else None


def what_bounds_the_step(res: SimResult, hardware: Hardware | None = None) -> str:
    """One sentence: which resource bounds ``res``'s step and by how much, e.g. "communication-bound on the 64-rank
    FSDP group, across 8 nodes: its stream is busy 195.6 ms against 59.7 ms of compute"."""
    b = res.bound
    group = _binding_group(b.binding)
    busiest_comm = max(b.comm_s.items(), key=lambda kv: kv[1], default=None)
    if group is not None:
        busy = b.comm_s.get(group, 0.0)
        line = (f"communication-bound on {_group_phrase(res, group, hardware)}: its stream is busy "
                f"{fmt_seconds(busy)} against {fmt_seconds(b.compute_s)} of compute")  # fmt: skip
        exposed = (b.exposed_comm_s or {}).get(group, 0.0)
        if b.binding.startswith("exposed") and exposed > busy:
            line += f", and no order can hide all of it (at least {fmt_seconds(exposed - b.compute_s)} stays exposed)"
        elif b.binding.startswith("comm heads"):
            line += " (its first collective cannot start before the step's first inputs are ready)"
        return line
    if b.binding in ("compute", "compute + interference"):
        line = f"compute-bound: the busiest compute stream runs {fmt_seconds(b.compute_s)}"
        if b.binding == "compute + interference":
            line += f" ({fmt_seconds(b.interference_s)} with kernels slowed while communication runs)"
        if busiest_comm is not None:
            line += (f", the busiest communication ({fmt_seconds(busiest_comm[1])} on "
                     f"{_group_phrase(res, busiest_comm[0], hardware)}) can hide behind it")  # fmt: skip
        return line
    return (f"bound by a chain of dependent ops ({b.binding}, {fmt_seconds(b.value_s)}): compute "
            f"{fmt_seconds(b.compute_s)}, the busiest communication "
            f"{fmt_seconds(busiest_comm[1] if busiest_comm else 0.0)}")  # fmt: skip


def what_would_move_it(res: SimResult, hardware: Hardware | None = None) -> str:
    """One sentence: the changes that shrink the binding term (not simulated here)."""
    b = res.bound
    gap = res.makespan_s / res.lower_bound_s if res.lower_bound_s > 0 else 1.0
    scheduling = f"the step is {gap:.2f}x its lower bound" + (
        ": a better order can still gain" if gap > 1.05 else ": no order gains much more"
    )
    group = _binding_group(b.binding)
    if group is not None:
        levers = list(LEVERS.get(_group_role(res, group), ["fewer bytes on that group"]))
        if "across" in _group_phrase(res, group, hardware):
            levers.append("the group inside one node, or a faster network")
        return f"{scheduling}; to move the bound: " + "; ".join(levers)
    if b.binding in ("compute", "compute + interference"):
        return f"{scheduling}; to move the bound: faster kernels or fewer flops (communication already fits)"
    return (f"{scheduling}; to move the bound: independent work beside the chain (split the batch or the sequence "
            f"into micro-batches), or a shorter chain")  # fmt: skip


def bound_summary(res: SimResult, hardware: Hardware | None = None) -> dict[str, Any]:
    """Both sentences and the binding term, for JSON."""
    return {
        "binding": res.bound.binding,
        "what_bounds_the_step": what_bounds_the_step(res, hardware),
        "what_would_move_it": what_would_move_it(res, hardware),
    }

"""One row of a what-if sweep (:class:`SweepRow`): what :mod:`commsched.experiments.sweep_task` computes for one
configuration and :mod:`commsched.experiments.sweep` collects, stores and returns; plain JSON both ways
(:meth:`SweepRow.to_dict`, :meth:`SweepRow.from_dict`)."""

from __future__ import annotations

import dataclasses
import math
from typing import Any

RUN_FIELDS = ("trace_wall_s", "estimate_wall_s", "schedule_wall_s", "simulate_wall_s", "pid", "host", "trace_cached")
"""how a row was computed rather than what it says: differs between runs and backends"""


@dataclasses.dataclass(frozen=True, kw_only=True)
class SweepRow:
    """One configuration of a sweep. ``*_input_*`` fields are the traced (program) order; the others the order the
    ``schedule`` passes chose (the same as the input order when ``schedule`` is None). ``error`` is set, and the
    metrics are NaN / -1, when the configuration failed; ``trace_wall_s`` is shared by the rows of one trace;
    ``*_version`` are those of the process that computed the row. A pipeline row (``pp_size`` > 1) has one order:
    both step times are the simulated pipeline step, exposed communication and peak memory the worst rank's."""

    preset: str
    parallel: str
    world_size: int
    hardware: str
    num_nodes: int = -1
    gpus_per_node: int = -1
    layers: int = -1
    schedule: str | None = None
    optimize: bool = False  # True: commsched.optimize (order and collectives) instead of ``schedule``
    fsdp_bucket: str = "param"
    num_graph_nodes: int = -1
    tokens_per_step: int = -1
    fsdp_pad_bytes: int = -1  # bytes of padding in each FSDP all_gather (shards rounded up to divide the world)
    step_time_input_s: float = math.nan
    step_time_s: float = math.nan
    exposed_comm_input_s: float = math.nan
    exposed_comm_s: float = math.nan
    overlap_ratio_input: float = math.nan
    overlap_ratio: float = math.nan
    peak_memory_input_bytes: int = -1
    peak_memory_bytes: int = -1
    lower_bound_s: float = math.nan
    trace_wall_s: float = math.nan
    estimate_wall_s: float = math.nan
    schedule_wall_s: float = math.nan
    simulate_wall_s: float = math.nan
    optimize_kept: str | None = None  # the variant optimize kept
    pp_size: int = 1  # pipeline ranks (P); 1: no pipeline (the other pipeline fields are unset)
    pp_schedule: str | None = None  # torch's pipeline schedule
    microbatches: int = -1  # M
    stages_per_rank: int = -1  # V
    bubble_fraction: float = math.nan  # idle compute over the step, mean over the pipeline ranks
    tokens_per_s_per_gpu: float = math.nan  # a pipeline row's (torchtitan's tps)
    mfu: float = math.nan  # a pipeline row's model FLOPs utilisation
    trace_cached: bool = False  # the graph came from the trace cache
    pid: int = -1  # the process that traced and simulated this configuration
    host: str = ""
    commsched_version: str = ""
    torch_version: str = ""
    numpy_version: str = ""
    error: str | None = None

    @property
    def ok(self) -> bool:
        return self.error is None

    @property
    def speedup(self) -> float:
        """Input-order step time / scheduled step time."""
        return self.step_time_input_s / self.step_time_s if self.ok and self.step_time_s > 0 else math.nan

    @property
    def compute_bound_s(self) -> float:
        """The part of the scheduled step not spent waiting on communication (step time - exposed comm)."""
        return self.step_time_s - self.exposed_comm_s

    def result_dict(self) -> dict[str, Any]:
        """:meth:`to_dict` without :data:`RUN_FIELDS`: what every backend and every run must agree on."""
        return {k: v for k, v in self.to_dict().items() if k not in RUN_FIELDS}

    def to_dict(self) -> dict[str, Any]:
        """Plain JSON values; NaN becomes None."""
        d = dataclasses.asdict(self)
        return {k: (None if isinstance(v, float) and math.isnan(v) else v) for k, v in d.items()}

    @classmethod
    def from_dict(cls, data: dict[str, Any], where: str = "<row>") -> SweepRow:
        """The inverse of :meth:`to_dict`; an unknown or missing field is a ValueError naming it."""
        fields = {f.name: f for f in dataclasses.fields(cls)}
        unknown = sorted(set(data) - set(fields))
        if unknown:
            raise ValueError(f"{where}: unknown field(s) {unknown}")
        missing = sorted(k for k in ("preset", "parallel", "world_size", "hardware") if k not in data)
        if missing:
            raise ValueError(f"{where}: missing field(s) {missing}")
        kw = {k: (math.nan if v is None and fields[k].type == "float" else v) for k, v in data.items()}
        return cls(**kw)

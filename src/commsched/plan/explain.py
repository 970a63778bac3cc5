"""``plan --explain``: for one given layout, the cheapest changes that would move its bound, each judged by the
simulator (the task plan judges with, :func:`commsched.plan.judge.judge_task`) and sorted by the gain in tokens/s
per GPU.

The changes tried are one step each from the layout: more replicas (HSDP) instead of a wider shard group, a larger
micro-batch (without PP: twice the local batch, so twice the global batch; with PP: half the micro-batches), half
the TP degree (its ranks moved to the shard group), twice or half the EP degree (MoE presets), every other AC
policy, float8 on or off, FSDP's reshard-after-forward off or on (FSDP / HSDP without PP), async TP on or off (TP
with SP, where the hardware runs it). A change is kept only
if plan itself would enumerate it (:func:`commsched.plan.enumerate.enumerate_layouts`: degrees dividing the GPUs,
heads, batch); one that does not fit the HBM when simulated is listed as such, never ranked above one that fits.
"""

from __future__ import annotations

import dataclasses
from typing import Any

from commsched.plan.enumerate import divisors, enumerate_layouts
from commsched.plan.layout import LAYOUT_FIELDS, Layout, PlanRequest

TASK_FN = "commsched.plan.judge:judge_task"
AC_POLICIES = ("none", "selective-op", "full")
MAX_HSDP_CHOICES = 3
"""replica counts tried for HSDP: the smallest few (a wider shard group's all-gathers cross fewer nodes first)"""
_INT_FIELDS = {f.name for f in dataclasses.fields(Layout) if f.type == "int"}
_BOOL_FIELDS = {f.name for f in dataclasses.fields(Layout) if f.type == "bool"}


def parse_layout(text: str) -> Layout:
    """``"dp_shard=32,tp=8,sp=true,ac=full"`` as a :class:`Layout` (fields of ``plan --json``'s layout; the others
    default). ValueError (one line) naming the key for an unknown key or a value of the wrong kind."""
    values: dict[str, Any] = {}
    for item in (s.strip() for s in text.split(",") if s.strip()):
        key, sep, value = (part.strip() for part in item.partition("="))
        if not sep or key not in LAYOUT_FIELDS:
            raise ValueError(f"--layout {item!r}: expected KEY=VALUE with KEY one of {', '.join(LAYOUT_FIELDS)}")
        if key in _INT_FIELDS:
            if not value.isdigit() or int(value) < 1:
                raise ValueError(f"--layout {key}={value!r}: expected an integer >= 1")
            values[key] = int(value)
        elif key in _BOOL_FIELDS:
            if value.lower() not in ("true", "false", "1", "0"):
                raise ValueError(f"--layout {key}={value!r}: expected true or false")
            values[key] = value.lower() in ("true", "1")
        else:
            values[key] = value
    if "dp_shard" not in values:
        raise ValueError("--layout: expected dp_shard=N (the FSDP shard degree; 1 for none)")
    return Layout(**values)


@dataclasses.dataclass(frozen=True)
class Change:
    """One judged change of the layout: what was changed, the layout and request it gives, and its numbers at the
    model's depth (``error`` set instead when it could not be judged)."""

    what: str
    layout: Layout
    request: PlanRequest
    step_s: float = 0.0
    tokens_per_s_per_gpu: float = 0.0
    peak_memory_bytes: float = 0.0
    exposed_comm_s: float = 0.0
    recompute_s: float = 0.0
    bubble_fraction: float = 0.0
    fits: bool = False
    error: str | None = None

    def gain(self, base: Change) -> float:
        """The fraction by which tokens/s per GPU rises over ``base`` (negative: a loss)."""
        return self.tokens_per_s_per_gpu / base.tokens_per_s_per_gpu - 1 if base.tokens_per_s_per_gpu else 0.0

    def as_dict(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        out["layout"], out["global_batch"] = self.layout.to_dict(), self.request.batch
        del out["request"]
        return out


@dataclasses.dataclass
class Explained:
    """The given layout judged, and each change, best gain first (changes that fit the HBM before those that do
    not, failures last)."""

    base: Change
    changes: list[Change]

    def as_dict(self) -> dict[str, Any]:
        return {"base": self.base.as_dict(),
                "changes": [{**c.as_dict(), "gain": c.gain(self.base)} for c in self.changes]}  # fmt: skip


def _valid(req: PlanRequest, gpus_per_node: int) -> set[Layout]:
    """Every layout plan enumerates for ``req`` with every AC policy and float8 recipe."""
    wide = dataclasses.replace(req, ac_policies=AC_POLICIES, float8_recipes=("none", "tensorwise"), max_pp=None,
                               reshard_after_forward=(True, False), async_tp=(False, True))  # fmt: skip
    return set(enumerate_layouts(wide, gpus_per_node, float8_ok=True))


def candidate_changes(req: PlanRequest, layout: Layout, float8_ok: bool) -> list[tuple[str, PlanRequest, Layout]]:
    """The one-step changes of ``layout`` (see the module docstring), unvalidated."""
    out: list[tuple[str, PlanRequest, Layout]] = []
    replicas = [r for r in divisors(layout.dp_shard) if r > 1 and layout.dp_shard // r * layout.cp >= 2]
    for r in replicas[:MAX_HSDP_CHOICES]:
        lay = dataclasses.replace(layout, dp_replicate=layout.dp_replicate * r, dp_shard=layout.dp_shard // r)
        out.append((f"HSDP: {lay.dp_replicate} replicas of a {lay.dp_shard}-way shard group", req, lay))
    if layout.pp > 1 and layout.microbatches % 2 == 0 and layout.microbatches // 2 >= layout.pp:
        lay = dataclasses.replace(layout, microbatches=layout.microbatches // 2)
        out.append((f"micro-batches {layout.microbatches} -> {lay.microbatches} (each twice as large)", req, lay))
    elif layout.pp == 1:
        bigger = dataclasses.replace(req, global_batch=2 * req.batch)
        out.append((f"micro-batch x 2 (global batch {bigger.batch})", bigger, layout))
    if layout.tp > 1:
        lay = dataclasses.replace(layout, tp=layout.tp // 2, sp=layout.sp and layout.tp > 2,
                                  dp_shard=layout.dp_shard * 2)  # fmt: skip
        out.append((f"TP {layout.tp} -> {lay.tp}, FSDP {layout.dp_shard} -> {lay.dp_shard}", req, lay))
    if req.model().n_experts:
        for ep in sorted({layout.ep * 2, layout.ep // 2} - {0, layout.ep}):
            out.append((f"EP {layout.ep} -> {ep}", req, dataclasses.replace(layout, ep=ep)))
    for ac in AC_POLICIES:
        if ac != layout.ac:
            out.append((f"AC {layout.ac} -> {ac}", req, dataclasses.replace(layout, ac=ac)))
    if layout.float8 != "none":
        out.append((f"float8 {layout.float8} -> none (bf16)", req, dataclasses.replace(layout, float8="none")))
    elif float8_ok:
        out.append(("float8 tensorwise", req, dataclasses.replace(layout, float8="tensorwise")))
    reshard = not layout.reshard_after_forward
    out.append(("FSDP reshard after forward" if reshard else "FSDP keeps gathered weights (no reshard after forward)",
                req, dataclasses.replace(layout, reshard_after_forward=reshard)))  # fmt: skip
    out.append(("async TP off" if layout.async_tp else "async TP", req,
                dataclasses.replace(layout, async_tp=not layout.async_tp)))  # fmt: skip
    return out


def _judged(what: str, req: PlanRequest, layout: Layout, row: dict[str, Any], hbm_bytes: float) -> Change:
    if row.get("error") is not None:
        return Change(what, layout, req, error=str(row["error"]))
    return Change(what, layout, req, step_s=row["step_s"], peak_memory_bytes=row["peak_memory_bytes"],
                  tokens_per_s_per_gpu=req.batch * req.seq / row["step_s"] / req.gpus,
                  exposed_comm_s=row["exposed_comm_s"], recompute_s=row["recompute_s"],
                  bubble_fraction=row.get("bubble_fraction", 0.0),
                  fits=row["peak_memory_bytes"] <= hbm_bytes)  # fmt: skip


def explain(req: PlanRequest, layout: Layout, *, executor: Any = None, jobs: int | None = None,
            ray_address: str | None = None, cache: bool = True) -> Explained:  # fmt: skip
    """``layout`` for ``req`` and its one-step changes, each judged as plan judges (optimised, K and 2K layers
    scaled). ValueError (one line) for a layout plan would not enumerate."""
    from commsched.execute.factory import make_executor
    from commsched.plan.search import plan_hardware

    hw = plan_hardware(req)
    float8_ok = "float8_e4m3fn" in dict(hw.compute.peak_flops)
    if layout not in _valid(req, hw.gpus_per_node):
        raise ValueError(f"--layout {layout.label()}: not a layout plan runs for {req.preset} on {req.gpus} GPUs "
                         f"(degrees multiply to {layout.world_size}; TP within a node dividing the heads; the global "
                         f"batch {req.batch} split over {layout.dp} replicas)")  # fmt: skip
    valid: dict[int, set[Layout]] = {}
    tried = [("as given", req, layout)]
    for what, r, lay in candidate_changes(req, layout, float8_ok):
        if lay in valid.setdefault(r.batch, _valid(r, hw.gpus_per_node)):
            tried.append((what, r, lay))
    specs = [{"request": dataclasses.asdict(r), "hardware": hw, "cache": cache, "optimize": True,
              "layouts": [lay.to_dict()]} for _, r, lay in tried]  # fmt: skip
    own = executor is None
    executor = executor or make_executor(jobs=jobs, ray_address=ray_address)
    try:
        rows = executor.map(TASK_FN, specs, fail=lambda spec, text: [{"error": text}])
    finally:
        if own:
            executor.close()
    hbm = hw.compute.hbm_capacity_bytes
    judged = [_judged(what, r, lay, got[0], hbm) for (what, r, lay), got in zip(tried, rows, strict=True)]
    base, changes = judged[0], judged[1:]
    changes.sort(key=lambda c: (c.error is not None, not c.fits, -c.tokens_per_s_per_gpu))
    return Explained(base, changes)

"""FX-level rewrites of a traced step: bucketing, collective lowering choices, FSDP graph passes.

Each rewrite takes a ``torch.fx.GraphModule`` (traced with make_fx on fake tensors, ``_c10d_functional``
collectives), works on a copy, and returns a :class:`RewriteResult` (the new module and its decisions). The result
imports with ``commsched.from_fx`` like the original, so it can be costed, scheduled and simulated.
"""

from commsched.rewrites.bucket_plan import Bucket, BucketConfig, BucketPlan, bucket_cap_bytes, plan_buckets
from commsched.rewrites.bucketing import apply_bucket_plan, bucket_collectives
from commsched.rewrites.fxutil import RewriteResult, stable_toposort
from commsched.rewrites.spmd import run_spmd

__all__ = [
    "Bucket",
    "BucketConfig",
    "BucketPlan",
    "RewriteResult",
    "apply_bucket_plan",
    "bucket_cap_bytes",
    "bucket_collectives",
    "plan_buckets",
    "run_spmd",
    "stable_toposort",
]

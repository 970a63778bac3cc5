"""Split-sequence overlap (chunked prefill, as vLLM's and SGLang's chunked prefill run a prompt; in training, a
sequence pipeline as TeraPipe's): each sequence of a prefill or a training step run as ``k`` chunks of equal length,
layer by layer, as a retrace of the zoo step (:meth:`commsched.workloads.program.StepProgram.chunk_shapes`).

Layer ``i`` of chunk ``c`` attends (causally, bottom-right aligned, as flash attention aligns it) to every position
up to its own end: in a prefill it writes the KV cache at its positions and reads the cache, in training it reads
the keys and values layer ``i`` of chunks ``0 .. c - 1`` computed (their gradients flow back to them). It reads
nothing of later chunks, so chunk ``c``'s layer ``i`` does not wait for chunk ``c - 1``'s collectives after that
layer's attention: a scheduler that reorders collectives (``overlap`` with ``reorder_collectives``) can run one
chunk's TP collectives (the sequence-parallel all_gather / reduce_scatter, the all_reduce) or MoE dispatch /
combine under another chunk's compute, which moves the lower bound where a one-sequence batch cannot be split along
the batch (:mod:`commsched.rewrites.split_batch`). A prefill's logits are each sequence's last position's, the last
chunk's, and its KV cache holds every position; a training step's loss is the mean of the chunks' mean losses (the
step's), each parameter taken once for all chunks (one FSDP gather, one gradient per parameter).

Nodes of chunk ``c`` carry ``node.meta["custom"]["micro_batch"] = c`` (and their position among the chunk's
nodes), as split-batch's micro-batches do, so that :func:`commsched.rewrites.split_batch.interleave_micro_batches`
orders them. The same function as the step (to rounding: smaller matmuls may round otherwise), except that a MoE's
expert capacity is per chunk: where an expert overflows, a chunk drops other tokens than the step does. What a
split costs (smaller GEMMs, attention over a longer prefix per chunk, each collective's latency) is the cost
model's; the simulator decides (:mod:`commsched.optimize.families.split_sequence`).
"""

from __future__ import annotations

from typing import Any

import torch.fx.traceback as fx_traceback

from commsched.ir import GraphError
from commsched.rewrites.decompose_tp import TRANSFORM_META
from commsched.rewrites.fxutil import RewriteResult
from commsched.rewrites.split_batch import MICRO_BATCH, POSITION, micro_batch_of


def why_not_split_sequence(spec: Any, chunks: int | None = None) -> str | None:
    """Why the zoo step ``spec`` (a ``WorkloadSpec``) cannot run its sequences as ``chunks`` chunks (None: as any
    number), or None."""
    if spec.mode == "decode":
        return "mode 'decode': one new position per sequence, nothing to split"
    if spec.train and spec.plan.tp == 1 and spec.plan.ep == 1:
        return ("a training step without TP or EP: its collectives are per parameter (a gather before a layer, a "
                "gradient reduction after it), which a split along the sequence does not move")  # fmt: skip
    if chunks is None:
        return None
    if chunks < 2 or spec.seq_len % chunks:
        return f"a sequence of {spec.seq_len} positions does not divide into {chunks} equal chunks"
    if spec.plan.sp and spec.batch * (spec.seq_len // chunks) % spec.plan.tp:
        return (f"sequence parallelism: a chunk's {spec.batch * (spec.seq_len // chunks)} tokens do not divide over "
                f"tp={spec.plan.tp}")  # fmt: skip
    return None


def split_zoo_sequence(spec: Any, chunks: int = 2) -> RewriteResult:
    """The zoo step ``spec`` retraced with its sequences as ``chunks`` chunks (module docstring), as rank 0 of a
    fake process group (or of the real one when initialised, as :func:`commsched.workloads.build`), in the traced
    order (layer by layer, chunk 0 first within each). Same inputs and outputs as the step. Rows: one per chunk.
    Raises GraphError with :func:`why_not_split_sequence`'s reason when it does not apply."""
    from commsched.frontends.fake_pg import fake_process_group
    from commsched.workloads.mesh import create_groups
    from commsched.workloads.program import StepProgram
    from commsched.workloads.trace import TRACED_RANK, trace_step

    why = why_not_split_sequence(spec, chunks)
    if why is not None:
        raise GraphError(f"split sequence: {why}")
    with fake_process_group(spec.plan.world_size, rank=TRACED_RANK):
        program = StepProgram(spec, create_groups(spec.plan, TRACED_RANK), TRACED_RANK)
        program.seq_chunks = chunks
        program.chunk_scope = lambda c: fx_traceback.annotate({MICRO_BATCH: c})
        with fx_traceback.preserve_node_meta():
            gm = trace_step(program)
    seen: dict[int, int] = {}
    for n in gm.graph.nodes:
        c = micro_batch_of(n)
        if c is not None:
            n.meta["custom"] = {**n.meta["custom"], POSITION: seen.get(c, 0)}
            n.meta[TRANSFORM_META] = "split_sequence"  # smaller matmuls: the runtime compares to a tolerance
            seen[c] = seen.get(c, 0) + 1
    result = RewriteResult(gm=gm, name="split_sequence")
    length = spec.seq_len // chunks
    for c in range(chunks):
        result.rows.append({"chunk": c, "positions": [c * length, (c + 1) * length], "nodes": seen.get(c, 0)})
    result.replaced["step"] = None  # every node of the step is replaced by the chunks'
    return result

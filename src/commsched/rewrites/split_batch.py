"""Split-batch overlap (two micro-batches, as DeepSeek's dual micro-batch and SGLang's two-batch overlap), as a
retrace.

A step over a batch of ``B`` sequences becomes the same step run on micro-batches of ``b_0 + b_1 + ... = B``
sequences, one after the other in one graph: each data input is narrowed along its batch dimension, the
micro-batches' outputs are merged back into the whole step's (concatenated, or averaged with weights ``b_c / B`` for
a mean loss and its gradients), and everything else is duplicated. The program's signature and outputs are the
step's, so the result runs where the step runs. Micro-batch ``c``'s nodes carry ``node.meta["custom"]
["micro_batch"] = c``. Micro-batch 1's compute does not depend on micro-batch 0's collectives, so a scheduler that
reorders collectives (``overlap`` with ``reorder_collectives``) can run one micro-batch's communication (MoE
dispatch / combine, TP all_gather / reduce_scatter / all_reduce) under the other's compute: that moves the lower
bound, which splitting one collective cannot (benchmarks/RESULTS.md, issue 18). Every rank traces the same
program, so each process group's collectives have one issue order on every rank (SPMD); a reordering schedule
decides one order for all.

Work that depends only on inputs the micro-batches share (weights: casts, FSDP all_gathers of parameters) is the
same in every micro-batch; :func:`share_across_micro_batches` keeps micro-batch 0's node for the ``k``-th such
node of each later micro-batch (pure ops with identical arguments only, never across an in-place write), so a
weight is cast or gathered once per use as in the step. Gradient reductions are not merged: each micro-batch
reduces its own gradients (a fold ``reduce(g_0) + reduce(g_1) -> reduce(g_0 + g_1)`` is not built), which the cost
model charges.

Where it applies (:func:`why_not_split`): a zoo step (:mod:`commsched.workloads`; the micro-batch step is the zoo's
own step retraced at the smaller batch) with ``batch >= 2``. A prefill's prompt splits along the sequence instead
(:mod:`commsched.rewrites.split_sequence`: its chunks are not independent, a later one reads the earlier ones' keys
and values). A MoE step's expert capacity is per
micro-batch (as in the systems above), so where an expert overflows, the split drops other tokens than the step
does; where no token is dropped it is the same function.
"""

from __future__ import annotations

import dataclasses
import operator
from collections.abc import Callable, Sequence
from typing import Any

import torch
import torch.fx
import torch.fx.traceback as fx_traceback

from commsched.ir import Graph, GraphError
from commsched.rewrites.decompose_tp import TRANSFORM_META
from commsched.rewrites.fxutil import RewriteResult, copy_graph_module, ir_control_edges, stable_toposort

MICRO_BATCH = "micro_batch"
"""key in ``node.meta["custom"]``: the micro-batch a node computes (absent: shared, or the merge of outputs)"""
POSITION = "micro_batch_position"
"""key in ``node.meta["custom"]``: the node's position among its micro-batch's nodes as traced"""

Step = Callable[..., list[torch.Tensor]]
Merge = Callable[[list[list[torch.Tensor]], Sequence[int]], list[torch.Tensor]]


def micro_batch_sizes(batch: int, parts: int = 2) -> tuple[int, ...]:
    """``parts`` sizes summing to ``batch``, the larger first (5 -> (3, 2)). Raises ValueError when ``batch <
    parts``."""
    if parts < 2 or batch < parts:
        raise ValueError(f"batch={batch}, parts={parts}: expected 2 <= parts <= batch")
    return tuple(batch // parts + (1 if c < batch % parts else 0) for c in range(parts))


def merged_step(steps: Sequence[Step], sizes: Sequence[int], batch_dims: Sequence[int | None], merge: Merge) -> Step:
    """A function of the whole step's inputs: input ``i`` narrowed along ``batch_dims[i]`` (None: shared) to each
    micro-batch's rows, ``steps[c]`` run on micro-batch ``c`` (``sizes[c]`` sequences) under the ``micro_batch``
    annotation, and ``merge(per micro-batch outputs, sizes)`` returned. Trace it with make_fx inside
    ``torch.fx.traceback.preserve_node_meta()`` to keep the annotation."""
    total = sum(sizes)

    def fn(*inputs: torch.Tensor) -> list[torch.Tensor]:
        outs, start = [], 0
        for c, (step, b) in enumerate(zip(steps, sizes, strict=True)):
            with fx_traceback.annotate({MICRO_BATCH: c}):
                xs = []
                for x, d in zip(inputs, batch_dims, strict=True):
                    per = x.shape[d] // total if d is not None else 0
                    xs.append(x if d is None else x.narrow(d, start * per, b * per))
                outs.append(list(step(*xs)))
            start += b
        return merge(outs, sizes)

    return fn


def micro_batch_of(node: torch.fx.Node) -> int | None:
    custom = node.meta.get("custom")
    return custom.get(MICRO_BATCH) if isinstance(custom, dict) else None


def _pure(node: torch.fx.Node) -> bool:
    if node.op != "call_function":
        return False
    if node.target is operator.getitem:
        return True
    schema = getattr(node.target, "_schema", None)
    if not isinstance(node.target, torch._ops.OpOverload) or schema is None or schema.is_mutable:
        return False
    return torch.Tag.nondeterministic_seeded not in node.target.tags


def _written_families(gm: torch.fx.GraphModule) -> set[torch.fx.Node]:
    """Every node in a view family some in-place op writes (a view's family: its first argument's; a written
    view taints its base and every other view of it)."""
    root: dict[torch.fx.Node, torch.fx.Node] = {}
    written: set[torch.fx.Node] = set()
    for n in gm.graph.nodes:
        schema = getattr(n.target, "_schema", None)
        base = n.args[0] if n.args and isinstance(n.args[0], torch.fx.Node) else None
        is_view = schema is not None and bool(schema.returns) and schema.returns[0].alias_info is not None
        root[n] = root[base] if (is_view or n.target is operator.getitem) and base is not None else n
        if schema is not None and schema.is_mutable:
            for a, arg in zip(schema.arguments, n.args, strict=False):
                if a.alias_info is not None and a.alias_info.is_write and isinstance(arg, torch.fx.Node):
                    written.add(root[arg])
    return {n for n, r in root.items() if r in written}


def share_across_micro_batches(gm: torch.fx.GraphModule) -> int:
    """Common-subexpression elimination across micro-batches, in place: the ``k``-th pure node of micro-batch
    ``c > 0`` with the same target and (already shared) arguments as the ``k``-th such node of micro-batch 0 is
    replaced by it. Nodes reading a tensor some in-place op writes are left alone. Returns the nodes removed.
    O(N)."""
    tainted = _written_families(gm)
    first: dict[Any, list[torch.fx.Node]] = {}
    taken: dict[tuple[int, Any], int] = {}
    removed = 0

    for n in list(gm.graph.nodes):
        c = micro_batch_of(n)
        if c is None or not _pure(n) or any(a in tainted for a in n.all_input_nodes) or n in tainted:
            continue
        key = (n.target, _hashable((n.args, n.kwargs)))  # a shared argument is already micro-batch 0's node
        if c == 0:
            first.setdefault(key, []).append(n)
            continue
        k = taken.get((c, key), 0)
        candidates = first.get(key, [])
        if k < len(candidates):
            taken[(c, key)] = k + 1
            n.replace_all_uses_with(candidates[k])
            gm.graph.erase_node(n)
            removed += 1
    return removed


def _hashable(x: Any) -> Any:
    if isinstance(x, (list, tuple)):
        return (type(x).__name__, *(_hashable(v) for v in x))
    if isinstance(x, dict):
        return tuple(sorted((k, _hashable(v)) for k, v in x.items()))
    if isinstance(x, (torch.fx.Node, int, float, bool, str, type(None), torch.dtype, torch.device, torch.layout,
                      torch.memory_format)):  # fmt: skip
        return x
    return ("id", id(x))  # anything else (a torchbind object, a tensor constant): equal only to itself


def trace_merged(fn: Step, inputs: Sequence[torch.Tensor]) -> torch.fx.GraphModule:
    """make_fx of a :func:`merged_step` on ``inputs`` (fake tensors, traced in their mode), keeping the
    micro-batch annotations, then :func:`share_across_micro_batches`. Dead nodes are removed. The micro-batches
    come one after the other (see :func:`interleave_micro_batches`); each node's position among its
    micro-batch's nodes as traced is kept in ``node.meta["custom"]["micro_batch_position"]``."""
    from torch.fx.experimental.proxy_tensor import make_fx

    with fx_traceback.preserve_node_meta():
        gm = make_fx(fn)(*inputs)
    seen: dict[int, int] = {}
    for n in gm.graph.nodes:
        c = micro_batch_of(n)
        if c is not None:
            n.meta["custom"] = {**n.meta["custom"], POSITION: seen.get(c, 0)}
            seen[c] = seen.get(c, 0) + 1
    share_across_micro_batches(gm)
    gm.graph.eliminate_dead_code()
    for n in gm.graph.nodes:  # the merge of the outputs: the runtime compares them to a reduction's tolerance
        if n.op == "call_function" and micro_batch_of(n) is None:
            n.meta[TRANSFORM_META] = "split_batch"
    gm.recompile()
    return gm


def interleave_micro_batches(gm: torch.fx.GraphModule, graph: Graph) -> torch.fx.GraphModule:
    """A copy of the split module ``gm`` (``graph``: its IR, whose in-place ordering edges are kept) in which the
    micro-batches alternate node by node: the ``k``-th node of every micro-batch as traced, micro-batch 0 first.
    A list scheduler takes the program order as a priority, and one micro-batch after the other gives it no
    reason to start micro-batch 1's compute while micro-batch 0 communicates (on llama3-8b TP+SP prefill, 2 x 4096
    tokens, the scheduled step was 8.43 ms one after the other, 6.52 ms interleaved). O(N log N)."""
    out = copy_graph_module(gm)
    edges = ir_control_edges(out, graph)
    prio = {}
    for n in out.graph.nodes:
        c = micro_batch_of(n)
        if c is not None:
            prio[n] = n.meta["custom"][POSITION] + c / (c + 1.0)
    stable_toposort(out.graph, prio, edges)
    out.recompile()
    return out


# ------------------------------------------------------------------ the zoo's steps


def why_not_split(spec: Any, parts: int = 2) -> str | None:
    """Why the zoo step ``spec`` (a ``WorkloadSpec``) cannot be split into ``parts`` micro-batches, or None."""
    if getattr(spec, "optimizer", "none") != "none":
        return (f"optimizer={spec.optimizer!r}: each micro-batch's step would update the parameters; split the step "
                "up to its gradients (optimizer='none')")  # fmt: skip
    if spec.batch < parts:
        return (f"batch {spec.batch}: a split along the batch needs >= {parts} sequences (a prefill's prompt can "
                "be split along the sequence: rewrites/split_sequence.py)")  # fmt: skip
    if spec.plan.sp:
        per_seq = 1 if spec.mode == "decode" else spec.seq_len
        for b in micro_batch_sizes(spec.batch, parts):
            if b * per_seq % spec.plan.tp:
                return (
                    f"sequence parallelism: a micro-batch's {b * per_seq} tokens do not divide over tp={spec.plan.tp}"
                )
    return None


def _zoo_merge(spec: Any) -> Merge:
    """The whole step's outputs from the micro-batches': train ``[loss, *grads]`` averaged with weights
    ``b_c / B`` (a mean loss); inference logits ``[tp * b_c, rows]`` (rank-major) interleaved back to
    ``[tp * B, rows]``."""
    tp, total = spec.plan.tp, spec.batch

    def merge(outs: list[list[torch.Tensor]], sizes: Sequence[int]) -> list[torch.Tensor]:
        if spec.train:  # equal micro-batches: one sum, one scale (a kernel less per gradient than a scale each)
            equal = len(set(sizes)) == 1
            merged = []
            for k in range(len(outs[0])):
                terms = [out[k] if equal else out[k] * (b / total) for out, b in zip(outs, sizes, strict=True)]
                acc = terms[0]
                for t in terms[1:]:
                    acc = acc + t
                merged.append(acc * (1.0 / len(sizes)) if equal else acc)
            return merged
        rows = outs[0][0].shape[-1]
        parts = [out[0].view(tp, b, rows) for out, b in zip(outs, sizes, strict=True)]
        return [torch.cat(parts, dim=1).view(tp * total, rows)]

    return merge


@dataclasses.dataclass(frozen=True)
class SplitBatch:
    """A zoo step split into micro-batches: the sizes and which inputs are narrowed, along which dim."""

    sizes: tuple[int, ...]
    batch_dims: tuple[int | None, ...]


def split_zoo_step(spec: Any, parts: int = 2, *, interleave: bool = True) -> RewriteResult:
    """The zoo step ``spec`` retraced as ``parts`` micro-batches in one graph (module docstring), as rank 0 of a
    fake process group (or of the real one when initialised, as :func:`commsched.workloads.build`), interleaved
    (:func:`interleave_micro_batches`) or one after the other. Same inputs and outputs as the step.
    ``extra["split"]``: the :class:`SplitBatch`; rows: one per micro-batch. Raises GraphError with
    :func:`why_not_split`'s reason when it does not apply."""
    from torch._subclasses.fake_tensor import FakeTensorMode

    from commsched.frontends.fake_pg import fake_process_group
    from commsched.workloads.mesh import create_groups
    from commsched.workloads.program import StepProgram
    from commsched.workloads.trace import TRACED_RANK, tidy_traced

    why = why_not_split(spec, parts)
    if why is not None:
        raise GraphError(f"split batch: {why}")
    sizes = micro_batch_sizes(spec.batch, parts)
    with fake_process_group(spec.plan.world_size, rank=TRACED_RANK):
        groups = create_groups(spec.plan, TRACED_RANK)
        whole = StepProgram(spec, groups, TRACED_RANK)
        programs = {b: StepProgram(dataclasses.replace(spec, batch=b), groups, TRACED_RANK) for b in set(sizes)}
        with FakeTensorMode():
            inputs = whole.empty_inputs()
            dims = tuple(_batch_dim(x, y) for x, y in zip(inputs, programs[sizes[0]].empty_inputs(), strict=True))
            fn = merged_step([programs[b].step for b in sizes], sizes, dims, _zoo_merge(spec))
            gm = trace_merged(fn, inputs)
        tidy_traced(gm, whole.input_names)
        if interleave:
            from commsched.frontends.fx import from_fx

            gm = interleave_micro_batches(gm, from_fx(gm))
    result = RewriteResult(gm=gm, name="split_batch")
    result.extra["split"] = SplitBatch(sizes, dims)
    for c, b in enumerate(sizes):
        result.rows.append(
            {"micro_batch": c, "sequences": b, "nodes": sum(micro_batch_of(n) == c for n in gm.graph.nodes)}
        )
    result.replaced["step"] = None  # every node of the step is replaced by the micro-batches'
    return result


def _batch_dim(whole: torch.Tensor, part: torch.Tensor) -> int | None:
    """The dim along which ``part`` (a micro-batch's input) is a slice of ``whole``; None when they agree."""
    diff = [d for d, (a, b) in enumerate(zip(whole.shape, part.shape, strict=True)) if a != b]
    if not diff:
        return None
    if len(diff) > 1:
        raise GraphError(f"split batch: an input of shape {tuple(whole.shape)} differs from its micro-batch's "
                         f"{tuple(part.shape)} in more than one dim")  # fmt: skip
    return diff[0]


def traced_spec(gm: torch.fx.GraphModule) -> Any:
    """The ``WorkloadSpec`` the zoo traced ``gm`` from, or None when ``gm`` is not a zoo step or was changed since
    (its node names differ from the traced ones)."""
    from commsched.workloads.trace import WORKLOAD_META

    meta = getattr(gm, "meta", {}).get(WORKLOAD_META)
    if meta is None:
        return None
    spec, names = meta
    return spec if tuple(n.name for n in gm.graph.nodes) == names else None

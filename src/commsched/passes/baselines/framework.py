"""``framework``: the step in the order the user's framework issues it today, eager, with no overlap pass.

This is the reference a user compares against ("what do I gain over what I run now?"), not a scheduler to beat
torch's: it reads the roles of the process groups from the workload's metadata (``Graph.meta``, as the zoo records
it) and moves collectives the way the framework's own streams and events let them run:

* **FSDP2** (``fully_shard``), on the groups that shard parameters (mesh dims ``fsdp`` / ``efsdp``; ``world`` under
  ``fsdp+ep``): its all_gathers run on their own streams and wait only for the previous all_gather's copy-out, so
  each all_gather is issued right before the first compute after the previous one's wait (one unit prefetched: the
  CPU runs ahead in the forward, ``_backward_prefetch`` does it in the backward). Its reduce_scatters keep one in
  flight (``reduce_scatter_max_input_buffers=1``): each is waited right before the next one's input buffer is
  allocated (its copy-in), the last at the end of the step. torch 2.13:
  ``torch/distributed/fsdp/_fully_shard/_fsdp_param_group.py``
  (``get_all_gather_streams``, ``wait_for_unshard``, ``post_backward``).
* **DDP**: the gradient buckets (``Graph.meta["ddp_buckets"]``' group) are all-reduced as each bucket is ready and
  waited once, at the end of the backward (the reducer's finalize).
* **HSDP** (FSDP2 on a (replicate, shard) mesh, mesh dim ``dp_replicate``): each unit's all_reduce of its
  reduce-scattered gradient runs on FSDP2's all_reduce stream and is waited once, at the end of the backward
  (``finalize_backward`` waits the last post-reduce events), as DDP's: its group counts with the DDP groups.
* "The end of the backward" is the end of the step, or where the step's optimizer begins (``Graph.meta["optimizer"]``:
  its first multi-tensor op after the last collective): ``optimizer.step()`` runs after ``backward()`` returns, by
  then FSDP2 / DDP have waited their gradient reductions.
* Everything else (TP / SP collectives, MoE all_to_all, inference steps, graphs without workload metadata) keeps the
  input order: eager DTensor and functional collectives are waited where the program uses them, and torch.compile
  runs no overlap pass by default (``torch._inductor.config.reorder_for_compute_comm_overlap = False``,
  ``aten_distributed_optimizations.enable_overlap_scheduling = False``), so its order is the traced one.

Moving an FSDP all_gather ahead of the previous unit's reduce_scatter changes the order the group issues its
collectives in, as FSDP2's separate all_gather and reduce_scatter streams do; every rank makes the same moves, so the
result declares ``reorders_collectives``. O(N + E).
"""

from __future__ import annotations

import itertools

import numpy as np

from commsched.ir import CollType, Graph, OpKind
from commsched.ir.order import collective_chains, positions
from commsched.passes.baselines.framework_jit import propagate_keys
from commsched.passes.registry import PassContext, PassResult, PassStats, register_pass
from commsched.sim.jit import ENABLED as JIT_ENABLED

FSDP_DIMS = ("fsdp", "efsdp")
"""mesh dimensions whose group shards parameters (``world`` too under ``fsdp+ep``)"""


def framework_roles(g: Graph) -> tuple[set[int], set[int]]:
    """Indices (into ``g.groups``) of the FSDP groups and of the DDP gradient-bucket groups, from ``g.meta``; both
    empty for a graph without workload metadata or a step that is not training."""
    meta = g.meta
    if meta.get("mode", "train") != "train" or "groups" not in meta:
        return set(), set()
    index = {grp.name: k for k, grp in enumerate(g.groups)}
    dims = meta.get("groups", {})
    fsdp_dims = [*FSDP_DIMS, "world"] if meta.get("parallel") == "fsdp+ep" else list(FSDP_DIMS)
    if int(meta.get("fsdp", 1) or 1) <= 1 and not meta.get("expert_fsdp"):
        fsdp_dims = []
    fsdp = {index[dims[d]["name"]] for d in fsdp_dims if d in dims and dims[d]["name"] in index}
    ddp = {index[dims[d]["name"]] for d in meta.get("ddp_buckets", {}) if d in dims and dims[d]["name"] in index}
    if fsdp and "dp_replicate" in dims and dims["dp_replicate"]["name"] in index:  # HSDP's gradient all_reduces
        ddp.add(index[dims["dp_replicate"]["name"]])
    return fsdp, ddp


def framework_label(g: Graph) -> str:
    """What the framework order stands for on ``g``: ``"FSDP2 eager"``, ``"DDP eager"``, ``"FSDP2 + DDP eager"`` or
    ``"torch.compile default (as traced)"``."""
    fsdp, ddp = framework_roles(g)
    if fsdp and int(g.meta.get("dp_replicate", 1) or 1) > 1 and not g.meta.get("ddp_buckets"):
        return "FSDP2 (HSDP) eager"
    parts = [name for name, groups in (("FSDP2", fsdp), ("DDP", ddp)) if groups]
    return " + ".join(parts) + " eager" if parts else "torch.compile default (as traced)"


def _first_compute_after(g: Graph, order: np.ndarray, after: int) -> int:
    """Position in ``order`` of the first COMPUTE node after position ``after`` (len(order) if none)."""
    rest = np.flatnonzero(g.kinds[order[after + 1 :]] == OpKind.COMPUTE)
    return after + 1 + int(rest[0]) if len(rest) else len(order)


def framework_moves(g: Graph, order: np.ndarray) -> tuple[np.ndarray, np.ndarray, int]:
    """The framework's moves as float position keys: ``late`` (a wait held back to this key, else its input position),
    ``early`` (a collective issued by this key, else +inf), and how many collectives moved. See the module
    docstring for the rules."""
    pos = positions(order)
    late, early = pos.astype(np.float64), np.full(len(order), np.inf)
    fsdp, ddp = framework_roles(g)
    moved = 0
    end = backward_end(g, order) - 0.5
    for group, chain in collective_chains(g, order).items():
        types = g.coll_type[chain]
        if group in fsdp:
            gathers = chain[types == CollType.ALL_GATHER]
            for prev, coll in itertools.pairwise(gathers):
                anchor = _first_compute_after(g, order, int(pos[g.waits_of(int(prev))].max())) - 0.5
                if anchor < pos[coll]:
                    early[coll], moved = anchor, moved + 1
            scatters = chain[types == CollType.REDUCE_SCATTER]
            for k, coll in enumerate(scatters):
                until = _copy_in_position(g, pos, scatters[k + 1]) - 0.5 if k + 1 < len(scatters) else end
                waits = g.waits_of(int(coll))
                if len(waits) and until > pos[waits].max():
                    late[waits], moved = until, moved + 1
        if group in ddp:
            for coll in chain[types == CollType.ALL_REDUCE]:
                waits = g.waits_of(int(coll))
                if len(waits):
                    late[waits], moved = end, moved + 1
    return late, early, moved


def _copy_in_position(g: Graph, pos: np.ndarray, coll: int) -> int:
    """Where collective ``coll``'s input buffer is allocated (the earliest owner of a storage it reads, FSDP2's
    reduce-scatter copy-in), or its own position if it reads only persistent storages. FSDP2 waits the previous
    reduce_scatter there, so its input buffer is reused for this one (``post_backward``: the oldest
    ``reduce_scatter_states`` popped before ``foreach_reduce``)."""
    storages = [g.buf_storage[g.buf_ptr[i] : g.buf_ptr[i + 1]] for i in g.inputs(coll)]
    owners = g.storage_owner[np.concatenate(storages)] if storages else np.zeros(0, np.int64)
    owners = owners[g.kinds[owners] != OpKind.INPUT]
    return int(min(pos[coll], pos[owners].min())) if len(owners) else int(pos[coll])


def backward_end(g: Graph, order: np.ndarray) -> int:
    """Position in ``order`` where the backward ends: that of the optimizer's first op (a multi-tensor op after the
    last collective, when ``g.meta`` says the step has an optimizer), else ``len(order)``."""
    from commsched.cost.multi_tensor import is_multi_tensor

    n = len(order)
    if g.meta.get("optimizer", "none") in (None, "none"):
        return n
    is_coll = g.coll_type[order] >= 0
    after = int(np.flatnonzero(is_coll)[-1]) + 1 if is_coll.any() else 0
    targets = g.targets
    return next((p for p in range(after, n) if is_multi_tensor(targets[int(order[p])])), n)


def order_by_moves(g: Graph, late: np.ndarray, early: np.ndarray, pos: np.ndarray) -> np.ndarray:
    """A topological order that follows the moves as closely as edges allow: held-back waits push their descendants
    later (keys raised along edges, forward), then early collectives pull their ancestors earlier (lowered,
    backward); ties keep the input position. O(N + E) plus one sort."""
    key = late.copy()
    # compiled (a Python loop over the nodes was a quarter of plan's judge); its Python source with the loops off
    loop = propagate_keys if JIT_ENABLED else getattr(propagate_keys, "py_func", propagate_keys)
    loop(key, np.asarray(early, np.float64), np.argsort(pos), *g.predecessors_csr(), *g.successors_csr())
    return np.lexsort((pos, key)).astype(np.int32)


@register_pass("framework")
def framework(g: Graph, order: np.ndarray, ctx: PassContext) -> PassResult:
    """The input order as the user's framework runs it eagerly (FSDP2's one-unit prefetch, DDP's bucket overlap;
    the input order for anything else). A reference to compare against, not an optimiser. O(N + E)."""
    late, early, moved = framework_moves(g, order)
    new = order_by_moves(g, late, early, positions(order)) if moved else np.asarray(order, np.int32)
    stats = PassStats("framework", notes=[f"{moved} collective(s) moved as {framework_label(g)} issues them"])
    return PassResult(new, stats, reorders_collectives=bool(moved))

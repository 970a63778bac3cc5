"""A step's sequences in chunks as a :func:`commsched.optimize` candidate (issue 18): the zoo step retraced with its
sequences in 2, then 4 chunks (:mod:`commsched.rewrites.split_sequence`), judged by the core like a split batch (in
two program orders, each pruned by its lower bound or fully scheduled).

Where it applies: a zoo step as traced, a prefill or a training step with TP or EP. A step whose other bound terms
already reach the best variant is not split (:func:`unmoved_bound_s`: the split repeats only the TP / EP groups'
collectives per chunk).
"""

from __future__ import annotations

from typing import Any

from commsched.optimize.protocol import Judge, State, Tried

name = "split sequence"
transform = True
SEQUENCE_CHUNKS = (2, 4)
"""the chunk counts a step's sequences are tried in, in order, more only while fewer won (the simulator picks)"""


def variants(state: State, judge: Judge) -> list:
    """The step's sequences as 2, then 4, ... chunks (:data:`SEQUENCE_CHUNKS`), more only while fewer won; none
    where :func:`unmoved_bound_s` shows that no split can beat the best variant so far. Empty for a module the zoo
    did not trace."""
    from commsched.rewrites.split_batch import traced_spec
    from commsched.rewrites.split_sequence import split_zoo_sequence, why_not_split_sequence

    spec = traced_spec(state.gm)
    if spec is None:
        return []
    why = why_not_split_sequence(spec)
    best = state.fastest()
    traced = next((v for v in state.variants if not isinstance(v, Tried)), None)
    if why is None and best is not None and traced is not None:
        floor_s = unmoved_bound_s(traced.sim.bound, moved_groups(spec))
        if floor_s >= best.sim.makespan_s:
            why = (f"pruned: it moves only the TP / EP groups' collectives, and the traced program's other bound "
                   f"terms (compute, other groups) are {floor_s * 1e3:.3f} ms, no faster than the best variant's "
                   f"{best.sim.makespan_s * 1e3:.3f} ms")  # fmt: skip
    if why is not None or not SEQUENCE_CHUNKS:
        verdict = why if (why or "").startswith("pruned") else f"not applied: {why or 'no chunk count to try'}"
        return [Tried(name, None, verdict=verdict)]
    out: list = []
    for j, k in enumerate(SEQUENCE_CHUNKS):
        label = f"{name} ({k} chunks of {spec.seq_len // k} positions"
        why = why_not_split_sequence(spec, k)
        if why is not None:
            out.append(Tried(label + ")", None, verdict=f"not applied: {why}"))
            continue
        before = state.fastest(state.variants + out)
        out += judge.retraced(label, "layer by layer", lambda k=k: split_zoo_sequence(spec, k).gm,
                              state.variants + out)  # fmt: skip
        after = state.fastest(state.variants + out)
        if before is not None and (after is None or after.sim.makespan_ns >= before.sim.makespan_ns):
            # more chunks: more launches and latency
            out += [Tried(f"{name} ({m} chunks)", None, verdict=f"not tried: {k} chunks did not win")
                    for m in SEQUENCE_CHUNKS[j + 1 :]]  # fmt: skip
            break
    return out


def moved_groups(spec: Any) -> set[str]:
    """The names of the zoo step ``spec``'s TP and EP process groups, as its trace names them."""
    from commsched.frontends.fake_pg import fake_process_group
    from commsched.workloads.mesh import create_groups
    from commsched.workloads.trace import TRACED_RANK

    with fake_process_group(spec.plan.world_size, rank=TRACED_RANK):
        groups = create_groups(spec.plan, TRACED_RANK)
        return {groups[dim].group_name for dim in ("tp", "ep") if dim in groups}


def unmoved_bound_s(bound: Any, moved: set[str]) -> float:
    """What a split of a step's sequences leaves in place, from the traced program's ``bound`` (a
    :class:`commsched.sim.bounds.LowerBound`): its compute stream's work and the terms of every group but
    ``moved`` (the TP and EP groups, whose collectives the split repeats per chunk). A heuristic that prunes, never
    one that keeps: a split's compute can be a little less in the cost model (a chunk's causal attention fills
    fewer waves: llama3-8b TP+SP prefill, 1.337 -> 1.322 ms), and on llama3-70b FSDP+TP at 512 ranks the split
    dropped one FSDP re-gather (its own bound 142.0 ms, this one 148.3 ms; both above the best variant's step)."""
    terms = [bound.compute_s]
    for per_group in (bound.comm_s, bound.comm_heads_tails_s or {}, bound.exposed_comm_s or {}):
        terms += [v for name, v in per_group.items() if name not in moved]
    return max(terms)

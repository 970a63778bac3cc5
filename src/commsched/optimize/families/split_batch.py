"""Two micro-batches as a :func:`commsched.optimize` candidate (issue 18): the zoo step retraced as two micro-batches
(:mod:`commsched.rewrites.split_batch`), costed by the same model and judged by the core in two program orders (the
micro-batches interleaved node by node, and one after the other), each pruned by its lower bound or fully scheduled
within the same memory budget as every other variant.

Where it applies: a module the zoo traced and nobody changed since, with a batch of at least 2 sequences. Elsewhere
the report says why it was not tried. Its label gives the simulator's lower bound of the split program next to the
traced program's (the bound is what a split can move and reordering cannot).
"""

from __future__ import annotations

from commsched.optimize.protocol import Judge, State, Tried

name = "split batch"
transform = True


def variants(state: State, judge: Judge) -> list:
    """The step as two micro-batches, or a ``Tried`` saying why it was not tried or failed."""
    from commsched.rewrites.split_batch import micro_batch_sizes, split_zoo_step, traced_spec, why_not_split

    spec = traced_spec(state.gm)
    if spec is None:
        why = "not a zoo step as traced (a split retraces the step; other modules: not built)"
        return [Tried(name, None, verdict=f"not applied: {why}")]
    why = why_not_split(spec)
    if why is not None:
        return [Tried(name, None, verdict=f"not applied: {why}")]
    label = f"{name} ({' + '.join(map(str, micro_batch_sizes(spec.batch)))} sequences"
    return judge.retraced(label, "one after the other", lambda: split_zoo_step(spec, interleave=False).gm,
                          state.variants)  # fmt: skip

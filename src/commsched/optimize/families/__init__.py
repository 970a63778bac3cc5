"""The registry of :func:`commsched.optimize`'s variant families, in the order the search runs them.

A family is a module with ``name``, ``transform`` and ``variants(state, judge)``
(:class:`commsched.optimize.protocol.Family`); it imports :mod:`commsched.optimize.protocol` and the layers below
``optimize``, never another family or the core. A later family sees every earlier one's variants (``state.variants``),
so the order matters: the bucketed variants come first because the others build on the fastest of them; the AC
policy comes last (its plans retrace the step, and it buckets its fastest like the best bucketed variant).
"""

from commsched.optimize.families import (
    ac_policy,
    bucketing,
    decomposed_tp,
    kept_gathers,
    split_batch,
    split_bucketed,
    split_sequence,
)

FAMILIES = {
    f.name: f for f in (bucketing, decomposed_tp, split_batch, split_sequence, split_bucketed, kept_gathers, ac_policy)
}
"""name -> family module, in search order"""

__all__ = ["FAMILIES"]

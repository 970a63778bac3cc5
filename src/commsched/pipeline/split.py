"""Which layers each pipeline stage holds: torchtitan's split of a decoder over P x V stages.

torchtitan (``torchtitan/distributed/pipeline_parallel.py``, ``_generate_llm_fqn_per_model_part``, at
pytorch/torchtitan@b5bcd76c66d0acb1a08b176d9639425bc55e0b2a) counts the embedding as ``input_weight`` layers and the
final norm + output projection as ``output_weight`` layers (its defaults ``pipeline_parallel_first_stage_less_layers``
= ``pipeline_parallel_last_stage_less_layers`` = 1), deals the effective layers out evenly, the first
``effective % stages`` stages one more, and puts the embedding in the first stage and the norm, output projection
(and so the loss) in the last. :func:`stage_fqns` is that rule, with its errors; its stages
as :class:`Stage` s with the zoo's units (:func:`stages_of`).
"""

from __future__ import annotations

import dataclasses

EMBED_FQN, NORM_FQN, OUTPUT_FQN = "tok_embeddings", "norm", "lm_head"
"""torchtitan's module names of the embedding, the final norm and the output projection (``lm_head``)"""


@dataclasses.dataclass(frozen=True)
class Stage:
    """One pipeline stage: whether it holds the embedding (first) and the norm + output + loss (last), and its
    transformer layers (indices into the model's)."""

    index: int
    first: bool
    last: bool
    layers: tuple[int, ...]

    @property
    def shape(self) -> tuple[bool, int, bool]:
        """What its programs depend on: (first, how many layers, last); equal layers trace the same program."""
        return (self.first, len(self.layers), self.last)

    @property
    def units(self) -> tuple[str, ...]:
        """Its zoo FSDP units (``commsched.workloads.params``: embed, layers.<i>, final), in forward order."""
        return (("embed",) if self.first else ()) + tuple(f"layers.{i}" for i in self.layers) + (
            ("final",) if self.last else ())  # fmt: skip


def stage_fqns(num_stages: int, num_layers: int, input_weight: int = 1, output_weight: int = 1) -> list[list[str]]:
    """torchtitan's module names per stage (``_generate_llm_fqn_per_model_part``, see the module docstring), or a
    one-line ValueError naming the numbers that do not split."""
    if num_stages < 1 or num_layers < 1:
        raise ValueError(f"pp stages={num_stages}, layers={num_layers}: expected both >= 1")
    if num_stages == 1:
        return [[EMBED_FQN, *(f"layers.{i}" for i in range(num_layers)), NORM_FQN, OUTPUT_FQN]]
    effective = num_layers + input_weight + output_weight
    per_stage, extra = divmod(effective, num_stages)
    if per_stage == 0:
        raise ValueError(f"layers={num_layers}: {num_stages} pipeline stages (pp_size x stages_per_rank) need at least "
                         f"{num_stages} effective layers; {num_layers} layers + {input_weight} (embedding) + "
                         f"{output_weight} (norm + output) = {effective} (torchtitan's split)")  # fmt: skip
    if max(input_weight, output_weight) > per_stage:
        raise ValueError(f"layers={num_layers}: {num_stages} pipeline stages get {per_stage} effective layers each, "
                         f"fewer than the embedding's {input_weight} or the output's {output_weight} "
                         "(torchtitan's split); use fewer stages or more layers")  # fmt: skip
    out, layer = [], 0
    for s in range(num_stages):
        count = per_stage + (s < extra)
        names = [EMBED_FQN] if s == 0 else []
        count -= input_weight if s == 0 else output_weight if s == num_stages - 1 else 0
        take = min(count, num_layers - layer)
        names += [f"layers.{i}" for i in range(layer, layer + take)]
        layer += take
        if s == num_stages - 1:
            names += [NORM_FQN, OUTPUT_FQN]
        out.append(names)
    return out


def stages_of(num_stages: int, num_layers: int) -> list[Stage]:
    """The stages of torchtitan's split (:func:`stage_fqns` with its default weights) as :class:`Stage` s."""
    out = []
    for s, names in enumerate(stage_fqns(num_stages, num_layers)):
        layers = tuple(int(n.split(".")[1]) for n in names if n.startswith("layers."))
        out.append(Stage(index=s, first=EMBED_FQN in names, last=OUTPUT_FQN in names, layers=layers))
    return out

"""A zoo decoder's pipeline stage as an ``nn.Module``, for ``torch.distributed.pipelining.PipelineStage``."""

from __future__ import annotations

import torch
import torch.nn.functional as F

from commsched.pipeline.split import Stage
from commsched.workloads import model
from commsched.workloads.collectives import Comm
from commsched.workloads.program import WorkloadSpec


class ZooStage(torch.nn.Module):
    """One pipeline stage of a zoo decoder as an ``nn.Module``: the embedding (first stage), its blocks, and the
    final norm and output projection (last stage: float32 logits ``[tokens, vocab]``; :func:`stage_loss` is the
    schedule's loss). Hidden states travel as ``[tokens, dim]``, the zoo's layout. Parameters start as
    ``full_params`` (``init_full_params``), in the master dtype; RoPE tables are buffers, as torchtitan's
    ``freqs_cis`` is."""

    def __init__(self, spec: WorkloadSpec, stage: Stage, full_params: dict[str, torch.Tensor], microbatch: int):
        super().__init__()
        cfg = spec.model
        self.spec, self.stage = spec, stage
        layout = [p for p in spec.layout if p.unit in set(stage.units)]
        self.names = [p.name for p in layout]
        self.weights = torch.nn.ParameterList(
            [torch.nn.Parameter(full_params[p.name].detach().clone().to(spec.master_dtype)) for p in layout]
        )
        self.units: dict[str, list[tuple[str, int]]] = {}
        for i, p in enumerate(layout):
            self.units.setdefault(p.unit, []).append((p.key, i))
        cos, sin = model.rope_tables(cfg, torch.arange(spec.seq_len), spec.dtype)
        self.register_buffer("rope_cos", cos, persistent=False)
        self.register_buffer("rope_sin", sin, persistent=False)
        self.shapes = model.Shapes(batch=microbatch, seq=spec.seq_len, heads=cfg.n_heads, kv_heads=cfg.n_kv_heads,
                                   attention=spec.attention)  # fmt: skip
        self.comm = Comm()

    def _unit(self, unit: str) -> dict[str, torch.Tensor]:
        return {key: self.weights[i].to(self.spec.dtype) for key, i in self.units[unit]}

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        cfg, s, rope = self.spec.model, self.shapes, (self.rope_cos, self.rope_sin)
        h = model.embed(self._unit("embed"), x, s, self.comm) if self.stage.first else x
        for i in self.stage.layers:
            h = model.block(self._unit(f"layers.{i}"), h, cfg, s, self.comm, rope, None)
        if not self.stage.last:
            return h
        final = self._unit("final")
        return F.linear(model.rms_norm(h, final["norm"], cfg.norm_eps), final["output"]).float()

    def input_example(self) -> torch.Tensor:
        """A micro-batch input of the right shape: token ids (first stage) or a hidden state."""
        s, cfg = self.shapes, self.spec.model
        if self.stage.first:
            return torch.randint(0, cfg.vocab_size, (s.batch, s.seq))
        return torch.randn(s.tokens, cfg.dim, dtype=self.spec.dtype, requires_grad=True)


def stage_loss(logits: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    """The mean cross-entropy of one micro-batch (the zoo's ``head_loss`` after its logits)."""
    return F.cross_entropy(logits, labels.reshape(-1))


class EmptyStage(torch.nn.Module):
    """A stage that receives and sends what ``stage`` does but computes next to nothing (one scalar product): a
    schedule of these times torch's runtime itself (its Python per action, the P2P posts and waits). The first
    stage turns the token ids into a zero hidden state; :func:`empty_loss` ends the last."""

    def __init__(self, spec: WorkloadSpec, stage: Stage, microbatch: int) -> None:
        super().__init__()
        self.spec, self.stage = spec, stage
        self.hidden = (microbatch * spec.seq_len, spec.model.dim)
        self.scale = torch.nn.Parameter(torch.ones((), dtype=spec.dtype))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if self.stage.first:
            x = torch.zeros(self.hidden, dtype=self.spec.dtype)
        return x * self.scale


def empty_loss(out: torch.Tensor, labels: torch.Tensor) -> torch.Tensor:
    return out.mean()

"""A module tree with torchtitan's Llama names, shared by the plan tests that build its Python snippet."""

from __future__ import annotations

from typing import Any


def tiny_torchtitan_llama(dim: int = 16, layers: int = 4, vocab: int = 32) -> Any:
    """A module tree with torchtitan's Llama names (what the snippet's TP plan and split address); never run."""
    from torch import nn

    def linears(*names: str, shape: tuple[int, int] = (dim, dim)) -> nn.Module:
        module = nn.Module()
        for name in names:
            module.register_module(name, nn.Linear(*shape, bias=False))
        return module

    def block() -> nn.Module:
        b = nn.Module()
        b.attention_norm, b.ffn_norm = nn.RMSNorm(dim), nn.RMSNorm(dim)
        b.attention = linears("wq", "wk", "wv", "wo")
        b.feed_forward = linears("w1", "w2", "w3")
        return b

    model = nn.Module()
    model.tok_embeddings, model.norm = nn.Embedding(vocab, dim), nn.RMSNorm(dim)
    model.layers = nn.ModuleDict({str(i): block() for i in range(layers)})
    model.lm_head = nn.Linear(dim, vocab, bias=False)
    return model

"""Model presets: public dimensions of the Llama 2, Llama 3 and Mixtral families, plus tiny models for tests and real
runs.

Sources for the public presets: the models' ``config.json`` on the Hugging Face hub (meta-llama/Meta-Llama-3-8B,
Meta-Llama-3-70B, Llama-3.1-405B; meta-llama/Llama-2-7b-hf, Llama-2-13b-hf, Llama-2-70b-hf;
mistralai/Mixtral-8x7B-v0.1), the Llama 3 paper (arXiv:2407.21783, table 3) and the Llama 2 paper (arXiv:2307.09288,
table 1: 4k context, grouped-query attention in 70B only). The Llama 2 sizes are also torchtitan's 2024
``llama2_configs`` (7B: dim 4096, 32 layers, 32 heads; 13B: 5120, 40, 40; 70B: 8192, 80, 64 heads, 8 KV heads,
ffn_dim_multiplier 1.3, multiple_of 4096), whose SwiGLU hidden sizes are 11008 / 13824 / 28672 (``multiple_of``
rounding of 8 x dim / 3), with torchtitan's default RoPE theta 10000 and the 32000-token SentencePiece vocabulary.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True, slots=True)
class ModelConfig:
    """A Llama-style decoder (RMSNorm, RoPE, grouped-query attention, SwiGLU); ``n_experts > 0`` makes every
    feed-forward a Mixtral-style top-k mixture of SwiGLU experts."""

    name: str
    dim: int
    n_layers: int
    n_heads: int
    n_kv_heads: int
    ffn_dim: int  # hidden size of one SwiGLU MLP (of one expert for MoE)
    vocab_size: int
    norm_eps: float = 1e-5
    rope_theta: float = 500000.0
    n_experts: int = 0  # 0: dense feed-forward
    top_k: int = 2  # experts per token (MoE only)
    seq_len: int = 8192  # default sequence length of a training step
    description: str = ""

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    @property
    def is_moe(self) -> bool:
        return self.n_experts > 0

    def validate(self) -> ModelConfig:
        for field in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size"):
            if getattr(self, field) < 1:
                raise ValueError(f"model {self.name!r}: {field}={getattr(self, field)} must be >= 1")
        if self.dim % self.n_heads:
            raise ValueError(f"model {self.name!r}: dim={self.dim} is not divisible by n_heads={self.n_heads}")
        if self.n_heads % self.n_kv_heads:
            raise ValueError(
                f"model {self.name!r}: n_heads={self.n_heads} is not a multiple of n_kv_heads={self.n_kv_heads}"
            )
        if self.head_dim % 2:
            raise ValueError(f"model {self.name!r}: head_dim={self.head_dim} must be even for RoPE")
        if self.is_moe and not 1 <= self.top_k <= self.n_experts:
            raise ValueError(f"model {self.name!r}: top_k={self.top_k} must be in 1..n_experts={self.n_experts}")
        return self

    # ------------------------------------------------------------------ parameter counts (unsharded, unpadded)
    def block_params(self) -> int:
        """Parameters of one transformer block (all experts for MoE)."""
        hd = self.head_dim
        attn = self.dim * self.n_heads * hd * 2 + self.dim * self.n_kv_heads * hd * 2
        mlp = 3 * self.dim * self.ffn_dim
        if self.is_moe:
            mlp = self.n_experts * mlp + self.n_experts * self.dim  # experts + router
        return attn + mlp + 2 * self.dim  # + two RMSNorm weights

    def block_active_params(self) -> int:
        """Parameters one token touches in one block (top_k experts for MoE)."""
        if not self.is_moe:
            return self.block_params()
        return self.block_params() - (self.n_experts - self.top_k) * 3 * self.dim * self.ffn_dim

    def model_flops_per_token(self, seq_len: int) -> float:
        """torchtitan's training FLOPs per token: 6 x the non-embedding parameters one token uses (the output
        projection included) + 12 x layers x heads x head_dim x sequence (attention, causality not discounted)."""
        dense = self.n_layers * self.block_active_params() + self.vocab_size * self.dim + self.dim
        return 6.0 * dense + 12.0 * self.n_layers * self.n_heads * self.head_dim * seq_len

    def total_params(self, n_layers: int | None = None) -> int:
        layers = self.n_layers if n_layers is None else n_layers
        return layers * self.block_params() + 2 * self.vocab_size * self.dim + self.dim


def _llama3(name: str, description: str, **dims: int) -> ModelConfig:
    """A Llama 3 size: every one has 8 KV heads and the same 128256-token vocabulary."""
    return ModelConfig(name=name, n_kv_heads=8, vocab_size=128256, description=description, **dims)


def _llama2(name: str, description: str, **dims: int) -> ModelConfig:
    """A Llama 2 size: the 32000-token vocabulary, RoPE theta 10000 and 4096-token sequences."""
    return ModelConfig(name=name, vocab_size=32000, rope_theta=10000.0, seq_len=4096, description=description, **dims)


_TINY_DIMS = {"dim": 256, "n_layers": 2, "n_heads": 16, "n_kv_heads": 8, "vocab_size": 1024, "seq_len": 64}


def _tiny(name: str, description: str, **dims: int) -> ModelConfig:
    """A 2-layer model small enough for tests and real runs on CPU."""
    return ModelConfig(name=name, description=description, **_TINY_DIMS, **dims)


_MODELS = (
    _llama3("llama3-8b", "Llama 3 8B (Meta, 2024)", dim=4096, n_layers=32, n_heads=32, ffn_dim=14336),
    _llama3("llama3-70b", "Llama 3 70B (Meta, 2024)", dim=8192, n_layers=80, n_heads=64, ffn_dim=28672),
    _llama3("llama3-405b", "Llama 3.1 405B (Meta, 2024)", dim=16384, n_layers=126, n_heads=128, ffn_dim=53248),
    _llama2("llama2-7b", "Llama 2 7B (Meta, 2023)", dim=4096, n_layers=32, n_heads=32, n_kv_heads=32, ffn_dim=11008),
    _llama2("llama2-13b", "Llama 2 13B (Meta, 2023)", dim=5120, n_layers=40, n_heads=40, n_kv_heads=40, ffn_dim=13824),
    _llama2("llama2-70b", "Llama 2 70B (Meta, 2023)", dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672),
    ModelConfig(
        name="mixtral-8x7b",
        dim=4096,
        n_layers=32,
        n_heads=32,
        n_kv_heads=8,
        ffn_dim=14336,
        vocab_size=32000,
        rope_theta=1e6,
        n_experts=8,
        top_k=2,
        seq_len=4096,
        description="Mixtral 8x7B (Mistral AI, 2023): 8 experts, top-2",
    ),
    _tiny("llama-tiny", "a 2-layer Llama for tests and real runs on CPU", ffn_dim=512),
    _tiny(
        "mixtral-tiny",
        "a 2-layer Mixtral-style MoE (8 experts, top-2) for tests and real runs on CPU",
        ffn_dim=256,
        n_experts=8,
        top_k=2,
    ),
)
PRESETS: dict[str, ModelConfig] = {c.name: c for c in _MODELS}


def get_preset(name: str) -> ModelConfig:
    try:
        return PRESETS[name]
    except KeyError:
        raise ValueError(f"unknown preset {name!r}: expected one of {', '.join(PRESETS)}") from None

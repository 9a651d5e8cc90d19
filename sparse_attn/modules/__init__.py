"""NNX attention modules. Each mechanism: a frozen config with `make(model_dim, num_heads, *, rngs)`."""

from sparse_attn.modules.base import AttentionConfig, AttentionContext, AttentionOutput, Projections
from sparse_attn.modules.pattern_attention import (
    BigBirdAttention,
    DenseAttention,
    LocalAttention,
    LongformerAttention,
    PatternAttention,
)

__all__ = [
    "AttentionConfig",
    "AttentionContext",
    "AttentionOutput",
    "BigBirdAttention",
    "DenseAttention",
    "LocalAttention",
    "LongformerAttention",
    "PatternAttention",
    "Projections",
]

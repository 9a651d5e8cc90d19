"""NNX attention modules. Each mechanism: a frozen config with `make(model_dim, num_heads, *, rngs)`."""

from sparse_attn.modules.abca import (
    AnchorAttention,
    AnchorAttentionConfig,
    ExplicitAnchors,
    FixedAnchors,
    LearnedAnchors,
)
from sparse_attn.modules.base import AttentionConfig, AttentionContext, AttentionOutput, Projections
from sparse_attn.modules.labels import (
    LabelAttention,
    LabelAttentionConfig,
    LabelCapacity,
    LabelRouterConfig,
    LabelSchedule,
)
from sparse_attn.modules.moba import MobaAttention, MobaAttentionConfig
from sparse_attn.modules.noncrossing import NoncrossingAttention, NoncrossingAttentionConfig
from sparse_attn.modules.nsa import NsaAttention, NsaAttentionConfig
from sparse_attn.modules.pattern_attention import (
    BigBirdAttention,
    DenseAttention,
    LocalAttention,
    LongformerAttention,
    PatternAttention,
)

__all__ = [
    "AnchorAttention",
    "AnchorAttentionConfig",
    "AttentionConfig",
    "AttentionContext",
    "AttentionOutput",
    "BigBirdAttention",
    "DenseAttention",
    "ExplicitAnchors",
    "FixedAnchors",
    "LabelAttention",
    "LabelAttentionConfig",
    "LabelCapacity",
    "LabelRouterConfig",
    "LabelSchedule",
    "LearnedAnchors",
    "LocalAttention",
    "LongformerAttention",
    "MobaAttention",
    "MobaAttentionConfig",
    "NsaAttention",
    "NsaAttentionConfig",
    "PatternAttention",
    "Projections",
    "NoncrossingAttention",
    "NoncrossingAttentionConfig",
]

"""ABCA attention: the NNX module, its config, and the attention core it runs."""

from sparse_attn.executors.abca.anchors import AnchorProjections
from sparse_attn.modules.abca.config import AnchorAttentionConfig, ExplicitAnchors, FixedAnchors, LearnedAnchors
from sparse_attn.modules.abca.core import abca_core
from sparse_attn.modules.abca.module import AnchorAttention

__all__ = [
    "AnchorAttention",
    "AnchorAttentionConfig",
    "AnchorProjections",
    "ExplicitAnchors",
    "FixedAnchors",
    "LearnedAnchors",
    "abca_core",
]

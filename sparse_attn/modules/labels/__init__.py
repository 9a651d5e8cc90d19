"""Label-intersection attention (seed 001): routing head, soft / straight-through / hard phases, NNX module."""

from sparse_attn.modules.labels.attention import LabelAttention, label_core
from sparse_attn.modules.labels.config import LabelAttentionConfig
from sparse_attn.modules.labels.router import LabelRouter
from sparse_attn.executors.labels.soft import soft_label_attention

__all__ = ["LabelAttention", "LabelAttentionConfig", "LabelRouter", "label_core", "soft_label_attention"]

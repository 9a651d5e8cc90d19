"""Label-intersection attention (docs/labels.md): config, NNX layer, core, statistics, routing head."""

from sparse_attn.executors.labels.soft import soft_label_attention
from sparse_attn.modules.labels.calibrate import calibrate_reach
from sparse_attn.modules.labels.config import LabelAttentionConfig, LabelCapacity, LabelRouterConfig, LabelSchedule
from sparse_attn.modules.labels.core import label_core
from sparse_attn.modules.labels.module import DEFAULT_NUM_STEPS, LabelAttention
from sparse_attn.modules.labels.router import LabelRouter
from sparse_attn.modules.labels.stats import label_stats
from sparse_attn.patterns.labels.schedule import INFERENCE_STEP

__all__ = [
    "DEFAULT_NUM_STEPS",
    "INFERENCE_STEP",
    "LabelAttention",
    "LabelAttentionConfig",
    "LabelCapacity",
    "LabelRouter",
    "LabelRouterConfig",
    "LabelSchedule",
    "calibrate_reach",
    "label_core",
    "label_stats",
    "soft_label_attention",
]

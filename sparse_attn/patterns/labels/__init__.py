"""Label-intersection patterns (docs/labels.md): base graph, bitmasks, soft score, buckets."""

from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.bits import check_labels, pack_labels, pack_memberships, top_k_labels
from sparse_attn.patterns.labels.buckets import BucketLayout, bucket_layout, bucket_sizes
from sparse_attn.patterns.labels.pattern import LabelPattern
from sparse_attn.patterns.labels.soft import log_q, memberships, sigmoid

__all__ = [
    "BaseGraph",
    "BucketLayout",
    "LabelPattern",
    "bucket_layout",
    "bucket_sizes",
    "check_labels",
    "log_q",
    "memberships",
    "pack_labels",
    "pack_memberships",
    "sigmoid",
    "top_k_labels",
]

"""Executors: (q, k, v, pattern, *, scale, **options) -> (out, lse), registered by (pattern type, name) in
`registry`. `reference` is the oracle for every pattern type, `xla` runs everywhere; `abca` (ABCA's `ZonePattern`)
and `labels` (the `LabelPattern`) register their mechanism executors on import.
"""

from sparse_attn.executors import abca  # noqa: F401  (registers ZonePattern's executors)
from sparse_attn.executors import labels  # noqa: F401  (registers LabelPattern's executors)
from sparse_attn.executors.reference import reference_attention
from sparse_attn.executors.xla import xla_attention

__all__ = ["reference_attention", "xla_attention"]

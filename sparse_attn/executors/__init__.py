"""Executors: (q, k, v, pattern) -> (out, lse). `reference` is the oracle, `xla` runs everywhere."""

from sparse_attn.executors.reference import reference_attention
from sparse_attn.executors.xla import xla_attention

__all__ = ["reference_attention", "xla_attention"]

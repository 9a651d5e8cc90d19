"""Sparsity patterns: pure, jit-able builders of O(n) metadata, each with a dense oracle."""

from sparse_attn.patterns.baselines import bigbird, causal, dense, document_mask, longformer, sliding_window
from sparse_attn.patterns.block_layout import BlockLayout
from sparse_attn.patterns.intervals import Intervals
from sparse_attn.patterns.mask_pattern import MaskFnPattern, from_mask_fn
from sparse_attn.patterns.neighbours import NeighbourList
from sparse_attn.patterns.stats import pattern_stats

Pattern = Intervals | BlockLayout | NeighbourList | MaskFnPattern

__all__ = [
    "BlockLayout",
    "Intervals",
    "MaskFnPattern",
    "NeighbourList",
    "Pattern",
    "bigbird",
    "causal",
    "dense",
    "document_mask",
    "from_mask_fn",
    "longformer",
    "pattern_stats",
    "sliding_window",
]

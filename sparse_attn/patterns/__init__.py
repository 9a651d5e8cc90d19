"""Sparsity patterns: pure, jit-able builders of O(n) metadata, each with a dense oracle."""

from sparse_attn.patterns.baselines import bigbird, causal, dense, document_mask, longformer, sliding_window
from sparse_attn.patterns.block_layout import BlockLayout
from sparse_attn.patterns.intervals import Intervals
from sparse_attn.patterns.neighbours import NeighbourList
from sparse_attn.patterns.stats import pattern_stats

Pattern = Intervals | BlockLayout | NeighbourList

__all__ = [
    "BlockLayout",
    "Intervals",
    "NeighbourList",
    "Pattern",
    "bigbird",
    "causal",
    "dense",
    "document_mask",
    "longformer",
    "pattern_stats",
    "sliding_window",
]

"""Diagnostics of what a mechanism does with the pairs a task needs (issue 37): `retrieval.py`."""

from sparse_attn.diagnostics.retrieval import pair_attention_mass, pattern_recall

__all__ = ["pair_attention_mass", "pattern_recall"]

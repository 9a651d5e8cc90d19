"""Diagnostics of what a mechanism does with the pairs a task needs (issue 37): `retrieval.py` (any pattern),
`probe.py` (per layer and head of a trained model)."""

from sparse_attn.diagnostics.probe import layer_inputs, register_probe, retrieval_probe
from sparse_attn.diagnostics.retrieval import pair_attention_mass, pattern_recall

__all__ = ["layer_inputs", "pair_attention_mass", "pattern_recall", "register_probe", "retrieval_probe"]

"""Diagnostics of what a mechanism does with the pairs a task needs: `retrieval.py` (any pattern),
`abca.py` (ABCA's information path, hop by hop), `labels.py` (the label router: usage, balance, what
its filter keeps, its gradients), `probe.py` (per layer and head of a trained model, and the
whole model's rollout)."""

from sparse_attn.diagnostics.abca import abca_hops, abca_maps, layer_flow
from sparse_attn.diagnostics.labels import kept_of_base, label_layer_probe, label_usage, router_gradient_norms
from sparse_attn.diagnostics.probe import attention_rollout, layer_inputs, probe_for, retrieval_probe
from sparse_attn.diagnostics.retrieval import pair_attention_mass, pattern_recall

__all__ = ["abca_hops", "abca_maps", "attention_rollout", "kept_of_base", "label_layer_probe", "label_usage",
           "layer_flow", "layer_inputs", "pair_attention_mass", "pattern_recall", "probe_for", "retrieval_probe",
           "router_gradient_norms"]

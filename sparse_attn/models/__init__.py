"""Models whose attention is chosen per layer from config."""

from sparse_attn.models.transformer import ModelOutput, TransformerClassifier, TransformerConfig, TransformerLM

__all__ = ["ModelOutput", "TransformerClassifier", "TransformerConfig", "TransformerLM"]

"""Incremental decoding: per-mechanism KV caches and the model driver (docs/generation.md)."""

from sparse_attn.decode.registry import DecodeContext, decoder_for, register_decoder, registered_types

__all__ = ["DecodeContext", "decoder_for", "register_decoder", "registered_types"]

"""Incremental decoding: per-mechanism KV caches and the model driver (docs/generation.md).

Importing the package registers the decoders of the baselines (dense, local, Longformer, BigBird), of label
attention, of ABCA (`abca.py`) and of the block-selection baselines (`moba.py`, `nsa.py`); `LMDecoder` runs a
`TransformerLM` one token at a time.
"""

from sparse_attn.decode import abca, baselines, labels, moba, nsa  # noqa: F401 — register their decoders
from sparse_attn.decode.attend import cache_bytes
from sparse_attn.decode.model import LMDecoder, decode_token, init_caches, phase_warnings
from sparse_attn.decode.registry import DecodeContext, decoder_for, register_decoder, registered_types
from sparse_attn.decode.sampling import sample

__all__ = [
    "DecodeContext",
    "LMDecoder",
    "cache_bytes",
    "decode_token",
    "decoder_for",
    "init_caches",
    "phase_warnings",
    "register_decoder",
    "registered_types",
    "sample",
]

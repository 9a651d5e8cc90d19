"""Incremental decoding: per-mechanism KV caches and the model driver (docs/generation.md).

One file per mechanism's decoder (`baselines.py` for the fixed patterns, `abca.py`, `labels.py`, `moba.py`,
`nsa.py`), each named by its mechanism's record (`sparse_attn/mechanisms/`); `LMDecoder` runs a `TransformerLM` one
token at a time.
"""

from sparse_attn.decode.attend import cache_bytes
from sparse_attn.decode.model import LMDecoder, decode_token, init_caches, phase_warnings
from sparse_attn.decode.registry import DecodeContext, decoder_for
from sparse_attn.decode.sampling import sample

__all__ = [
    "DecodeContext",
    "LMDecoder",
    "cache_bytes",
    "decode_token",
    "decoder_for",
    "init_caches",
    "phase_warnings",
    "sample",
]

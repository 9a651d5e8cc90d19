"""Byte-level corpora and deterministic, resumable batch iterators.

TFDS loaders live in `sparse_attn.data.tfds_text` (optional `data` extra; imported lazily).
"""

from sparse_attn.data.corpus import ByteCorpus, stdlib_corpus, text_corpus
from sparse_attn.data.iterators import RandomWindows, eval_batches

__all__ = ["ByteCorpus", "RandomWindows", "eval_batches", "stdlib_corpus", "text_corpus"]

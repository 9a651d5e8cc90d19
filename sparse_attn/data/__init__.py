"""Byte-level corpora and deterministic, resumable batch iterators.

TFDS loaders live in `sparse_attn.data.tfds_text` (optional `data` extra; imported lazily).
"""

from sparse_attn.data.corpus import ByteCorpus, stdlib_corpus, text_corpus
from sparse_attn.data.iterators import RandomWindows, eval_batches
from sparse_attn.data.sources import ShakespeareSource, SplitFilesSource, StdlibSource, TextSource, TfdsSource

__all__ = [
    "ByteCorpus",
    "RandomWindows",
    "ShakespeareSource",
    "SplitFilesSource",
    "StdlibSource",
    "TextSource",
    "TfdsSource",
    "eval_batches",
    "stdlib_corpus",
    "text_corpus",
]

"""TFDS text datasets as byte corpora (the optional `data` extra: `pip install sparse_attn[data]`).

Uses `tfds.data_source` (ArrayRecord, random access), which needs no TensorFlow. The data
must already be prepared in `data_dir` (or downloadable); nothing is fetched by the tests.
"""

from __future__ import annotations

import numpy as np

from sparse_attn.data.corpus import DOC_SEPARATOR, ByteCorpus


def _import_tfds():
    try:
        import tensorflow_datasets as tfds  # noqa: PLC0415 — optional dependency, imported lazily
    except ImportError as e:
        raise ImportError(
            "TFDS loaders need the optional `data` extra: pip install 'sparse_attn[data]'"
        ) from e
    return tfds


def _split_bytes(source, feature: str, max_examples: int | None) -> tuple[np.ndarray, int]:
    n = len(source) if max_examples is None else min(len(source), max_examples)
    chunks = []
    for i in range(n):
        text = source[i][feature]
        data = text.encode("utf-8") if isinstance(text, str) else bytes(text)
        chunks.append(data.replace(DOC_SEPARATOR, b""))
    return np.frombuffer(DOC_SEPARATOR.join(chunks), dtype=np.uint8), n


def tfds_text_corpus(name: str, *, train_split: str = "train", valid_split: str = "validation",
                     feature: str = "text", data_dir: str | None = None,
                     max_examples: int | None = None) -> ByteCorpus:
    """Byte corpus from a TFDS text dataset, e.g. `tiny_shakespeare` or `lm1b`.

    Args:
      name: TFDS name (optionally with config/version, `"wiki40b/en"`).
      train_split, valid_split: TFDS split names (slicing syntax allowed, `"train[:1%]"`).
      feature: the text feature of each example.
      data_dir: where prepared data lives (TFDS default if None).
      max_examples: read at most this many examples per split (quick experiments).
    """
    tfds = _import_tfds()
    out, counts = [], []
    for split in (train_split, valid_split):
        source = tfds.data_source(name, split=split, data_dir=data_dir)
        data_U8, n = _split_bytes(source, feature, max_examples)
        out.append(data_U8)
        counts.append(f"{name}:{split}[{n} examples]")
    return ByteCorpus(out[0], out[1], (counts[0],), (counts[1],))

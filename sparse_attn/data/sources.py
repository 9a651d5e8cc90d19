"""Frozen configs naming a byte corpus; `load()` reads it. Experiments hold one as a config field."""

from __future__ import annotations

import dataclasses

from sparse_attn.data.corpus import ByteCorpus, stdlib_corpus, text_corpus
from sparse_attn.data.tfds_text import tfds_text_corpus  # imports tensorflow_datasets only when called


@dataclasses.dataclass(frozen=True, kw_only=True)
class StdlibSource:
    """The embedded corpus: this interpreter's standard library source, split by file."""

    valid_fraction: float = 0.1

    def load(self) -> ByteCorpus:
        return stdlib_corpus(self.valid_fraction)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TextSource:
    """A user's text file (split by position) or folder (split by file)."""

    path: str
    valid_fraction: float = 0.1
    suffixes: tuple[str, ...] = (".txt",)

    def load(self) -> ByteCorpus:
        return text_corpus(self.path, self.valid_fraction, self.suffixes)


@dataclasses.dataclass(frozen=True, kw_only=True)
class TfdsSource:
    """A TFDS text dataset (needs the `data` extra and prepared data in `data_dir`)."""

    name: str
    train_split: str = "train"
    valid_split: str = "validation"
    feature: str = "text"
    data_dir: str | None = None
    max_examples: int | None = None

    def load(self) -> ByteCorpus:
        return tfds_text_corpus(self.name, train_split=self.train_split, valid_split=self.valid_split,
                                feature=self.feature, data_dir=self.data_dir, max_examples=self.max_examples)

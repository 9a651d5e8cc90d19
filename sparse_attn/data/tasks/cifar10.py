"""CIFAR-10 from TFDS as pixel tokens (LRA's image task), for machines that have the data.

`tfds.data_source` (ArrayRecord, random access, no TensorFlow) with `download=False` by default: nothing is
fetched unless asked. Grayscale (LRA): 1024 tokens, `1 + round(0.2989 R + 0.587 G + 0.114 B)`; RGB: 3072
tokens, channels last. 256 levels; token 0 pad (unused). CIFAR-10 has no validation split: "validation" and
"test" both read TFDS "test" by default, as LRA does. Needs the optional `data` extra.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sparse_attn.data.tasks.common import PAD_ID, check_index, split_id

GRAY_WEIGHTS = np.array([0.2989, 0.587, 0.114])


def _import_tfds():
    try:
        import tensorflow_datasets as tfds  # noqa: PLC0415 — optional dependency, imported lazily
    except ImportError as e:
        raise ImportError("the cifar10 task needs the optional `data` extra: pip install 'sparse_attn[data]'") from e
    return tfds


@dataclasses.dataclass(frozen=True, kw_only=True)
class Cifar10:
    """CIFAR-10, 10 classes; `seq_len` 1024 (grayscale) or 3072 (RGB)."""

    grayscale: bool = True
    data_dir: str | None = None
    download: bool = False
    train_split: str = "train"
    validation_split: str = "test"
    test_split: str = "test"

    height = width = 32
    levels = 256  # intensity levels for `common.patchify`
    vocab_size = 1 + 256
    num_classes = 10

    @property
    def channels(self) -> int:
        return 1 if self.grayscale else 3

    @property
    def seq_len(self) -> int:
        return self.height * self.width * self.channels

    def source(self, split: str) -> Cifar10Source:
        tfds_split = (self.train_split, self.validation_split, self.test_split)[split_id(split)]
        tfds = _import_tfds()
        try:
            ds = tfds.data_source("cifar10", split=tfds_split, data_dir=self.data_dir, download=self.download)
        except Exception as e:  # tfds raises several types (NotImplementedError for an empty dir)
            raise FileNotFoundError(
                f"CIFAR-10 is not prepared in data_dir={self.data_dir!r} (TFDS default if None). Prepare it on a "
                "machine with internet: `tfds build cifar10 --file_format=array_record --data_dir DIR` and pass "
                "data_dir=DIR (or download=True here). Offline, use the Pathfinder or Digits tasks. "
                f"TFDS said: {e}") from e
        return Cifar10Source(self, split, ds)


class Cifar10Source:
    def __init__(self, task: Cifar10, split: str, ds):
        self.task, self.split, self._ds = task, split, ds
        self.seq_len, self.vocab_size, self.num_classes = task.seq_len, task.vocab_size, task.num_classes
        self.pad_id = PAD_ID

    def __len__(self) -> int:
        return len(self._ds)

    def __getitem__(self, index) -> dict[str, np.ndarray]:
        i = check_index(index, len(self._ds))
        ex = self._ds[i]
        image_HxWxC = np.asarray(ex["image"], dtype=np.float64)
        if self.task.grayscale:
            image_HxWxC = np.clip(np.round(image_HxWxC @ GRAY_WEIGHTS), 0, 255)[..., None]
        return {"inputs": 1 + image_HxWxC.astype(np.int32).reshape(-1), "label": np.int32(ex["label"]),
                "valid_len": np.int32(self.seq_len)}

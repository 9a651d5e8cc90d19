"""scikit-learn's digits (1797 real 8x8 images, 10 classes) as 64 pixel tokens; installs with the package.

Pixels row-major, 17 intensity levels (0..16 as shipped): token = 1 + level (0 pad, unused). The split is
by a seeded permutation: `default_rng([seed]).permutation(1797)`; its first `round(valid_fraction * 1797)`
images are validation, the rest train; each split lists its images in increasing original index.
Needs the optional `tasks` extra (`pip install 'sparse_attn[tasks]'`).
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from sparse_attn.data.tasks.common import PAD_ID, check_index, split_id

NUM_IMAGES = 1797


@functools.lru_cache(maxsize=1)
def load_digits_arrays() -> tuple[np.ndarray, np.ndarray]:
    """(int32[1797, 64] levels 0..16, int32[1797] labels), read from scikit-learn's bundled copy."""
    try:
        from sklearn.datasets import load_digits  # noqa: PLC0415 — optional dependency, imported lazily
    except ImportError as e:
        raise ImportError("the digits task needs scikit-learn: pip install 'sparse_attn[tasks]'") from e
    d = load_digits()
    return d.data.astype(np.int32), d.target.astype(np.int32)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Digits:
    """8x8 digits, seq_len 64, 10 classes, splits "train" and "validation"."""

    valid_fraction: float = 0.2
    seed: int = 0

    seq_len = 64
    height = width = 8
    levels = 17  # intensity levels for `common.patchify`
    vocab_size = 1 + 17
    num_classes = 10

    def __post_init__(self):
        if not 0 < self.valid_fraction < 1:
            raise ValueError(f"valid_fraction must be in (0, 1), got {self.valid_fraction}")

    def split_indices(self, split: str) -> np.ndarray:
        """Indices into scikit-learn's order of the images in `split`."""
        if split_id(split) == 2:
            raise ValueError("digits has no test split: use 'train' and 'validation'")
        perm = np.random.default_rng([self.seed]).permutation(NUM_IMAGES)
        n_valid = round(self.valid_fraction * NUM_IMAGES)
        return np.sort(perm[:n_valid] if split == "validation" else perm[n_valid:])

    def source(self, split: str) -> DigitsSource:
        return DigitsSource(self, split)


class DigitsSource:
    def __init__(self, task: Digits, split: str):
        pixels, labels = load_digits_arrays()
        idx = task.split_indices(split)
        self.task, self.split = task, split
        self._inputs, self._labels, self._ids = 1 + pixels[idx], labels[idx], idx.astype(np.int32)
        self.seq_len, self.vocab_size, self.num_classes = task.seq_len, task.vocab_size, task.num_classes
        self.pad_id = PAD_ID

    def __len__(self) -> int:
        return len(self._labels)

    def __getitem__(self, index) -> dict[str, np.ndarray]:
        i = check_index(index, len(self._labels))
        return {"inputs": self._inputs[i].copy(), "label": self._labels[i], "valid_len": np.int32(self.seq_len),
                "image_id": self._ids[i]}

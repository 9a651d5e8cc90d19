"""Pathfinder at a sequence length that is not a square: the largest image that fits, padded with 0.

`PaddedPathfinder(pad_to=128)` draws 11 x 11 Pathfinder images (121 pixel tokens) and pads them to 128
tokens (`valid_len` = 121, so attention and pooling ignore the padding); `pad_to=512` draws 22 x 22 (484).
This lets the image control run at the hierarchical tasks' lengths (n = 128, 512) in the CPU grid
(docs/results.md). Paths, dots and labels are Pathfinder's (docs/tasks.md) at that size.
"""

from __future__ import annotations

import dataclasses
import math

import numpy as np

from sparse_attn.data.tasks import Pathfinder


def padded_size(n: int) -> int:
    """Side of the largest square image with at most `n` pixels."""
    return math.isqrt(n)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PaddedPathfinder(Pathfinder):
    """Pathfinder at `size` (set it to `padded_size(pad_to)`), each image padded to `pad_to` tokens."""

    pad_to: int

    def __post_init__(self):
        super().__post_init__()
        if self.pad_to < self.size * self.size:
            raise ValueError(f"pad_to={self.pad_to} is shorter than the {self.size}x{self.size} image")

    @property
    def seq_len(self) -> int:
        return self.pad_to

    def example(self, rng: np.random.Generator) -> dict:
        ex = super().example(rng)
        inputs = np.zeros(self.pad_to, np.int32)
        inputs[: self.size * self.size] = ex["inputs"]
        return {**ex, "inputs": inputs, "valid_len": self.size * self.size}

"""The protocol shared by the classification tasks: random-access sources, batching, resumable batch order.

A task is a frozen, keyword-only config dataclass with `source(split)`. A source has `__len__` and
`__getitem__(i) -> {"inputs": int32[seq_len], "label": int32, "valid_len": int32, ...}` (extra int32 fields
per task, e.g. Dyck's `distance`) and the attributes `seq_len`, `vocab_size`, `num_classes`, `pad_id`.
Token 0 is padding in every task. Generated tasks draw example `i` of a split from
`numpy.random.default_rng([seed, split_id, i, crc32(task class name)])`, so for a given config it depends on
`(seed, split, i)` only: sources are grain/TFDS-style random-access data sources, and a batch order given by
indices restarts exactly.
"""

from __future__ import annotations

import operator
import zlib
from collections.abc import Callable, Sequence
from typing import Any, Protocol

import numpy as np

PAD_ID = 0
SPLITS = {"train": 0, "validation": 1, "test": 2}


class TaskSource(Protocol):
    seq_len: int
    vocab_size: int
    num_classes: int
    pad_id: int

    def __len__(self) -> int: ...

    def __getitem__(self, index: int) -> dict[str, np.ndarray]: ...


def split_id(split: str) -> int:
    if split not in SPLITS:
        raise ValueError(f"split must be one of {sorted(SPLITS)}, got {split!r}")
    return SPLITS[split]


def check_index(index, length: int) -> int:
    """Python-style index (negative counts from the end); IndexError outside [-length, length)."""
    i = operator.index(index)  # ints and numpy integers; TypeError for floats
    if not -length <= i < length:
        raise IndexError(f"index {i} out of range for a source of {length} examples")
    return i % length


def pad_tokens(tokens, seq_len: int) -> np.ndarray:
    """int32[seq_len]: `tokens` followed by PAD_ID."""
    tokens = np.asarray(tokens, dtype=np.int32)
    if tokens.size > seq_len:
        raise ValueError(f"{tokens.size} tokens do not fit seq_len={seq_len}")
    out_N = np.full(seq_len, PAD_ID, dtype=np.int32)
    out_N[:tokens.size] = tokens
    return out_N


class GeneratedSource:
    """A split of a generated task: example `i` = `make_example(default_rng([seed, split_id, i, salt]))`."""

    def __init__(self, task, split: str, make_example: Callable[[np.random.Generator], dict[str, Any]],
                 num_examples: int):
        self.task = task
        self.split = split
        self._split_id = split_id(split)
        self._make_example = make_example
        self._len = int(num_examples)
        # Tasks sharing a seed must not share random streams (their labels would coincide index by index).
        self._salt = zlib.crc32(type(task).__name__.encode())
        self.seq_len = task.seq_len
        self.vocab_size = task.vocab_size
        self.num_classes = task.num_classes
        self.pad_id = PAD_ID

    def __len__(self) -> int:
        return self._len

    def __getitem__(self, index) -> dict[str, np.ndarray]:
        i = check_index(index, self._len)
        rng = np.random.default_rng([self.task.seed, self._split_id, i, self._salt])
        return {k: np.asarray(v, dtype=np.int32) for k, v in self._make_example(rng).items()}

    def __repr__(self) -> str:
        return f"GeneratedSource({self.task!r}, split={self.split!r}, len={self._len})"


def batch(source: TaskSource, indices: Sequence[int]) -> dict[str, np.ndarray]:
    """Stack `source[i]` for `i` in `indices`: `{"inputs": int32[B, seq_len], "label": int32[B], ...}`."""
    examples = [source[int(i)] for i in indices]
    if not examples:
        raise ValueError("batch() needs at least one index")
    return {k: np.stack([e[k] for e in examples]) for k in examples[0]}


def _local_rows(global_batch: int, process_index: int, process_count: int) -> slice:
    if global_batch % process_count:
        raise ValueError(f"global batch {global_batch} is not divisible by {process_count} processes")
    per = global_batch // process_count
    return slice(process_index * per, (process_index + 1) * per)


def batch_indices(num_examples: int, *, global_batch: int, seed: int, step: int) -> np.ndarray:
    """int64[global_batch]: the example indices of training batch `step`.

    Epochs of a shuffled order: position `p = step * global_batch + j` is element `p mod num_examples` of
    epoch `p // num_examples`'s permutation, `default_rng([seed, epoch]).permutation(num_examples)`.
    A pure function of `(seed, step)`: resuming needs only the step.
    """
    pos = step * global_batch + np.arange(global_batch)
    epochs = pos // num_examples
    out = np.empty(global_batch, dtype=np.int64)
    for epoch in np.unique(epochs):
        sel = epochs == epoch
        perm = np.random.default_rng([seed, int(epoch)]).permutation(num_examples)
        out[sel] = perm[pos[sel] % num_examples]
    return out


class TaskBatches:
    """Training batches over a task source, shuffled per epoch; state `{"seed", "step"}` like RandomWindows.

    Yields this process's rows of the global batch (see `batch`).
    """

    def __init__(self, source: TaskSource, *, global_batch: int, seed: int,
                 process_index: int = 0, process_count: int = 1):
        if len(source) == 0:
            raise ValueError("source has no examples")
        self.source = source
        self.global_batch = global_batch
        self.seed = int(seed)
        self.step = 0
        self._rows = _local_rows(global_batch, process_index, process_count)

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        idx = batch_indices(len(self.source), global_batch=self.global_batch, seed=self.seed, step=self.step)
        self.step += 1
        return batch(self.source, idx[self._rows])

    def get_state(self) -> dict:
        return {"seed": self.seed, "step": self.step}

    def set_state(self, state: dict) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"checkpointed data seed {state['seed']} != configured seed {self.seed}")
        self.step = int(state["step"])


def eval_batches(source: TaskSource, *, global_batch: int, num_examples: int | None = None,
                 process_index: int = 0, process_count: int = 1):
    """The first `num_examples` (all if None) examples in order, in global batches; the last batch is
    completed with copies of example 0 and carries `weight` 0 there (1 elsewhere), so metrics can ignore them."""
    n = len(source) if num_examples is None else min(num_examples, len(source))
    rows = _local_rows(global_batch, process_index, process_count)
    for start in range(0, n, global_batch):
        idx = np.arange(start, start + global_batch)
        weight = (idx < n).astype(np.int32)
        out = batch(source, np.where(idx < n, idx, 0)[rows])
        out["weight"] = weight[rows]
        yield out


def patchify(inputs_BxN: np.ndarray, *, height: int, width: int, channels: int = 1, patch: int,
             levels: int) -> np.ndarray:
    """Pixel tokens -> float32[B, (H/p)(W/p), p*p*C] patch vectors in [0, 1] (row-major patches).

    `inputs_BxN` holds `1 + level` per pixel value (row-major, channels last; N = H*W*C), as the image
    tasks emit; `levels` is the number of intensity levels.
    """
    b = inputs_BxN.shape[0]
    if inputs_BxN.shape[1] != height * width * channels or height % patch or width % patch:
        raise ValueError(f"inputs of shape {inputs_BxN.shape} are not {height}x{width}x{channels} images "
                         f"divisible into {patch}x{patch} patches")
    x_BxHxWxC = (inputs_BxN.astype(np.float32) - 1.0).reshape(b, height, width, channels) / (levels - 1)
    x = x_BxHxWxC.reshape(b, height // patch, patch, width // patch, patch, channels)
    return x.transpose(0, 1, 3, 2, 4, 5).reshape(b, (height // patch) * (width // patch), patch * patch * channels)

"""Deterministic, resumable batch iterators over a byte array.

We use a small numpy iterator instead of grain: batch `t` is a pure function of
`(seed, t)` (numpy's counter-seeded `default_rng([seed, t])`), so the whole iterator
state is the JSON dict `{"seed": s, "step": t}`, resuming is O(1), and every process
computes the same global batch and keeps only its own rows (multi-host safe).
"""

from __future__ import annotations

import numpy as np


def _windows(tokens_U8: np.ndarray, starts_B: np.ndarray, seq_len: int) -> dict[str, np.ndarray]:
    window_BxN1 = tokens_U8[starts_B[:, None] + np.arange(seq_len + 1)[None, :]].astype(np.int32)
    return {"inputs": window_BxN1[:, :-1], "targets": window_BxN1[:, 1:]}


def _local_rows(global_batch: int, process_index: int, process_count: int) -> slice:
    if global_batch % process_count:
        raise ValueError(f"global batch {global_batch} is not divisible by {process_count} processes")
    per = global_batch // process_count
    return slice(process_index * per, (process_index + 1) * per)


class RandomWindows:
    """Training batches: `global_batch` windows of `seq_len + 1` bytes at random offsets.

    Yields this process's rows: `{"inputs": int32[b, N], "targets": int32[b, N]}` with
    targets shifted by one byte. Windows are drawn with replacement (nanoGPT-style); no epochs.
    """

    def __init__(self, tokens_U8, *, global_batch: int, seq_len: int, seed: int,
                 process_index: int = 0, process_count: int = 1):
        if tokens_U8.size < seq_len + 2:
            raise ValueError(f"corpus of {tokens_U8.size} bytes is shorter than a window of {seq_len + 1}")
        self.tokens_U8 = tokens_U8
        self.global_batch = global_batch
        self.seq_len = seq_len
        self.seed = int(seed)
        self.step = 0
        self._rows = _local_rows(global_batch, process_index, process_count)

    def __iter__(self):
        return self

    def __next__(self) -> dict[str, np.ndarray]:
        rng = np.random.default_rng([self.seed, self.step])
        starts_B = rng.integers(0, self.tokens_U8.size - self.seq_len - 1, size=self.global_batch)
        self.step += 1
        return _windows(self.tokens_U8, starts_B[self._rows], self.seq_len)

    def get_state(self) -> dict:
        return {"seed": self.seed, "step": self.step}

    def set_state(self, state: dict) -> None:
        if int(state["seed"]) != self.seed:
            raise ValueError(f"checkpointed data seed {state['seed']} != configured seed {self.seed}")
        self.step = int(state["step"])


def eval_batches(tokens_U8, *, global_batch: int, seq_len: int, num_batches: int,
                 process_index: int = 0, process_count: int = 1):
    """A fixed evaluation set: `num_batches * global_batch` non-overlapping windows spread
    evenly over the validation bytes (the same windows every time). Yields local rows."""
    num_windows = num_batches * global_batch
    span = tokens_U8.size - seq_len - 1
    if span < 0:
        raise ValueError(f"validation set of {tokens_U8.size} bytes is shorter than one window")
    # Evenly spaced starts; non-overlapping whenever the set is large enough.
    starts = np.linspace(0, span, num_windows).astype(np.int64)
    rows = _local_rows(global_batch, process_index, process_count)
    for i in range(num_batches):
        yield _windows(tokens_U8, starts[i * global_batch:(i + 1) * global_batch][rows], seq_len)

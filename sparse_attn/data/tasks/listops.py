"""ListOps in the Long Range Arena form (Nangia & Bowman 2018; Tay et al. 2021), generated offline.

Trees follow LRA's generator (`lra_benchmarks/data/listops.py`, `generate_tree(1, max_depth, max_args)`):
a node at depth < `max_depth` is an operator with probability 0.25, else a digit 0-9 (uniform); nodes at
depth `max_depth` are digits; an operator (uniform over MIN, MAX, MED, SM) takes 2..`max_args` arguments
(uniform). Trees are kept iff `min_length <= tokens <= max_length` (rejection sampling; LRA keeps
500 < length < 2000). Values: MIN, MAX; SM = sum mod 10; MED = `int(np.median(args))` as LRA, i.e. for
an even count the floor of the mean of the two middle values.

Tokens (LRA's with the brackets kept, as the S4 pipeline does; LRA's own tokenizer drops `]`):
0 pad, 1 + d for digit d, then `[MIN [MAX [MED [SM ]`. The root is always an operator: LRA draws a digit
root with probability 0.75 and rejects it (length 1), so forcing it keeps the accepted distribution.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from sparse_attn.data.tasks.common import PAD_ID, GeneratedSource, pad_tokens

OPERATORS = ("[MIN", "[MAX", "[MED", "[SM")
TOKENS = ("<pad>",) + tuple(str(d) for d in range(10)) + OPERATORS + ("]",)
DIGIT0 = 1
OP0 = 11
CLOSE = 15
VALUE_P = 0.25  # LRA's name: a node is an operator iff random() <= VALUE_P
MAX_ATTEMPTS = 100_000


class _TooLong(Exception):
    pass


class _Uniforms:
    """Uniform [0, 1) draws, taken from `rng` in blocks (a Python float per call is what the recursion needs)."""

    def __init__(self, rng: np.random.Generator, block: int = 1024):
        self.rng, self.block = rng, block
        self.buf, self.pos = [], 0

    def __call__(self) -> float:
        if self.pos == len(self.buf):
            self.buf, self.pos = self.rng.random(self.block).tolist(), 0
        self.pos += 1
        return self.buf[self.pos - 1]


def apply_op(op: int, args: list[int]) -> int:
    """The value of operator `op` (0 MIN, 1 MAX, 2 MED, 3 SM) on digit arguments."""
    if op == 0:
        return min(args)
    if op == 1:
        return max(args)
    if op == 2:
        s, c = sorted(args), len(args)
        return s[c // 2] if c % 2 else (s[c // 2 - 1] + s[c // 2]) // 2
    return sum(args) % 10


def _operator(u: _Uniforms, depth: int, max_depth: int, max_args: int, out: list[int], limit: int) -> tuple[int, int]:
    """Appends an operator subtree at `depth` to `out`; returns (value, operator nesting depth)."""
    op = int(u() * 4)
    num_args = 2 + int(u() * (max_args - 1))
    out.append(OP0 + op)
    args, deepest = [], depth
    for _ in range(num_args):
        if depth + 1 < max_depth and u() <= VALUE_P:
            v, d = _operator(u, depth + 1, max_depth, max_args, out, limit)
            deepest = max(deepest, d)
        else:
            v = int(u() * 10)
            out.append(DIGIT0 + v)
        args.append(v)
        if len(out) + depth > limit:  # with the `depth` closing brackets still to come
            raise _TooLong
    out.append(CLOSE)
    return apply_op(op, args), deepest


def sample_tree(rng: np.random.Generator, *, min_length: int, max_length: int, max_depth: int = 10,
                max_args: int = 10) -> tuple[list[int], int, int]:
    """One accepted tree: (tokens, value, operator nesting depth)."""
    u = _Uniforms(rng)
    for _ in range(MAX_ATTEMPTS):
        out: list[int] = []
        try:
            value, depth = _operator(u, 1, max_depth, max_args, out, max_length)
        except _TooLong:
            continue
        if len(out) >= min_length:
            return out, value, depth
    raise RuntimeError(f"no tree with {min_length}..{max_length} tokens in {MAX_ATTEMPTS} attempts")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ListOps:
    """ListOps, 10 classes; examples padded to `seq_len`.

    Lengths are in [min_length, max_length] (defaults seq_len // 2 and seq_len). Fields per example:
    `inputs`, `label` (the value), `valid_len` (tree tokens) and `depth` (operator nesting, 1..max_depth-1).
    """

    seq_len: int = 512
    min_length: int | None = None
    max_length: int | None = None
    max_depth: int = 10
    max_args: int = 10
    seed: int = 0
    num_train: int = 96_000
    num_validation: int = 2_000
    num_test: int = 2_000

    vocab_size = len(TOKENS)
    num_classes = 10

    def __post_init__(self):
        lo, hi = self.length_band
        if not 4 <= lo <= hi <= self.seq_len:
            raise ValueError(f"need 4 <= min_length <= max_length <= seq_len, got {lo}, {hi}, {self.seq_len}")
        if self.max_depth < 2 or self.max_args < 2:
            raise ValueError("max_depth and max_args must be >= 2")

    @classmethod
    def lra(cls, **kwargs) -> ListOps:
        """LRA's setting: 500 < length < 2000 tokens, padded to 2048; 96k/2k/2k examples."""
        return cls(**{"seq_len": 2048, "min_length": 501, "max_length": 1999, **kwargs})

    @property
    def length_band(self) -> tuple[int, int]:
        lo = self.seq_len // 2 if self.min_length is None else self.min_length
        hi = self.seq_len if self.max_length is None else self.max_length
        return lo, hi

    def example(self, rng: np.random.Generator) -> dict:
        lo, hi = self.length_band
        tokens, value, depth = sample_tree(rng, min_length=lo, max_length=hi, max_depth=self.max_depth,
                                           max_args=self.max_args)
        return {"inputs": pad_tokens(tokens, self.seq_len), "label": value, "valid_len": len(tokens),
                "depth": depth}

    def source(self, split: str) -> GeneratedSource:
        n = {"train": self.num_train, "validation": self.num_validation, "test": self.num_test}.get(split, 0)
        return GeneratedSource(self, split, self.example, n)


def decode(inputs) -> str:
    """Tokens -> LRA-style text (padding dropped), e.g. `[MAX 2 [MIN 4 7 ] 0 ]`."""
    return " ".join(TOKENS[int(t)] for t in np.asarray(inputs) if t != PAD_ID)

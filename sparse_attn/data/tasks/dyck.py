"""Dyck-(k, m) classification: balanced bracket sequences vs. corruptions that no short window reveals.

An example is a word over k bracket types of even length L (uniform over the even numbers in
[min_length, max_length]) whose open/close shape is uniform over all Dyck paths of length L and height
<= m (exact sampling by counting completions), with independent uniform types per matched pair.

Both classes draw a *probe*: a closing bracket `a` whose partner is `distance = a - partner(a) >= min_distance`
tokens earlier (first a distance, uniform over the distinct eligible distances, then a bracket with it), and a
second closing bracket `b` of another type with partner distance >= `distance`. Label 1 (balanced) leaves the
word; label 0 swaps the types of `a` and `b`. Why this is a fair test:

* The shape, and so the matching, is unchanged, so pairs (partner(a), a) and (partner(b), b) now mismatch:
  the word is unbalanced. Every type keeps its number of opening and of closing brackets, and the depth
  profile is the same, so no count or depth statistic separates the classes.
* A window that does not contain both ends of a pair sees the corrupted brackets as unmatched closers, which
  any type may be: every window of at most `distance` tokens is a factor of some balanced word. Detecting the
  corruption needs a span of `distance + 1` tokens (`b`'s pair is at least as long).
* The probe is drawn the same way in both classes, so accuracy per `distance` bucket compares like with like.

Tokens: 0 pad, 1 + t opens type t, 1 + k + t closes type t.
"""

from __future__ import annotations

import dataclasses
import functools

import numpy as np

from sparse_attn.data.tasks.common import GeneratedSource, pad_tokens

MAX_ATTEMPTS = 1000


@functools.lru_cache(maxsize=16)
def up_probabilities(max_steps: int, max_depth: int) -> np.ndarray:
    """float64[max_steps + 1, max_depth + 1]: P(next step opens | r steps remain, depth d) for a uniform
    Dyck path of height <= max_depth that ends at depth 0 (0 where opening is impossible)."""
    p_RxD = np.zeros((max_steps + 1, max_depth + 1))
    ways_D = np.zeros(max_depth + 1)
    ways_D[0] = 1.0  # completions with 0 steps left: only from depth 0
    for r in range(1, max_steps + 1):
        up_D = np.zeros(max_depth + 1)
        down_D = np.zeros(max_depth + 1)
        up_D[:-1] = ways_D[1:]
        down_D[1:] = ways_D[:-1]
        total_D = up_D + down_D
        p_RxD[r] = np.divide(up_D, total_D, out=np.zeros_like(total_D), where=total_D > 0)
        ways_D = total_D / total_D.max()  # rescaled: only ratios matter, and 2**r overflows
    return p_RxD


@functools.lru_cache(maxsize=16)
def _up_lists(max_steps: int, max_depth: int) -> list[list[float]]:
    return up_probabilities(max_steps, max_depth).tolist()


def sample_shape(rng: np.random.Generator, length: int, max_depth: int) -> np.ndarray:
    """bool[length]: True at opening brackets of a uniform Dyck path of height <= max_depth."""
    u = rng.random(length).tolist()
    p = _up_lists(1 << max(length - 1, 1).bit_length(), max_depth)  # rows depend on r only: share tables
    opens = [False] * length
    d = 0
    for t in range(length):
        if u[t] < p[length - t][d]:
            opens[t], d = True, d + 1
        else:
            d -= 1
    return np.array(opens)


def partners(opens: np.ndarray) -> np.ndarray:
    """int64[L]: the matching position of every bracket of a balanced shape."""
    out = np.empty(opens.size, dtype=np.int64)
    stack = []
    for t, is_open in enumerate(opens.tolist()):
        if is_open:
            stack.append(t)
        else:
            out[t] = stack.pop()
            out[out[t]] = t
    return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class Dyck:
    """Dyck-(k, m) balanced-vs-corrupted classification, 2 classes, padded to `seq_len`.

    Fields per example: `inputs`, `label` (1 balanced), `valid_len` (L), `distance` (the probe's partner
    distance; the corruption's for label 0) and `position` (index of the probe's closing bracket).
    """

    seq_len: int = 512
    k: int = 8
    m: int = 10
    min_length: int | None = None
    max_length: int | None = None
    min_distance: int = 16
    seed: int = 0
    num_train: int = 96_000
    num_validation: int = 2_000
    num_test: int = 2_000

    num_classes = 2

    def __post_init__(self):
        lo, hi = self.length_band
        if not 2 <= lo <= hi <= self.seq_len:
            raise ValueError(f"need 2 <= min_length <= max_length <= seq_len, got {lo}, {hi}, {self.seq_len}")
        if self.k < 2 or self.m < 1:
            raise ValueError("need k >= 2 bracket types (a corruption swaps two) and depth m >= 1")
        if not 1 <= self.min_distance < hi:
            raise ValueError(f"min_distance {self.min_distance} must be in [1, max_length)")

    @property
    def vocab_size(self) -> int:
        return 1 + 2 * self.k

    @property
    def length_band(self) -> tuple[int, int]:
        """Even bounds on L (odd ones round inwards)."""
        lo = self.seq_len // 2 if self.min_length is None else self.min_length
        hi = self.seq_len if self.max_length is None else self.max_length
        return lo + lo % 2, hi - hi % 2

    def example(self, rng: np.random.Generator) -> dict:
        lo, hi = self.length_band
        label = int(rng.integers(2))
        for _ in range(MAX_ATTEMPTS):
            length = 2 * int(rng.integers(lo // 2, hi // 2 + 1))
            opens = sample_shape(rng, length, self.m)
            partner = partners(opens)
            types = rng.integers(self.k, size=length)
            types[~opens] = types[partner[~opens]]
            probe = self._probe(rng, opens, partner, types)
            if probe is not None:
                break
        else:
            raise RuntimeError(f"no probe with distance >= {self.min_distance} in {MAX_ATTEMPTS} words")
        a, b = probe
        if label == 0:
            types[a], types[b] = types[b], types[a]
        tokens = 1 + types + self.k * ~opens
        return {"inputs": pad_tokens(tokens, self.seq_len), "label": label, "valid_len": length,
                "distance": a - partner[a], "position": a}

    def _probe(self, rng, opens, partner, types) -> tuple[int, int] | None:
        closes = np.flatnonzero(~opens)
        dist = closes - partner[closes]
        eligible = dist >= self.min_distance
        values = np.unique(dist[eligible])
        for d in rng.permutation(values):
            for a in rng.permutation(closes[eligible & (dist == d)]):
                ok = eligible & (dist >= d) & (types[closes] != types[a])
                if ok.any():
                    return int(a), int(rng.choice(closes[ok]))
        return None

    def source(self, split: str) -> GeneratedSource:
        n = {"train": self.num_train, "validation": self.num_validation, "test": self.num_test}.get(split, 0)
        return GeneratedSource(self, split, self.example, n)

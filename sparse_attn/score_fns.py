"""Score functions (FlexAttention's `score_mod`): `score_fn(score, b, h, q_idx, kv_idx) -> score`, applied by
`sparse_attn.attention(..., score_fn=)` to the scaled float32 logits before the softmax, on the pairs the pattern
allows. Written elementwise with jnp ops: the executors pass int32 index arrays that broadcast against the logits.
Arrays a score function closes over (ALiBi slopes, a learned bias table) receive gradients.

    scores = relative_position_bias(table_HxNb)            # table: a learned parameter [heads, buckets]
    out = sa.attention(q, k, v, pattern, score_fn=compose(scores, softcap(50.0)))
"""

from __future__ import annotations

import math
from collections.abc import Callable

import jax.numpy as jnp
import numpy as np

ScoreFn = Callable[..., jnp.ndarray]


def softcap(cap: float) -> ScoreFn:
    """`cap * tanh(score / cap)`: logits softly bounded to (-cap, cap) (Gemma 2 caps attention logits at 50)."""
    if not isinstance(cap, (int, float)) or isinstance(cap, bool) or not cap > 0:
        raise ValueError(f"softcap cap must be a number > 0, got {cap!r}")
    cap = float(cap)

    def score_fn(score, b, h, q_idx, kv_idx):
        del b, h, q_idx, kv_idx
        return cap * jnp.tanh(score / cap)

    score_fn.__name__ = f"softcap({cap:g})"
    return score_fn


def alibi_slopes(num_heads: int) -> np.ndarray:
    """float32[num_heads]: ALiBi's head slopes (Press et al. 2022, "Train Short, Test Long"): the geometric sequence
    2^(-8/n), 2^(-16/n), ... for the largest power of two n <= num_heads, then every other slope of 2n's sequence
    for the remaining heads."""
    if not isinstance(num_heads, int) or isinstance(num_heads, bool) or num_heads < 1:
        raise ValueError(f"num_heads must be an int >= 1, got {num_heads!r}")

    def geometric(n: int) -> list[float]:
        start = 2.0 ** (-8.0 / n)
        return [start ** (i + 1) for i in range(n)]

    n = 2 ** int(math.floor(math.log2(num_heads)))
    slopes = geometric(n) + geometric(2 * n)[0::2][: num_heads - n]
    return np.asarray(slopes, np.float32)


def alibi(slopes_H) -> ScoreFn:
    """`score - slopes[h] * |q_idx - kv_idx|`: a linear penalty on distance per head (ALiBi; `alibi_slopes`)."""
    slopes = jnp.asarray(slopes_H, jnp.float32)
    if slopes.ndim != 1:
        raise ValueError(f"alibi slopes must be float[heads], got shape {slopes.shape}")

    def score_fn(score, b, h, q_idx, kv_idx):
        del b
        return score - slopes[h] * jnp.abs(q_idx - kv_idx).astype(jnp.float32)

    score_fn.__name__ = "alibi"
    return score_fn


def relative_position_bucket(relative_position, *, bidirectional: bool = True, num_buckets: int = 32,
                             max_distance: int = 128):  # fmt: skip
    """int32 bucket of `kv_idx - q_idx` (T5, Raffel et al. 2020): exact buckets for distances below half the
    buckets, log-spaced ones up to `max_distance` (farther shares the last); bidirectional halves the buckets between
    keys before and after the query, otherwise keys after the query share bucket 0."""
    rel = jnp.asarray(relative_position, jnp.int32)
    out = jnp.zeros_like(rel)
    if bidirectional:
        num_buckets //= 2
        out = out + jnp.where(rel > 0, num_buckets, 0)
        dist = jnp.abs(rel)
    else:
        dist = jnp.maximum(-rel, 0)
    exact = num_buckets // 2
    far = jnp.log(jnp.maximum(dist, 1).astype(jnp.float32) / exact) / math.log(max_distance / exact)
    far = jnp.minimum(exact + (far * (num_buckets - exact)).astype(jnp.int32), num_buckets - 1)
    return out + jnp.where(dist < exact, dist, far)


def relative_position_bias(table_HxNb, *, bidirectional: bool = True, max_distance: int = 128) -> ScoreFn:
    """`score + table[h, bucket(kv_idx - q_idx)]`: a learned relative-position bias (T5), `table` [heads, buckets]
    (a parameter: gradients flow into it; `relative_position_bucket` maps distances to its columns)."""
    table = jnp.asarray(table_HxNb)
    if table.ndim != 2 or not jnp.issubdtype(table.dtype, jnp.floating):
        raise ValueError(f"relative_position_bias table must be float[heads, buckets], got {table.dtype}{table.shape}")
    num_buckets = table.shape[1]
    if num_buckets < 4 or (bidirectional and num_buckets % 2):
        raise ValueError(f"relative_position_bias needs >= 4 buckets (an even count when bidirectional), got "
                         f"{num_buckets}")  # fmt: skip
    if max_distance <= num_buckets // (4 if bidirectional else 2):
        raise ValueError(f"max_distance ({max_distance}) must exceed the exact buckets' range")

    def score_fn(score, b, h, q_idx, kv_idx):
        del b
        bucket = relative_position_bucket(kv_idx - q_idx, bidirectional=bidirectional, num_buckets=num_buckets,
                                          max_distance=max_distance)  # fmt: skip
        return score + table[h, bucket].astype(jnp.float32)

    score_fn.__name__ = "relative_position_bias"
    return score_fn


def compose(*score_fns: ScoreFn) -> ScoreFn:
    """The score functions applied in order (the first to the logits, each next to the previous result)."""
    if not score_fns or not all(callable(fn) for fn in score_fns):
        raise ValueError(f"compose takes one or more score functions, got {score_fns!r}")

    def score_fn(score, b, h, q_idx, kv_idx):
        for fn in score_fns:
            score = fn(score, b, h, q_idx, kv_idx)
        return score

    score_fn.__name__ = f"compose({', '.join(getattr(fn, '__name__', '?') for fn in score_fns)})"
    return score_fn

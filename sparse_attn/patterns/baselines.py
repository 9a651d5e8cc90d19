"""Baseline pattern builders: dense, causal, sliding window, Longformer, BigBird, document masking.

All are pure functions of their arguments (randomness only from an explicit PRNG key), honour padding through
`valid_len: int32[B]`, and return O(n) metadata.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from sparse_attn.patterns import common
from sparse_attn.patterns.block_layout import BlockLayout
from sparse_attn.patterns.intervals import Intervals


def _positions(n: int) -> jax.Array:
    return jnp.arange(n, dtype=jnp.int32).reshape(1, 1, n)


def _batch(x) -> int | None:
    return None if x is None else x.shape[0]


def _clip(lo, hi, valid_len):
    """Clips ranges to the valid keys and empties padded queries."""
    if valid_len is None:
        return lo, hi
    vl = valid_len.reshape(-1, 1, 1)
    i = _positions(lo.shape[-1])
    hi = jnp.minimum(hi, vl - 1)
    dead = i >= vl
    return jnp.where(dead, 1, lo), jnp.where(dead, 0, hi)


def dense(n: int, *, causal: bool = False, valid_len=None) -> Intervals:
    """Every valid query attends every valid key (causal: every earlier one)."""
    return sliding_window(n, n, causal=causal, valid_len=valid_len)


def causal(n: int, *, valid_len=None) -> Intervals:
    return dense(n, causal=True, valid_len=valid_len)


def sliding_window(n: int, radius: int, *, causal: bool = False, valid_len=None) -> Intervals:
    """Query i attends keys [i - radius, i + radius] (causal: [i - radius, i])."""
    n = common.static_int("n (sequence length)", n, low=1)
    radius = min(common.static_int("radius", radius), n)
    valid_len = common.valid_len_array(valid_len, n)
    i = _positions(n)
    lo = jnp.maximum(i - radius, 0)
    hi = i if causal else jnp.minimum(i + radius, n - 1)
    lo, hi = _clip(lo, hi, valid_len)
    return Intervals(lo, hi, valid_len=valid_len, causal=causal, reach=(radius, 0 if causal else radius))


def _global_mask(global_tokens, n: int, valid_len) -> tuple[jax.Array, int]:
    if np.ndim(global_tokens) == 0:
        count = common.static_int("global_tokens (number of global tokens)", global_tokens, low=1, high=n)
        g = (jnp.arange(n) < count)[None]
    else:
        g = jnp.asarray(global_tokens)
        if g.dtype != jnp.bool_ or g.ndim != 2 or g.shape[1] != n:
            raise ValueError(f"global_tokens must be an int or bool[B|1, {n}], got {g.dtype}{g.shape}")
        if not common.is_concrete(g):
            raise ValueError("a global_tokens mask must be concrete (its count sizes static buffers); pass an int")
        common.check_batches(global_tokens=g.shape[0], valid_len=_batch(valid_len))
        count = max(int(common.host(g).sum(-1).max(initial=0)), 1)
    if valid_len is not None:
        g = g & (jnp.arange(n)[None] < valid_len.reshape(-1, 1))
    return g, count


def longformer(n: int, radius: int, global_tokens, *, causal: bool = False, valid_len=None) -> Intervals:
    """Sliding window plus global tokens (attend all, attended by all).

    Args:
      global_tokens: an int g (the first g positions, e.g. CLS tokens) or a concrete bool[B|1, N] mask.
    """
    win = sliding_window(n, radius, causal=causal, valid_len=valid_len)
    g, count = _global_mask(global_tokens, n, win.valid_len)
    return Intervals(
        win.lo, win.hi, valid_len=win.valid_len, global_tokens=g, causal=causal, reach=win.reach, max_global=count
    )


def bigbird(
    n: int,
    radius: int,
    global_tokens,
    num_random: int,
    block: int,
    key: jax.Array,
    *,
    causal: bool = False,
    valid_len=None,
    batch: int = 1,
) -> BlockLayout:
    """Window + global + random: each query block also attends `num_random` random key blocks of `block` tokens.

    Randomness comes only from `key`; `batch > 1` draws an independent choice per sequence. The random blocks are
    chosen among blocks the window does not already cover (causal: among earlier blocks).
    """
    n = common.static_int("n (sequence length)", n, low=1)
    block = common.static_int("block", block, low=1)
    nb = -(-n // block)
    why = f" (the number of {block}-token key blocks in {n} tokens)"
    num_random = common.static_int("num_random", num_random, high=nb, why=why)
    batch = common.static_int("batch", batch, low=1)
    mask = longformer(n, radius, global_tokens, causal=causal, valid_len=valid_len)
    common.check_batches(batch=batch, valid_len=_batch(mask.valid_len), global_tokens=_batch(mask.global_tokens))
    qb = jnp.arange(nb).reshape(nb, 1)
    kb = jnp.arange(nb).reshape(1, nb)
    near = jnp.abs(qb - kb) <= -(-radius // block)
    eligible = ~near & ((kb < qb) if causal else True)
    scores = jax.random.uniform(key, (batch, 1, nb, nb))
    scores = jnp.where(eligible[None, None], scores, -1.0)
    kth = -jnp.sort(-scores, axis=-1)[..., max(num_random, 1) - 1 : max(num_random, 1)]
    rnd = (scores >= kth) & (scores >= 0.0) & (num_random > 0)
    return BlockLayout.from_intervals(mask, block, block, random_blocks=rnd, max_random=num_random)


def document_mask(segment_ids, *, causal: bool = False, radius: int | None = None, valid_len=None) -> Intervals:
    """Queries attend only inside their own document (contiguous runs of equal segment id), optionally windowed.

    Args:
      segment_ids: int32[B, N], non-decreasing along N (packed documents).
    """
    seg = jnp.asarray(segment_ids)
    common.check_int("segment_ids", seg, 2)
    n = common.static_int("n (sequence length)", seg.shape[1], low=1)
    radius = common.static_int("radius", radius, none_ok=True)
    if common.is_concrete(seg) and np.any(np.diff(common.host(seg), axis=1) < 0):
        raise ValueError("segment_ids must be non-decreasing along the sequence (contiguous documents)")
    valid_len = common.valid_len_array(valid_len, n)
    common.check_batches(segment_ids=seg.shape[0], valid_len=_batch(valid_len))
    i = jnp.arange(n, dtype=jnp.int32)[None]
    new = jnp.concatenate([jnp.ones_like(seg[:, :1], bool), seg[:, 1:] != seg[:, :-1]], axis=1)
    end = jnp.concatenate([seg[:, 1:] != seg[:, :-1], jnp.ones_like(seg[:, :1], bool)], axis=1)
    start = jax.lax.cummax(jnp.where(new, i, 0), axis=1)
    stop = jax.lax.cummin(jnp.where(end, i, n - 1), axis=1, reverse=True)
    r = n if radius is None else radius
    lo = jnp.maximum(start, i - r)[:, None]
    hi = (jnp.broadcast_to(i, seg.shape) if causal else jnp.minimum(stop, i + r))[:, None]
    lo, hi = _clip(lo, hi, valid_len)
    reach = None if radius is None else (radius, 0 if causal else radius)
    return Intervals(lo, hi, valid_len=valid_len, causal=causal, reach=reach)

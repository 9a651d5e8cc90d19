"""Pattern statistics: allowed pairs, keys per query, lonely queries, attention FLOPs."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparse_attn.patterns import common
from sparse_attn.patterns.neighbours import NeighbourList

_CHUNK = 256


def key_counts(pattern) -> tuple[jax.Array, jax.Array]:
    """(keys, self_allowed): int32[B', H', N] allowed keys per query and bool[B', H', N] whether self is allowed.

    Intervals and block layouts are evaluated chunk by chunk (O(N * chunk) memory), never as one N x N mask.
    """
    if isinstance(pattern, NeighbourList):
        keys = jnp.sum(pattern.valid, axis=-1, dtype=jnp.int32)
        n = pattern.num_tokens
        self_ok = jnp.any(pattern.valid & (pattern.idx == jnp.arange(n).reshape(1, 1, n, 1)), axis=-1)
        return keys, self_ok
    n = pattern.num_tokens
    chunk = min(_CHUNK, n)
    nchunks = -(-n // chunk)
    k_pos = jnp.arange(n, dtype=jnp.int32).reshape(1, 1, 1, n)

    def one(c):
        q_pos = (c * chunk + jnp.arange(chunk, dtype=jnp.int32)).reshape(1, 1, 1, chunk)
        ok = pattern.allowed(jnp.minimum(q_pos, n - 1), k_pos)[:, :, 0]  # [B', H', chunk, N]
        diag = jnp.take_along_axis(ok, jnp.minimum(q_pos[0, 0, 0], n - 1)[None, None, :, None], axis=-1)[..., 0]
        return jnp.sum(ok, axis=-1, dtype=jnp.int32), diag

    keys, diag = jax.lax.map(one, jnp.arange(nchunks))  # [C, B', H', chunk]
    keys = jnp.moveaxis(keys, 0, 2).reshape(keys.shape[1:3] + (-1,))[..., :n]
    diag = jnp.moveaxis(diag, 0, 2).reshape(diag.shape[1:3] + (-1,))[..., :n]
    return keys, diag


def pattern_stats(pattern, head_dim: int, *, batch: int = 1, heads: int = 1) -> dict[str, jax.Array]:
    """Statistics of a pattern broadcast to [batch, heads] (a per-batch or per-head pattern must match them).

    Returns a dict of scalars: `pairs` (allowed (query, key) pairs, summed over batch and heads), `mean_keys` and
    `max_keys` per query, `lonely_queries` (queries with no allowed key besides themselves), `flops` (forward
    attention FLOPs, 4 * pairs * head_dim), `density` (pairs / dense pairs).
    """
    head_dim = common.static_int("head_dim", head_dim, low=1)
    batch = common.static_int("batch", batch, low=1)
    heads = common.static_int("heads", heads, low=1)
    keys, self_ok = key_counts(pattern)
    # A per-batch or per-head pattern must match batch/heads: the replication factor below would otherwise be 0.
    for axis, given, size in (("batch", batch, keys.shape[0]), ("heads", heads, keys.shape[1])):
        if size not in (1, given):
            raise ValueError(
                f"pattern_stats: the pattern has {axis} axis {size}, so {axis} must be {size}; got {given}"
            )
    n = keys.shape[-1]
    rep = (batch // keys.shape[0]) * (heads // keys.shape[1])
    pairs = jnp.sum(keys.astype(jnp.float32)) * rep
    others = keys - self_ok.astype(jnp.int32)
    valid_len = getattr(getattr(pattern, "mask", pattern), "valid_len", None)
    live = jnp.ones_like(keys, bool) if valid_len is None else jnp.arange(n).reshape(1, 1, n) < valid_len.reshape(-1, 1, 1)
    return dict(
        pairs=pairs,
        mean_keys=jnp.mean(keys.astype(jnp.float32)),
        max_keys=jnp.max(keys),
        lonely_queries=jnp.sum((others == 0) & live) * rep,
        flops=4.0 * pairs * head_dim,
        density=pairs / (float(batch) * heads * n * n),
    )

"""Pattern statistics: allowed pairs, keys per query, lonely queries, attention FLOPs."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparse_attn.patterns import common
from sparse_attn.patterns.abca.layer_pattern import ZonePattern
from sparse_attn.patterns.block_layout import BlockLayout
from sparse_attn.patterns.intervals import Intervals
from sparse_attn.patterns.labels.counts import label_key_counts
from sparse_attn.patterns.labels.pattern import LabelPattern
from sparse_attn.patterns.neighbours import NeighbourList

_CHUNK = 256


def _interval_counts(pattern: Intervals) -> tuple[jax.Array, jax.Array]:
    """`key_counts` of an Intervals pattern without label bits in O(N): the range's length plus the valid global keys
    outside it (a global query sees every valid key), so that a module can report it on every forward."""
    n = pattern.num_tokens
    i = jnp.arange(n, dtype=jnp.int32).reshape(1, 1, n)
    vl = jnp.full((1,), n, jnp.int32) if pattern.valid_len is None else pattern.valid_len
    vl = vl.reshape(-1, 1, 1)
    lo, hi = pattern.bounds()
    g = jnp.zeros((1, 1, n), bool) if pattern.global_tokens is None else pattern.global_tokens[:, None, :]
    shape = jnp.broadcast_shapes(lo.shape, vl.shape, g.shape)
    lo, hi, g, vl = (jnp.broadcast_to(a, shape) for a in (lo, hi, g, vl))
    live = i < vl
    g = g & live
    last = jnp.minimum(vl - 1, i) if pattern.causal else vl - 1  # the last key a row may see
    lo, hi = jnp.maximum(lo, 0), jnp.minimum(hi, last)
    cum = jnp.concatenate([jnp.zeros(shape[:2] + (1,), jnp.int32), jnp.cumsum(g, -1, dtype=jnp.int32)], -1)
    upto = lambda x: jnp.take_along_axis(cum, jnp.clip(x + 1, 0, n), -1)  # noqa: E731  (globals in [0, x])
    in_range = jnp.maximum(hi - lo + 1, 0)
    globals_outside = upto(last) - jnp.where(hi >= lo, upto(hi) - upto(lo - 1), 0)
    keys = jnp.where(g, last + 1, in_range + globals_outside)
    self_ok = live & (g | ((lo <= i) & (i <= hi)))
    return jnp.where(live, keys, 0).astype(jnp.int32), self_ok


def _random_block_counts(layout: BlockLayout) -> tuple[jax.Array, jax.Array]:
    """(keys, self_allowed) that a block layout's random blocks add to its element rule, in O(N * max_random *
    block_k): each query block's random key blocks are gathered (at most `max_random` of them), and a key counts
    if a random block allows it and the element rule does not (no key twice: global keys, window keys)."""
    m, n = layout.mask, layout.num_tokens
    bq, bk = layout.block_q, layout.block_k
    rb = layout.random_blocks
    nqb, nkb = rb.shape[-2:]
    r = min(layout.max_random, nkb)
    # Random blocks first; argsort is a permutation, so the R blocks gathered are distinct.
    order = jnp.argsort(~rb, axis=-1, stable=True)[..., :r].astype(jnp.int32)  # [B', H', Qb, R]
    within_k = jnp.arange(bk, dtype=jnp.int32).reshape(1, 1, 1, 1, bk)
    k_pos = (order[..., None] * bk + within_k).reshape(order.shape[:3] + (r * bk,))
    within_q = jnp.arange(bq, dtype=jnp.int32).reshape(1, 1, 1, bq)
    q_pos = jnp.arange(nqb, dtype=jnp.int32).reshape(1, 1, nqb, 1) * bq + within_q
    kc, qc = jnp.minimum(k_pos, n - 1), jnp.minimum(q_pos, n - 1)
    extra = layout.random_allowed(qc, kc) & ~m.allowed(qc, kc) & (k_pos < n)[..., None, :]  # [B', H', Qb, bq, R*bk]
    keys = jnp.sum(extra, axis=-1, dtype=jnp.int32)
    keys = keys.reshape(keys.shape[:2] + (nqb * bq,))[..., :n]
    pos = jnp.arange(n, dtype=jnp.int32).reshape(1, 1, n, 1)
    return keys, layout.random_allowed(pos, pos)[..., 0, 0]


def _label_counts(pattern: LabelPattern) -> tuple[jax.Array, jax.Array]:
    """`key_counts` of a label pattern from its labels: self is allowed exactly at the valid positions."""
    lab = pattern.labels
    n = pattern.num_tokens
    vl = jnp.full((1,), n, jnp.int32) if pattern.valid_len is None else jnp.asarray(pattern.valid_len, jnp.int32)
    b = max(lab.shape[0], vl.shape[0])
    lab, vl = jnp.broadcast_to(lab, (b,) + lab.shape[1:]), jnp.broadcast_to(vl.reshape(-1), (b,))
    one = lambda x, length: label_key_counts(x, pattern.num_labels, pattern.base, length)  # noqa: E731
    keys = jax.vmap(jax.vmap(one, in_axes=(0, None)))(lab, vl)
    return keys, jnp.broadcast_to(jnp.arange(n).reshape(1, 1, n) < vl.reshape(-1, 1, 1), keys.shape)


def key_counts(pattern) -> tuple[jax.Array, jax.Array]:
    """(keys, self_allowed): int32[B', H', N] allowed keys per query and bool[B', H', N] whether self is allowed.

    Neighbour lists count their valid slots; Intervals without label bits (and ABCA's `ZonePattern`) use a closed
    form, O(N), and block layouts over them (BigBird) add their random blocks' keys in O(N * max_random * block);
    label patterns that carry their labels count by inclusion-exclusion over label subsets, O(N 2^k log N)
    (`patterns.labels.counts`); other Intervals, block layouts and label patterns are evaluated chunk by chunk
    (O(N * chunk) memory, O(N^2) work), never as one N x N mask.
    """
    if isinstance(pattern, NeighbourList):
        keys = jnp.sum(pattern.valid, axis=-1, dtype=jnp.int32)
        n = pattern.num_tokens
        self_ok = jnp.any(pattern.valid & (pattern.idx == jnp.arange(n).reshape(1, 1, n, 1)), axis=-1)
        return keys, self_ok
    if isinstance(pattern, ZonePattern):
        pattern = pattern.intervals()
    if isinstance(pattern, Intervals) and pattern.label_bits is None:
        return _interval_counts(pattern)
    if isinstance(pattern, BlockLayout) and pattern.mask.label_bits is None:
        keys, self_ok = _interval_counts(pattern.mask)
        if pattern.random_blocks is None:
            return keys, self_ok
        if pattern.max_random > 0:  # else the random blocks per query block have no static bound
            extra, self_random = _random_block_counts(pattern)
            return keys + extra, self_ok | self_random
    if isinstance(pattern, LabelPattern) and pattern.labels is not None:
        return _label_counts(pattern)
    n = pattern.num_tokens
    chunk = min(_CHUNK, n)
    nchunks = -(-n // chunk)
    if isinstance(pattern, LabelPattern):  # its `allowed` takes flat positions: bool[B', H', Q, K]
        allowed = lambda q, k: pattern.allowed(q[0, 0, 0], k[0, 0, 0])[:, :, None]  # noqa: E731
    else:
        allowed = pattern.allowed
    k_pos = jnp.arange(n, dtype=jnp.int32).reshape(1, 1, 1, n)

    def one(c):
        q_pos = (c * chunk + jnp.arange(chunk, dtype=jnp.int32)).reshape(1, 1, 1, chunk)
        ok = allowed(jnp.minimum(q_pos, n - 1), k_pos)[:, :, 0]  # [B', H', chunk, N]
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
    if isinstance(pattern, ZonePattern):
        valid_len = pattern.zones.valid_len
    live = jnp.ones_like(keys, bool) if valid_len is None else jnp.arange(n).reshape(1, 1, n) < valid_len.reshape(-1, 1, 1)
    return dict(
        pairs=pairs,
        mean_keys=jnp.mean(keys.astype(jnp.float32)),
        max_keys=jnp.max(keys),
        lonely_queries=jnp.sum((others == 0) & live) * rep,
        flops=4.0 * pairs * head_dim,
        density=pairs / (float(batch) * heads * n * n),
    )

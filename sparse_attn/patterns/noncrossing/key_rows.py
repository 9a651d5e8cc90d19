"""Key rows of a diagram: per query a fixed-width row of key tokens, duplicates masked (docs/noncrossing.md,
"Diagram algebra").

Each row also names the diagram point whose arc a slot follows (``src``; -1 for self), so a per-point creator gate
(``defect_pairs.creator_gate``) becomes the slot's logit bias.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _dedup(idx_NxK: jax.Array, valid_NxK: jax.Array) -> jax.Array:
    """Keeps the first occurrence of each key in a row."""
    k = idx_NxK.shape[1]
    keep = [valid_NxK[:, 0]]
    for s in range(1, k):
        dup = jnp.zeros(idx_NxK.shape[:1], bool)
        for r in range(s):
            dup = dup | (valid_NxK[:, r] & (idx_NxK[:, r] == idx_NxK[:, s]))
        keep.append(valid_NxK[:, s] & ~dup)
    return jnp.stack(keep, axis=1)


def key_rows(p_2N: jax.Array, *, cup_slot: bool = True) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Rows ``[a, tok(p[a]), (tok(p[n+a]))]`` with tok(x) = x mod n.

    Returns (idx int32[n, K], valid bool[n, K], src int32[n, K]) with K = 3 (2 without the cup slot).
    """
    n = p_2N.shape[0] // 2
    a = jnp.arange(n, dtype=jnp.int32)
    cols = [a, p_2N[:n] % n]
    src = [jnp.full((n,), -1, jnp.int32), a]
    if cup_slot:
        cols.append(p_2N[n:] % n)
        src.append(a + n)
    idx = jnp.stack(cols, axis=1).astype(jnp.int32)
    valid = _dedup(idx, jnp.ones(idx.shape, bool))
    return idx, valid, jnp.stack(src, axis=1)


def through_rows(p_2N: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """The literal reading of the non-crossing research document (an ablation): query a's only key is the bottom end
    b of its through-strand (none if capped)."""
    n = p_2N.shape[0] // 2
    a = jnp.arange(n, dtype=jnp.int32)
    idx = (p_2N[:n] % n)[:, None].astype(jnp.int32)
    return idx, (p_2N[:n] >= n)[:, None], a[:, None]


def doubled_rows(p_4N: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Token rows of a TL_{2n} diagram: ``[t, tok(p[2t]), tok(p[2t+1])]`` with tok(x) = (x mod 2n) // 2."""
    two_n = p_4N.shape[0] // 2
    t = jnp.arange(two_n // 2, dtype=jnp.int32)
    left, right = 2 * t, 2 * t + 1
    idx = jnp.stack([t, (p_4N[left] % two_n) // 2, (p_4N[right] % two_n) // 2], axis=1).astype(jnp.int32)
    valid = _dedup(idx, jnp.ones(idx.shape, bool))
    return idx, valid, jnp.stack([jnp.full_like(t, -1), left, right], axis=1)


def row_bias(gate_2N: jax.Array, src_NxK: jax.Array) -> jax.Array:
    """float[n, K]: each slot's creator gate (0 for self)."""
    return jnp.where(src_NxK >= 0, gate_2N[jnp.maximum(src_NxK, 0)], 0.0)


def mask_keys(idx_NxK: jax.Array, valid_NxK: jax.Array, valid_len, *, causal: bool = False) -> jax.Array:
    """Drops keys at or after ``valid_len`` and, if causal, keys after the query; padded queries keep only self."""
    n = idx_NxK.shape[0]
    q = jnp.arange(n, dtype=jnp.int32)[:, None]
    ok = valid_NxK & (idx_NxK < valid_len) & (q < valid_len)
    if causal:
        ok = ok & (idx_NxK <= q)
    is_self = idx_NxK == q
    return ok | (valid_NxK & is_self)

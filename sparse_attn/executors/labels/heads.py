"""Label heads <-> attention heads, shared by the label executors (`bucketed.py`, `soft.py`).

Labels come either shared by all heads (P = 1: a layout is built once and read by every head, grouped by KV head)
or one set per head (P = H: each head is its own layout, reading its KV group). Both executors run one sequence
per (batch, label head) and work on [G', R', D] head groups inside it.
"""

from __future__ import annotations

import jax.numpy as jnp


def split_heads(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, kv_bad_BxNxG, label_heads: int):
    """-> q [B, P, N, G', R', D], k and v [B, P, N, G', D], kv_bad [B, P, N, G'] for P = `label_heads` (1 or H)."""
    b, n, h, dh = q_BxNxHxD.shape
    g = k_BxNxGxD.shape[2]
    r = h // g
    if label_heads == 1:
        q6 = q_BxNxHxD.reshape(b, 1, n, g, r, dh)
        return q6, k_BxNxGxD[:, None], v_BxNxGxD[:, None], kv_bad_BxNxG[:, None]
    grp = jnp.arange(h) // r

    def per_head(x):  # [B, N, G, ...] -> [B, H, N, ...] (each head's group)
        return jnp.moveaxis(x[:, :, grp], 2, 1)

    q6 = jnp.transpose(q_BxNxHxD, (0, 2, 1, 3)).reshape(b, h, n, 1, 1, dh)
    return q6, per_head(k_BxNxGxD)[:, :, :, None], per_head(v_BxNxGxD)[:, :, :, None], per_head(kv_bad_BxNxG)[..., None]


def merge_heads(out_BxPxNxGxRxD, lse_BxPxNxGxR, reads_BxPxNxG, q_bad_BxNxH, dtype):
    """Back to out [B, N, H, D] and lse [B, N, H], NaN on rows whose query or a key they read is non-finite.

    `reads`: per (label head, KV group) whether the row read a non-finite key or value; `q_bad`: per head.
    """
    b, _, n = out_BxPxNxGxRxD.shape[:3]
    dh = out_BxPxNxGxRxD.shape[-1]
    h = q_bad_BxNxH.shape[-1]
    out = jnp.moveaxis(out_BxPxNxGxRxD, 1, 2).reshape(b, n, h, dh).astype(dtype)
    lse = jnp.moveaxis(lse_BxPxNxGxR, 1, 2).reshape(b, n, h)
    reads = jnp.moveaxis(reads_BxPxNxG, 1, 2).reshape(b, n, -1)  # [B, N, P G']: per KV group, or per head
    bad = (q_bad_BxNxH | jnp.repeat(reads, h // reads.shape[-1], axis=-1)) & ~jnp.isneginf(lse)
    return jnp.where(bad[..., None], jnp.nan, out), jnp.where(bad, jnp.nan, lse)

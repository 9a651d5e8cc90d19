"""Label-attention statistics (SPEC §2, math_spec §B6): candidate degree, disconnected tokens, buckets, FLOPs."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

HIST_EDGES = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, math.inf)  # bucket size / mean bucket size


def p_share(num_labels: int, top_k: int) -> float:
    """P(two independent uniform k-subsets of [d] intersect) = 1 - C(d-k, k) / C(d, k) (math_spec §B3)."""
    return 1.0 - math.comb(num_labels - top_k, top_k) / math.comb(num_labels, top_k)


def bucket_histogram(sizes_xL: jax.Array, edges=HIST_EDGES) -> jax.Array:
    """int32[len(edges) - 1]: how many buckets have size/mean in [edges[j], edges[j+1]) (per sequence, summed)."""
    s = sizes_xL.astype(jnp.float32)
    rel = s / jnp.maximum(jnp.mean(s, axis=-1, keepdims=True), 1e-9)
    lo, hi = jnp.asarray(edges[:-1], jnp.float32), jnp.asarray(edges[1:], jnp.float32)
    shape = (1,) * rel.ndim + lo.shape
    inside = (rel[..., None] >= lo.reshape(shape)) & (rel[..., None] < hi.reshape(shape))
    return jnp.sum(inside.reshape(-1, lo.shape[0]), axis=0, dtype=jnp.int32)


def dense_pairs(n: int, causal: bool, valid_len=None) -> jax.Array:
    """float32: pairs of full (causal) attention summed over the batch."""
    vl = jnp.asarray([n] if valid_len is None else valid_len, jnp.float32)
    return jnp.sum(vl * (vl + 1) / 2 if causal else vl * vl)


def label_stats(keys_BxPxN, sizes_BxPxL, *, heads: int, head_dim: int, causal: bool, valid_len=None, overflow=0):
    """Scalar statistics of one layer's hard pattern.

    Args:
      keys_BxPxN: int32 allowed keys per token (self included), P = 1 or H label heads.
      sizes_BxPxL: int32 bucket sizes.
    """
    b, p, n = keys_BxPxN.shape
    live = (
        jnp.ones((1, 1, n), bool)
        if valid_len is None
        else jnp.arange(n)[None, None] < jnp.reshape(valid_len, (-1, 1, 1))
    )
    live = jnp.broadcast_to(live, keys_BxPxN.shape)
    deg = jnp.where(live, keys_BxPxN - 1, 0).astype(jnp.float32)  # candidates exclude self
    count = jnp.maximum(jnp.sum(live), 1)
    pairs = jnp.sum(jnp.where(live, keys_BxPxN, 0).astype(jnp.float32)) * (heads // p)
    dense = dense_pairs(n, causal, valid_len) * heads * (b if valid_len is None else 1)
    s = sizes_BxPxL.astype(jnp.float32)
    hist = bucket_histogram(sizes_BxPxL)
    out = dict(
        mean_degree=jnp.sum(deg) / count,
        max_degree=jnp.max(deg),
        frac_disconnected=jnp.sum(live & (deg == 0)) / count,
        capacity_overflow=jnp.asarray(overflow, jnp.float32),
        bucket_size_mean=jnp.mean(s),
        bucket_size_min=jnp.min(s),
        bucket_size_max=jnp.max(s),
        attention_flops=4.0 * pairs * head_dim,
        flops_vs_dense=pairs / jnp.maximum(dense, 1.0),
    )
    for j in range(len(HIST_EDGES) - 1):
        out[f"bucket_hist/{HIST_EDGES[j]:g}-{HIST_EDGES[j + 1]:g}"] = hist[j].astype(jnp.float32)
    return out

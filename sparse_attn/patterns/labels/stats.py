"""Label-attention statistics helpers (docs/labels.md, "Statistics"): P_share, bucket-size histogram, dense pairs."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

HIST_EDGES = (0.0, 0.25, 0.5, 0.75, 1.0, 1.25, 1.5, 2.0, math.inf)  # bucket size / mean bucket size


def p_share(num_labels: int, top_k: int) -> float:
    """P(two independent uniform k-subsets of [d] intersect) = 1 - C(d-k, k) / C(d, k) (docs/labels.md)."""
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

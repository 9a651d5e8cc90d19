"""The oracle: dense masked softmax attention over the pattern's `to_dense()` mask."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparse_attn.executors.softmax import masked_softmax
from sparse_attn.patterns.neighbours import NeighbourList


def reference_attention(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern, scale: float):
    """Returns (out[B, N, H, D], lse[B, N, H]); O(N^2) memory, for tests and small problems."""
    b, n, h, d = q_BxNxHxD.shape
    g = k_BxNxGxD.shape[2]
    k = jnp.repeat(k_BxNxGxD, h // g, axis=2)
    v = jnp.repeat(v_BxNxGxD, h // g, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q_BxNxHxD, k, preferred_element_type=jnp.float32) * scale
    if isinstance(pattern, NeighbourList):
        bias = pattern.dense_bias()
        allowed = jnp.isfinite(bias)
        s = s + jnp.where(allowed, bias, 0.0)
    else:
        allowed = pattern.to_dense()
    p, lse = masked_softmax(s, allowed)
    out = jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(jnp.float32))
    return out.astype(q_BxNxHxD.dtype), jnp.swapaxes(lse, 1, 2)

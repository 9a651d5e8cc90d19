"""The oracle: dense masked softmax attention over the pattern's `to_dense()` mask."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparse_attn.executors import registry
from sparse_attn.executors.softmax import masked_softmax, sanitize, zero_empty_rows


def reference_attention(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern, scale: float):
    """Returns (out[B, N, H, D], lse[B, N, H]); O(N^2) memory, for tests and small problems.

    Runs any pattern with `to_dense()`; a pattern with `dense_bias()` (additive logit bias, -inf where masked,
    e.g. `NeighbourList`) is run with that bias instead.

    Non-finite values reach only the rows that may attend them (`softmax.sanitize`; docs/architecture.md).
    """
    b, n, h, d = q_BxNxHxD.shape
    g = k_BxNxGxD.shape[2]
    q, poison_q_BxNxH = sanitize(q_BxNxHxD)
    k, v, poison_kv_BxNxG = sanitize(k_BxNxGxD, v_BxNxGxD)
    k = jnp.repeat(k, h // g, axis=2)
    v = jnp.repeat(v, h // g, axis=2)
    poison_kv = jnp.repeat(poison_kv_BxNxG, h // g, axis=2)
    s = jnp.einsum("bqhd,bkhd->bhqk", q, k, preferred_element_type=jnp.float32) * scale
    s = s + jnp.swapaxes(poison_q_BxNxH, 1, 2)[..., None] + jnp.swapaxes(poison_kv, 1, 2)[:, :, None, :]
    if hasattr(pattern, "dense_bias"):
        bias = pattern.dense_bias()
        allowed = ~jnp.isneginf(bias)  # a NaN bias on an allowed slot keeps it allowed (and poisons the row)
        s = s + jnp.where(allowed, bias, 0.0)
    else:
        allowed = pattern.to_dense()
    p, lse = masked_softmax(s, allowed)
    out = jnp.einsum("bhqk,bkhd->bqhd", p, v.astype(jnp.float32))
    lse = jnp.swapaxes(lse, 1, 2)
    return zero_empty_rows(out, lse).astype(q_BxNxHxD.dtype), lse


registry.set_reference(reference_attention)

"""Masked softmax with the library's semantics: empty rows give 0 and lse -inf, masked keys get zero gradient."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def masked_softmax_parts(s_f32: jax.Array, allowed: jax.Array, axis: int = -1):
    """(e, denom, lse): unnormalised weights, the row sums to divide by (1 on empty rows), and log-sum-exp.

    Callers contract `e` with V first and divide the small result by `denom`, so the normalised [.., Q, K]
    probabilities are never materialised (one fewer score-sized buffer in forward and backward).
    A masked logit becomes -inf before `exp`: its weight and its gradient are exactly 0. The row maximum is
    replaced by 0 on empty rows so that no `-inf - -inf` NaN can appear.
    """
    s = jnp.where(allowed, s_f32, -jnp.inf)
    m = jax.lax.stop_gradient(jnp.max(s, axis=axis, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(s - m)
    l = jnp.sum(e, axis=axis, keepdims=True)
    alive = l > 0
    denom = jnp.where(alive, l, 1.0)
    lse = jnp.where(alive, m + jnp.log(denom), -jnp.inf)
    return e, denom, jnp.squeeze(lse, axis)


def masked_softmax(s_f32: jax.Array, allowed: jax.Array, axis: int = -1) -> tuple[jax.Array, jax.Array]:
    """(p, lse): p sums to 1 on rows with an allowed key and is 0 elsewhere; lse is -inf there."""
    e, denom, lse = masked_softmax_parts(s_f32, allowed, axis)
    return e / denom, lse

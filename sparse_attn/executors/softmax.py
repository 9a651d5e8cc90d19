"""Masked softmax with the library's semantics: empty rows give 0 and lse -inf, masked keys get zero gradient."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def masked_softmax(s_f32: jax.Array, allowed: jax.Array, axis: int = -1) -> tuple[jax.Array, jax.Array]:
    """(p, lse) over `axis`: p sums to 1 on rows with an allowed key and is 0 elsewhere; lse is -inf there.

    Both `where`s guard the gradient: a masked logit never reaches `exp`, so it gets exactly 0 and never NaN.
    """
    s = jnp.where(allowed, s_f32, -jnp.inf)
    m = jax.lax.stop_gradient(jnp.max(s, axis=axis, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.where(allowed, jnp.exp(jnp.where(allowed, s_f32, 0.0) - m), 0.0)
    l = jnp.sum(e, axis=axis, keepdims=True)
    alive = l > 0
    safe_l = jnp.where(alive, l, 1.0)
    p = e / safe_l
    lse = jnp.where(alive, m + jnp.log(safe_l), -jnp.inf)
    return p, jnp.squeeze(lse, axis)

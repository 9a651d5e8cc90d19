"""Diagram statistics (jit-able) and the host-only normal-form length."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from sparse_attn.patterns.noncrossing import normal_form


def diagram_stats(p_2N: jax.Array) -> dict[str, jax.Array]:
    """rank (through-strands), caps (top arcs) and cap nesting depth (deepest top bracket) of one diagram."""
    n = p_2N.shape[0] // 2
    top = p_2N[:n]
    pos = jnp.arange(n, dtype=top.dtype)
    opens = (top < n) & (top > pos)
    closes = (top < n) & (top < pos)
    depth = jnp.cumsum(opens.astype(jnp.int32) - closes.astype(jnp.int32))
    return dict(
        rank=jnp.sum(top >= n, dtype=jnp.int32),
        caps=jnp.sum(opens, dtype=jnp.int32),
        nesting_depth=jnp.max(depth + closes.astype(jnp.int32)),
    )


def surviving_arcs(idx_NxK: jax.Array, valid_NxK: jax.Array) -> jax.Array:
    """Number of valid non-self (query, key) pairs."""
    n = idx_NxK.shape[-2]
    q = jnp.arange(n, dtype=idx_NxK.dtype)[:, None]
    return jnp.sum(valid_NxK & (idx_NxK != q), dtype=jnp.int32)


def normal_form_length(p_2N) -> int:
    """Length of the Jones normal form (host, O(n²)): the length of the shortest word for the diagram."""
    return len(normal_form.diagram_to_jones_nf(np.asarray(jax.device_get(p_2N))))

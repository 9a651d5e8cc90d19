"""Choosing a non-crossing layer from scores (docs/noncrossing.md, "Diagram algebra"), in JAX.

A layer is "non-crossing" when its pairs are pairwise non-adjacent (an independent set on a path): then its
generators commute and the layer can be applied in one parallel step.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def local_max(s_M: jax.Array, ok_M: jax.Array | None = None, tau: float = 0.0) -> jax.Array:
    """bool[M]: j selected iff ``s_j > tau``, ``s_j > s_{j-1}`` and ``s_j >= s_{j+1}`` (missing neighbours: -inf).

    Entries with ``ok_M`` False never win and do not block their neighbours. Always an independent set, ties too.
    """
    ninf = jnp.full((1,), -jnp.inf, s_M.dtype)
    s = s_M if ok_M is None else jnp.where(ok_M, s_M, -jnp.inf)
    left = jnp.concatenate([ninf, s[:-1]])
    right = jnp.concatenate([s[1:], ninf])
    return (s > tau) & (s > left) & (s >= right)


def local_max_on_sequence(
    s_N: jax.Array, ok_N: jax.Array, prev_N: jax.Array, next_N: jax.Array, tau: float = 0.0
) -> jax.Array:
    """``local_max`` over a sparse sequence embedded in N slots: slot x's neighbours are prev_N[x] and next_N[x].

    prev/next are slot indices, or out of range (< 0 or >= N) when there is none.
    """
    n = s_N.shape[0]
    s = jnp.where(ok_N, s_N, -jnp.inf)
    left = jnp.where((prev_N >= 0) & (prev_N < n), s[jnp.clip(prev_N, 0, n - 1)], -jnp.inf)
    right = jnp.where((next_N >= 0) & (next_N < n), s[jnp.clip(next_N, 0, n - 1)], -jnp.inf)
    return ok_N & (s > tau) & (s > left) & (s >= right)


def top_k_independent(s_M: jax.Array, k: int, ok_M: jax.Array | None = None, tau: float = 0.0) -> jax.Array:
    """The ``k`` best local maxima (still an independent set: a subset of one)."""
    sel = local_max(s_M, ok_M, tau)
    k = min(k, s_M.shape[0])
    masked = jnp.where(sel, s_M, -jnp.inf)
    _, top = jax.lax.top_k(masked, k)
    keep = jnp.zeros(s_M.shape, bool).at[top].set(True)
    return sel & keep

"""Router losses (docs/labels.md, "Losses"), unweighted; the module multiplies by its config weights.

Sizes are per sequence and label head: hard c_i = |B_i|, soft s_i = Σ_u p_ui over valid tokens.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp


def _valid(n: int, valid_len) -> jax.Array:
    """bool[B|1, 1, N, 1] True on real tokens. Padding is selected away (`where`), never multiplied by 0, so any
    value there (NaN included) leaves the losses and their gradients unchanged."""
    if valid_len is None:
        return jnp.ones((1, 1, n, 1), bool)
    return (jnp.arange(n)[None, :] < jnp.reshape(valid_len, (-1, 1)))[:, None, :, None]


def sparsity(p_BxPxNxL: jax.Array, valid_len=None) -> jax.Array:
    """mean(p) over valid tokens and labels: the label-intersection research document's Σ p_ui, normalised."""
    m = jnp.broadcast_to(_valid(p_BxPxNxL.shape[2], valid_len), p_BxPxNxL.shape[:3] + (1,))
    total = jnp.sum(jnp.where(m, p_BxPxNxL, 0.0))
    return total / (jnp.maximum(jnp.sum(m, dtype=jnp.float32), 1.0) * p_BxPxNxL.shape[-1])


def soft_sizes(p_BxPxNxL: jax.Array, valid_len=None) -> jax.Array:
    """float32[B, P, L]: s_i = Σ_u p_ui."""
    return jnp.sum(jnp.where(_valid(p_BxPxNxL.shape[2], valid_len), p_BxPxNxL, 0.0), axis=2)


def cv2(soft_BxPxL: jax.Array) -> jax.Array:
    """Importance CV² = d Σ s_i² / (Σ s_i)² - 1, averaged over sequences: 0 iff uniform, and 0 for a sequence with
    no mass (an empty sequence, valid_len = 0: nothing to balance)."""
    d = soft_BxPxL.shape[-1]
    tot = jnp.sum(soft_BxPxL, axis=-1)
    alive = tot > 0
    val = d * jnp.sum(soft_BxPxL**2, axis=-1) / jnp.where(alive, tot, 1.0) ** 2 - 1.0
    return jnp.mean(jnp.where(alive, val, 0.0))


def switch(hard_BxPxL: jax.Array, soft_BxPxL: jax.Array) -> jax.Array:
    """Switch-Transformer balance d Σ f_i P_i with f = c / Σ c (no gradient), P = s / Σ s: 1 at uniform."""
    d = soft_BxPxL.shape[-1]
    c = jax.lax.stop_gradient(hard_BxPxL.astype(jnp.float32))
    f = c / jnp.maximum(jnp.sum(c, axis=-1, keepdims=True), 1.0)
    pr = soft_BxPxL / jnp.maximum(jnp.sum(soft_BxPxL, axis=-1, keepdims=True), 1e-9)
    return jnp.mean(d * jnp.sum(f * pr, axis=-1))


def z_loss(r_BxPxNxL: jax.Array, valid_len=None) -> jax.Array:
    """Router z-loss mean(logsumexp(R_u)²) over valid tokens (ST-MoE): keeps logits small, does not balance."""
    z = jax.nn.logsumexp(r_BxPxNxL.astype(jnp.float32), axis=-1) ** 2
    m = jnp.broadcast_to(_valid(r_BxPxNxL.shape[2], valid_len)[..., 0], z.shape)
    return jnp.sum(jnp.where(m, z, 0.0)) / jnp.maximum(jnp.sum(m, dtype=jnp.float32), 1.0)

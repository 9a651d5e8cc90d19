"""Rotary position embeddings (RoFormer, Su et al. 2021), applied to q and k inside attention modules."""

from __future__ import annotations

import jax
import jax.numpy as jnp


def apply_rope(x_BxNxHxD: jax.Array, positions_BxN: jax.Array, base: float = 10_000.0) -> jax.Array:
    """Rotates feature pairs (i, i + D/2) by position-dependent angles; D must be even."""
    d = x_BxNxHxD.shape[-1]
    if d % 2:
        raise ValueError(f"RoPE needs an even head size, got {d}")
    freq_F = base ** (-jnp.arange(0, d // 2, dtype=jnp.float32) / (d // 2))
    angle_BxNx1xF = (positions_BxN.astype(jnp.float32)[..., None] * freq_F[None, None])[:, :, None, :]
    sin, cos = jnp.sin(angle_BxNx1xF), jnp.cos(angle_BxNx1xF)
    x1, x2 = jnp.split(x_BxNxHxD.astype(jnp.float32), 2, axis=-1)
    out = jnp.concatenate([x1 * cos - x2 * sin, x2 * cos + x1 * sin], axis=-1)
    return out.astype(x_BxNxHxD.dtype)

"""One query row against cached keys: the projections at an absolute position and a masked softmax."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sparse_attn.modules.base import Projections
from sparse_attn.rope import apply_rope


def project(proj: Projections, x_Bx1xD: jax.Array, pos: jax.Array) -> tuple[jax.Array, jax.Array, jax.Array]:
    """q [B, H, D], k and v [B, G, D] of one token at absolute position `pos` (RoPE applied there)."""
    b = x_Bx1xD.shape[0]
    q = proj.wq(x_Bx1xD).reshape(b, 1, proj.num_heads, proj.head_dim)
    k = proj.wk(x_Bx1xD).reshape(b, 1, proj.num_kv_heads, proj.head_dim)
    v = proj.wv(x_Bx1xD).reshape(b, 1, proj.num_kv_heads, proj.head_dim)
    if proj.rope_base is not None:
        pos_Bx1 = jnp.broadcast_to(jnp.asarray(pos, jnp.int32), (b, 1))
        q, k = apply_rope(q, pos_Bx1, proj.rope_base), apply_rope(k, pos_Bx1, proj.rope_base)
    return q[:, 0], k[:, 0], v[:, 0]


def attend(q_BxHxD: jax.Array, k_BxSxGxD: jax.Array, v_BxSxGxD: jax.Array, ok: jax.Array) -> jax.Array:
    """o [B, H, D]: softmax over the slots `ok` allows (bool, broadcastable to [B, H, S]); 0 for a row with none.

    Statistics in float32 (as every executor); scale 1/sqrt(D) (the `attention()` default).
    """
    b, h, d = q_BxHxD.shape
    s_len, g = k_BxSxGxD.shape[1], k_BxSxGxD.shape[2]
    q = q_BxHxD.astype(jnp.float32).reshape(b, g, h // g, d)
    s_BxGxRxS = jnp.einsum("bgrd,bsgd->bgrs", q, k_BxSxGxD.astype(jnp.float32)) / math.sqrt(d)
    ok_BxGxRxS = jnp.broadcast_to(ok, (b, h, s_len)).reshape(b, g, h // g, s_len)
    s_BxGxRxS = jnp.where(ok_BxGxRxS, s_BxGxRxS, -jnp.inf)
    m = jnp.max(s_BxGxRxS, axis=-1, keepdims=True)
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    p = jnp.where(ok_BxGxRxS, jnp.exp(s_BxGxRxS - m), 0.0)
    denom = jnp.sum(p, axis=-1, keepdims=True)
    p = p / jnp.where(denom > 0, denom, 1.0)
    o = jnp.einsum("bgrs,bsgd->bgrd", p, v_BxSxGxD.astype(jnp.float32))
    return o.reshape(b, h, d).astype(q_BxHxD.dtype)


def write_slot(buf_BxSx: jax.Array, slot: jax.Array, row_Bx: jax.Array) -> jax.Array:
    """buf with `row` written at index `slot` of axis 1."""
    return jax.lax.dynamic_update_index_in_dim(buf_BxSx, row_Bx.astype(buf_BxSx.dtype), slot, axis=1)


def cache_bytes(cache) -> int:
    """Bytes of every array in a cache pytree."""
    return int(sum(x.size * x.dtype.itemsize for x in jax.tree.leaves(cache)))

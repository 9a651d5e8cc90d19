"""Does a pattern admit the (query, key) pair a task needs, and how much attention does the pair get?

    pattern_recall(pattern, q_pos_BxP, k_pos_BxP)             # float32[B, H, P]: 1 where the pattern allows it
    pair_attention_mass(q, k, pattern, q_pos_BxP, k_pos_BxP)  # float32[B, H, P]: its softmax weight

A passkey digit's query and the digit it must copy, a recall query and its value, a closing bracket and its partner:
recall 0 says the pattern never admits the pair (no training can fix that), recall 1 with mass near 0 says it does
and the softmax has not learned it. Both read Intervals and BlockLayouts pair by pair (`allowed`), any other
pattern (LabelPattern, ABCA's ZonePattern) through its `to_dense()` oracle; the mass is one softmax over the
pattern's keys (`attention(..., return_lse=True)`), so for multi-pass mechanisms (ABCA's anchors and handshake)
it is the mass of that one pass.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp
import numpy as np

from sparse_attn.attention import attention
from sparse_attn.patterns.block_layout import BlockLayout
from sparse_attn.patterns.common import is_concrete
from sparse_attn.patterns.intervals import Intervals


def check_positions(name: str, pos, n: int) -> jax.Array:
    """int32[B|1, P], refused (ValueError naming it) when concrete and outside [0, n): gathers would clamp."""
    pos = jnp.asarray(pos)
    if not jnp.issubdtype(pos.dtype, jnp.integer) or pos.ndim != 2:
        raise ValueError(f"{name} must be int[B|1, P] token positions, got {pos.dtype}{pos.shape}")
    if is_concrete(pos) and pos.size and (int(np.min(pos)) < 0 or int(np.max(pos)) >= n):
        raise ValueError(f"{name} must lie in [0, {n}) (the pattern's tokens), got [{int(np.min(pos))}, "
                         f"{int(np.max(pos))}]")  # fmt: skip
    return pos.astype(jnp.int32)


def pattern_recall(pattern, q_pos_BxP, k_pos_BxP) -> jax.Array:
    """float32[B', H', P]: 1 where `pattern` lets query q_pos[b, p] attend key k_pos[b, p], else 0."""
    n = pattern.num_tokens
    q, k = check_positions("q_pos", q_pos_BxP, n), check_positions("k_pos", k_pos_BxP, n)
    if q.shape[1] != k.shape[1]:
        raise ValueError(f"q_pos and k_pos must hold the same number of pairs, got {q.shape} and {k.shape}")
    if isinstance(pattern, (Intervals, BlockLayout)):
        ok = pattern.allowed(q[:, None, :, None], k[:, None, :, None])[..., 0, 0]
    else:  # label and zone patterns: their dense oracle
        dense = pattern.to_dense()  # [B|1, H|1, N, N]
        b = max(dense.shape[0], q.shape[0])
        dense = jnp.broadcast_to(dense, (b,) + dense.shape[1:])
        q, k = jnp.broadcast_to(q, (b, q.shape[1])), jnp.broadcast_to(k, (b, k.shape[1]))
        ok = jax.vmap(lambda d, qi, ki: d[:, qi, ki])(dense, q, k)
    return ok.astype(jnp.float32)


def pair_attention_mass(q_BxNxHxD, k_BxNxGxD, pattern, q_pos_BxP, k_pos_BxP, *, scale: float | None = None,
                        implementation: str | None = None) -> jax.Array:  # fmt: skip
    """float32[B, H, P]: the attention weight query q_pos[b, p] of head h puts on key k_pos[b, p] under `pattern`
    (0 where the pattern excludes the pair or the row has no key); query head h reads KV head h // (H / G)."""
    b, n, h, d = q_BxNxHxD.shape
    g = k_BxNxGxD.shape[2]
    q_pos, k_pos = check_positions("q_pos", q_pos_BxP, n), check_positions("k_pos", k_pos_BxP, n)
    q_pos, k_pos = jnp.broadcast_to(q_pos, (b, q_pos.shape[1])), jnp.broadcast_to(k_pos, (b, k_pos.shape[1]))
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    _, lse_BxNxH = attention(q_BxNxHxD, k_BxNxGxD, jnp.zeros_like(k_BxNxGxD), pattern, implementation=implementation,
                             scale=scale, return_lse=True)  # fmt: skip
    take = jax.vmap(lambda x, i: x[i])  # per batch row: [N, ...] at positions [P] -> [P, ...]
    qs = take(q_BxNxHxD.astype(jnp.float32), q_pos).reshape(b, -1, g, h // g, d)  # [B, P, G, R, D]
    ks = take(k_BxNxGxD.astype(jnp.float32), k_pos)  # [B, P, G, D]
    logit = jnp.einsum("bpgrd,bpgd->bgrp", qs, ks, precision=jax.lax.Precision.HIGHEST).reshape(b, h, -1) * scale
    lse = jnp.moveaxis(take(lse_BxNxH, q_pos), 1, 2)  # [B, H, P]
    ok = (pattern_recall(pattern, q_pos, k_pos) > 0) & jnp.isfinite(lse)
    return jnp.where(ok, jnp.exp(jnp.where(ok, logit - lse, 0.0)), 0.0)

"""Soft and straight-through label attention over E(H), for training (docs/labels.md, "Definitions").

Soft: logits s_uv = q·k/√D + log(q_uv + ε) on E(H) ∪ self (q_uu := 1), softmax over N_H(u). With a hard weight
α > 0 (the ramp phase) the score is blended into the hard pattern: log((1 - α) q_uv + α A_uv + ε), so at α = 1 the
weights are hard attention's up to ε. Given a seed, the ramp also thins the edges the hard pattern drops: each takes
part with probability 1 - α (`patterns.labels.thinning`), so that the model cannot offset the blend's finite
penalty with larger scores (docs/labels.md, "Phase transitions").
Straight-through: the forward pass is the hard pattern (in H, m_u & m_v != 0, plus self); the weights are
A_uv e^{s_uv} / Σ A e^{s} with A = A_hard + q - stop_gradient(q), so the router receives the soft phase's gradient
through q on every edge of H (also on the edges the hard mask drops), while the output equals hard attention.

Both score every edge of H (O(|E(H)| d) for the bias): the work-skipping path is `executors.labels.bucketed`.
Query blocks of `block` positions read the window band [x block - w, (x + 1) block + w) plus the landmarks.

Non-finite inputs run as 0 (a band holds keys a row may not read, and `0 * NaN` in P.V would carry them there); a
row that reads a non-finite q, k or v (soft: on an edge of H; straight-through: on a kept edge, the forward's
pattern) outputs NaN. Memberships at padded positions are selected to 0. See docs/labels.md.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sparse_attn.executors.labels.band import band_rows
from sparse_attn.executors.labels.heads import merge_heads, split_heads
from sparse_attn.executors.softmax import finite_rows, masked_softmax
from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels import soft, thinning
from sparse_attn.patterns.labels.base_graph import BaseGraph

MODES = ("soft", "straight_through", "either")
# A dropped edge's logit may exceed the kept row max by any amount; its forward weight is exactly 0, but its router
# gradient scales with e^{s - max}. Capping at the max bounds that gradient by what a kept edge at the max receives.
_EXP_CAP = 0.0


def _one(q_NxGxRxD, k_NxGxD, v_NxGxD, kv_bad_NxG, p_NxL, bits_NxW, vl, seed, alpha, straight, *, base: BaseGraph,
         mode, eps, scale, block, thin):
    n, g, r, dh = q_NxGxRxD.shape
    w = min(base.radius, n)
    nb = -(-n // block)
    width = block + w + (0 if base.causal else w)
    lm = jnp.asarray(base.landmarks(n))
    nl = lm.shape[0]

    def keys(x_NxF):  # [nb, C + L, ...]: the window band, then the landmarks
        band = band_rows(x_NxF, nb, block, w, width)
        lmk = jnp.broadcast_to(x_NxF[lm][None], (nb, nl) + x_NxF.shape[1:])
        return jnp.concatenate([band, lmk], axis=1)

    qpos = (jnp.arange(nb, dtype=jnp.int32)[:, None] * block + jnp.arange(block, dtype=jnp.int32)[None])[..., None]
    band_pos = jnp.arange(nb, dtype=jnp.int32)[:, None] * block - w + jnp.arange(width, dtype=jnp.int32)[None]
    kpos = jnp.concatenate([band_pos, jnp.broadcast_to(lm[None], (nb, nl))], axis=1)[:, None, :]  # [nb, 1, C+L]
    is_band = (jnp.arange(width + nl) < width)[None, None, :]
    edge = jnp.where(is_band, base.in_window(qpos, kpos), base.landmark_edge(qpos, kpos))
    edge = edge & (qpos < vl) & (kpos >= 0) & (kpos < vl)  # [nb, B, C+L]
    selfp = kpos == qpos

    pad = nb * block - n

    def padq(x):
        return jnp.pad(x, [(0, pad)] + [(0, 0)] * (x.ndim - 1)).reshape((nb, block) + x.shape[1:])

    bias = soft.log_q_pairs(padq(p_NxL), keys(p_NxL), eps)  # [nb, B, C+L]
    q_xBxGxRxD = padq(q_NxGxRxD)
    s = jnp.einsum("xbgrd,xcgd->xgrbc", q_xBxGxRxD, keys(k_NxGxD), preferred_element_type=jnp.float32) * scale
    vk = keys(v_NxGxD).astype(jnp.float32)
    hard = edge & (bits_lib.shares(padq(bits_NxW)[:, :, None, :], keys(bits_NxW)[:, None, :, :]) | selfp)

    def soft_weights():  # -> (weights, lse, the keys a row weighs, the keys it reads)
        mixed = jnp.log((1.0 - alpha) * jnp.exp(bias) + alpha * (hard.astype(jnp.float32) + eps))
        blended = jnp.where(alpha > 0, mixed, bias)
        live = edge & (hard | thinning.present(seed, qpos, kpos, alpha)) if thin else edge
        p, lse = masked_softmax(s + jnp.where(selfp, 0.0, blended)[:, None, None], live[:, None, None])
        return p, lse, live, edge

    def straight_through_weights():
        q_soft = jnp.where(selfp, 1.0, jnp.exp(bias) - eps)
        a_st = hard.astype(jnp.float32) + q_soft - jax.lax.stop_gradient(q_soft)
        ok = hard[:, None, None]
        m = jax.lax.stop_gradient(jnp.max(jnp.where(ok, s, -jnp.inf), axis=-1, keepdims=True))
        m = jnp.where(jnp.isfinite(m), m, 0.0)
        ex = jnp.where(
            edge[:, None, None], jnp.exp(jnp.minimum(jnp.where(edge[:, None, None], s, 0.0) - m, _EXP_CAP)), 0.0
        )
        num = a_st[:, None, None] * ex
        denom = jnp.sum(num, axis=-1, keepdims=True)
        alive = jax.lax.stop_gradient(jnp.any(ok, axis=-1, keepdims=True))
        p = num / jnp.where(alive, denom, 1.0)
        lse = jnp.where(alive, m + jnp.log(jnp.where(alive, denom, 1.0)), -jnp.inf)[..., 0]
        return p, lse, edge, hard

    if mode == "either":  # the scores above are shared; only the weights' branch differs (one copy to compile)
        p, lse, counted, read = jax.lax.cond(straight, straight_through_weights, soft_weights)
    else:
        p, lse, counted, read = soft_weights() if mode == "soft" else straight_through_weights()
    o = jnp.einsum("xgrbc,xcgd->xbgrd", p, vk).reshape(nb * block, g, r, dh)[:n]
    lse = jnp.transpose(lse, (0, 3, 1, 2)).reshape(nb * block, g, r)[:n]
    keys_N = jnp.sum(hard, axis=-1, dtype=jnp.int32).reshape(-1)[:n]
    # The forward's weight on edges the hard pattern drops (mean over this group's heads): 0 in straight-through.
    drop = (edge & ~hard)[:, None, None]
    dropped_N = jnp.mean(jnp.sum(jnp.where(drop, jax.lax.stop_gradient(p), 0.0), axis=-1), axis=(1, 2))
    dropped_N = dropped_N.reshape(-1)[:n]
    edges_N = jnp.sum(counted, axis=-1, dtype=jnp.int32).reshape(-1)[:n]
    reads = jnp.einsum("xbc,xcg->xbg", read.astype(jnp.float32), keys(kv_bad_NxG.astype(jnp.float32))) > 0
    return o, lse, keys_N, edges_N, dropped_N, reads.reshape(nb * block, g)[:n]


def soft_label_attention(
    q_BxNxHxD,
    k_BxNxGxD,
    v_BxNxGxD,
    p_BxPxNxL,
    bits_BxPxNxW,
    *,
    base: BaseGraph,
    mode: str = "soft",
    eps: float = soft.DEFAULT_EPS,
    scale: float | None = None,
    valid_len=None,
    block: int = 64,
    hard_weight=0.0,
    thin_seed=None,
    straight_through=None,
):
    """Soft or straight-through label attention.

    Args:
      p_BxPxNxL: float32 memberships σ(R/τ), P = 1 (shared by heads) or H.
      bits_BxPxNxW: uint32 top-k bitmasks (the hard pattern of the straight-through forward, and statistics).
      mode: "soft", "straight_through", or "either": the one `straight_through` picks (a bool scalar, may be
        traced, e.g. from the step; one `lax.cond` after the scores, which both modes share, so a phase switch
        compiles the band's scores once).
      hard_weight: α in [0, 1] (float scalar, may be traced), soft mode only: blends q_uv into the hard pattern.
      thin_seed: None, or an integer scalar (the step; may be traced): with α > 0 each edge the hard pattern drops
        then takes part with probability 1 - α, drawn per (batch row, label head, query, key) from this seed
        (`patterns.labels.thinning`). None: every edge of H takes part.

    Returns:
      out [B, N, H, D], lse [B, N, H], and info: `keys` int32[B, P, N] (keys the hard pattern allows, self
      included), `edges` int32[B, P, N] (edges of H, self included: the keys a soft row weighs; with thinning,
      those present), `dropped`
      float32[B, P, N] (the attention weight the forward puts on edges the hard pattern drops, mean over the label
      head's attention heads; 0 in straight-through mode, no gradient). A row that reads
      a non-finite q, k or v gives NaN in out and lse.
    """
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    if (mode == "either") != (straight_through is not None):
        raise ValueError("straight_through (a bool scalar) is given exactly when mode is 'either'")
    b, n, h, dh = q_BxNxHxD.shape
    pp = p_BxPxNxL.shape[1]
    if (
        p_BxPxNxL.ndim != 4
        or pp not in (1, h)
        or p_BxPxNxL.shape[2] != n
        or bits_BxPxNxW.shape[:3] != p_BxPxNxL.shape[:3]
    ):
        raise ValueError(f"memberships {p_BxPxNxL.shape} / bits {bits_BxPxNxW.shape} must be [B|1, 1|{h}, {n}, ...]")
    scale = 1.0 / math.sqrt(dh) if scale is None else scale
    (q_BxNxHxD, q_bad), (k_BxNxGxD, k_bad), (v_BxNxGxD, v_bad) = map(finite_rows, (q_BxNxHxD, k_BxNxGxD, v_BxNxGxD))
    q6, k5, v5, bad4 = split_heads(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, k_bad | v_bad, pp)
    vl = jnp.full((b,), n, jnp.int32) if valid_len is None else jnp.asarray(valid_len, jnp.int32).reshape(b)
    live = (jnp.arange(n)[None, None, :, None] < vl[:, None, None, None])
    p_all = jnp.where(live, jnp.broadcast_to(p_BxPxNxL, (b,) + p_BxPxNxL.shape[1:]), 0.0)  # padding: any value
    bits_all = jnp.broadcast_to(bits_BxPxNxW, (b,) + bits_BxPxNxW.shape[1:])

    alpha = jax.lax.stop_gradient(jnp.asarray(hard_weight, jnp.float32))

    thin = thin_seed is not None
    seed_BxP = thinning.seeds(thin_seed if thin else 0, b * pp).reshape(b, pp)

    straight = jnp.asarray(False if straight_through is None else straight_through, bool)

    def one(q, k, v, bad, p, bits, length, seed):
        kw = dict(base=base, mode=mode, eps=eps, scale=scale, block=min(block, n), thin=thin)
        return _one(q, k, v, bad, p, bits, length, seed, alpha, straight, **kw)

    per_head = jax.vmap(one, in_axes=(0, 0, 0, 0, 0, 0, None, 0))
    out, lse, keys, edges, dropped, reads = jax.vmap(per_head)(q6, k5, v5, bad4, p_all, bits_all, vl, seed_BxP)
    out, lse = merge_heads(out, lse, reads, q_bad, q_BxNxHxD.dtype)
    return out, lse, dict(keys=keys, edges=edges, dropped=dropped)

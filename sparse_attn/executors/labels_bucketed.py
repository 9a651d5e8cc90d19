"""Work-skipping executor for the hard label pattern: bucket-sorted keys, contiguous ranges, log-sum-exp merge.

Each token is copied into its k label buckets (entries sorted by (label, position), `patterns.labels.buckets`).
Inside a bucket the window is a contiguous range of entries, so a block of `block` consecutive entries reads one
contiguous slice of `capacity` keys starting at its first needed key (no block alignment), scores it with one
einsum, masks the range ends and the lowest-shared-label dedup, and softmaxes. A token's k bucket outputs and the
landmark pass (landmarks outside the window, a small dense [N, L] pass) are merged by log-sum-exp. Every allowed
pair is counted exactly once; the disallowed pairs of the window are never scored (except range ends inside a
block's slice). Keys a block needs beyond its static capacity are counted in `info["overflow"]`, never hidden.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sparse_attn.executors.softmax import masked_softmax
from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.buckets import BucketLayout, bucket_layout

DEFAULT_BLOCK = 128


def default_capacity(n: int, base: BaseGraph, num_labels: int, top_k: int, block: int, factor: float = 1.25) -> int:
    """Keys per block slice: the block plus `factor` times the expected bucket entries of the window, +4σ.

    With balanced buckets a window of w positions holds ~ w k / d entries of a bucket (Poisson-like spread).
    """
    sides = 1 if base.causal else 2
    mu = sides * min(base.radius, n) * top_k / num_labels
    cap = block + math.ceil(factor * mu + 4.0 * math.sqrt(mu)) + 1
    return min(-(-cap // 8) * 8, n * top_k)


def merge_lse(out_xSxD: jax.Array, lse_xS: jax.Array, axis: int) -> tuple[jax.Array, jax.Array]:
    """Merges S partial softmax results along `axis` (of out's leading axes); all -inf rows give (0, -inf)."""
    m = jax.lax.stop_gradient(jnp.max(lse_xS, axis=axis, keepdims=True))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    w = jnp.exp(lse_xS - m)
    tot = jnp.sum(w, axis=axis, keepdims=True)
    alive = tot > 0
    out = jnp.sum(out_xSxD * jnp.expand_dims(w / jnp.where(alive, tot, 1.0), -1), axis=axis)
    lse = jnp.where(alive, m + jnp.log(jnp.where(alive, tot, 1.0)), -jnp.inf)
    return out, jnp.squeeze(lse, axis)


def _exp_scores(s_f32, ok):
    """(e, l, m): unnormalised exp(s - m) over allowed keys, its row sums and the row max (0 on empty rows).

    Normalising the [.., D] output instead of the [.., C] probabilities saves a pass over the scores; a masked
    logit becomes -inf before `exp`, so its weight and gradient are exactly 0.
    """
    s = jnp.where(ok, s_f32, -jnp.inf)
    m = jax.lax.stop_gradient(jnp.max(s, axis=-1))
    m = jnp.where(jnp.isfinite(m), m, 0.0)
    e = jnp.exp(s - m[..., None])
    return e, jnp.sum(e, axis=-1), m


def _bucket_pass(q_NxGxRxD, k_NxGxD, v_NxGxD, lay: BucketLayout, scale, block: int, capacity: int, dedup: bool):
    """Attention of every entry over its bucket range: (out[E, G, R, D], lse[E, G, R], keys[E], overflow)."""
    n, g, r, dh = q_NxGxRxD.shape
    e = lay.token_E.shape[0]
    nb = -(-e // block)
    pad = nb * block - e
    cap = min(capacity, e)
    tok = jnp.pad(lay.token_E, (0, pad))
    lo = jnp.pad(lay.lo_E, (0, pad), constant_values=1).reshape(nb, block)
    hi = jnp.pad(lay.hi_E, (0, pad), constant_values=0).reshape(nb, block)
    q_xBxGxRxD = q_NxGxRxD[tok].reshape(nb, block, g, r, dh)
    k_ExGxD, v_ExGxD = k_NxGxD[lay.token_E], v_NxGxD[lay.token_E]

    live = lo <= hi
    start = jnp.min(jnp.where(live, lo, e), axis=1)
    start = jnp.clip(start, 0, e - cap)  # the slice must lie inside the entries; it only moves left
    kidx_xC = start[:, None] + jnp.arange(cap, dtype=jnp.int32)[None, :]
    take = jax.vmap(lambda s: jax.lax.dynamic_slice_in_dim(k_ExGxD, s, cap))
    k_xCxGxD = take(start)
    v_xCxGxD = jax.vmap(lambda s: jax.lax.dynamic_slice_in_dim(v_ExGxD, s, cap))(start)

    kj = kidx_xC[:, None, :]
    ok_xBxC = (kj >= lo[..., None]) & (kj <= hi[..., None])
    if dedup:
        below = jnp.pad(lay.below_E, ((0, pad), (0, 0))).reshape(nb, block, -1)
        kbits = jax.vmap(lambda s: jax.lax.dynamic_slice_in_dim(lay.bits_E, s, cap))(start)  # [nb, C, W]
        for w in range(below.shape[-1]):
            ok_xBxC = ok_xBxC & ((below[:, :, None, w] & kbits[:, None, :, w]) == 0)

    s = jnp.einsum("xbgrd,xcgd->xgrbc", q_xBxGxRxD, k_xCxGxD, preferred_element_type=jnp.float32) * scale
    e_, l, m = _exp_scores(s, ok_xBxC[:, None, None])
    o = jnp.einsum("xgrbc,xcgd->xgrbd", e_, v_xCxGxD.astype(jnp.float32))
    alive = l > 0
    o = jnp.transpose(o / jnp.where(alive, l, 1.0)[..., None], (0, 3, 1, 2, 4))
    lse = jnp.where(alive, m + jnp.log(jnp.where(alive, l, 1.0)), -jnp.inf)
    o = o.reshape(nb * block, g, r, dh)[:e]
    lse = jnp.transpose(lse, (0, 3, 1, 2)).reshape(nb * block, g, r)[:e]

    end = start + cap - 1
    missing = jnp.where(live, jnp.maximum(hi - end[:, None], 0) + jnp.maximum(start[:, None] - lo, 0), 0)
    keys = jnp.sum(ok_xBxC, axis=-1, dtype=jnp.int32).reshape(-1)[:e]
    return o, lse, keys, jnp.sum(missing)


def _landmark_pass(q_NxGxRxD, k_NxGxD, v_NxGxD, bits_NxW, base: BaseGraph, vl, scale):
    """Every query over the landmarks outside its window that share a label: (out, lse, keys[N])."""
    n = q_NxGxRxD.shape[0]
    lm = jnp.asarray(base.landmarks(n))
    pos = jnp.arange(n, dtype=jnp.int32)
    ok_NxL = base.landmark_edge(pos[:, None], lm[None, :]) & (pos[:, None] < vl) & (lm[None, :] < vl)
    ok_NxL = ok_NxL & bits_lib.shares(bits_NxW[:, None, :], bits_NxW[lm][None, :, :])
    s = jnp.einsum("ngrd,lgd->ngrl", q_NxGxRxD, k_NxGxD[lm], preferred_element_type=jnp.float32) * scale
    p, lse = masked_softmax(s, ok_NxL[:, None, None, :])
    o = jnp.einsum("ngrl,lgd->ngrd", p, v_NxGxD[lm].astype(jnp.float32))
    return o, lse, jnp.sum(ok_NxL, axis=-1, dtype=jnp.int32)


def _one_sequence(q_NxGxRxD, k_NxGxD, v_NxGxD, labels_NxK, vl, *, num_labels, base, scale, block, capacity):
    n, kk = labels_NxK.shape
    lay = bucket_layout(labels_NxK, num_labels, base, vl)
    o_E, lse_E, keys_E, overflow = _bucket_pass(
        q_NxGxRxD, k_NxGxD, v_NxGxD, lay, scale, block, capacity, dedup=kk > 1
    )
    outs, lses = [o_E[lay.entry_NxK]], [lse_E[lay.entry_NxK]]  # [N, k, G, R, (D)]
    keys = jnp.sum(keys_E[lay.entry_NxK], axis=1)
    if base.landmark_every:
        bits_NxW = bits_lib.pack_labels(labels_NxK, num_labels)
        o_l, lse_l, keys_l = _landmark_pass(q_NxGxRxD, k_NxGxD, v_NxGxD, bits_NxW, base, vl, scale)
        outs.append(o_l[:, None])
        lses.append(lse_l[:, None])
        keys = keys + keys_l
    out, lse = merge_lse(jnp.concatenate(outs, 1), jnp.concatenate(lses, 1), axis=1)
    return out, lse, keys, overflow


def bucketed_attention(
    q_BxNxHxD,
    k_BxNxGxD,
    v_BxNxGxD,
    labels_BxPxNxK,
    *,
    num_labels: int,
    base: BaseGraph,
    scale: float | None = None,
    valid_len=None,
    block: int = DEFAULT_BLOCK,
    capacity: int | None = None,
):
    """Hard label attention that skips the disallowed pairs' work.

    Args:
      q_BxNxHxD, k_BxNxGxD, v_BxNxGxD: queries, keys, values (GQA: H % G == 0).
      labels_BxPxNxK: int32[B|1, P, N, k] each token's k distinct labels; P = 1 (shared by heads) or H.
      num_labels: d <= 64. base: the base graph H. valid_len: int32[B] or None.
      block: entries per block. capacity: keys per block slice (default `default_capacity`).

    Returns:
      out [B, N, H, D], lse [B, N, H] (float32, -inf on padding), and info: `overflow` (int32, key slots a block
      needed beyond its capacity, summed; 0 means exact), `keys` (int32[B, P, N], allowed keys per token, self
      included).
    """
    b, n, h, dh = q_BxNxHxD.shape
    g = k_BxNxGxD.shape[2]
    if labels_BxPxNxK.ndim != 4 or labels_BxPxNxK.shape[1] not in (1, h) or labels_BxPxNxK.shape[2] != n:
        raise ValueError(f"labels must be int32[B|1, 1|{h}, {n}, k], got shape {labels_BxPxNxK.shape}")
    if labels_BxPxNxK.shape[0] not in (1, b):
        raise ValueError(f"labels batch axis {labels_BxPxNxK.shape[0]} must be 1 or {b}")
    if h % g or k_BxNxGxD.shape != v_BxNxGxD.shape or k_BxNxGxD.shape[:2] != (b, n):
        raise ValueError(f"bad q/k/v shapes {q_BxNxHxD.shape}, {k_BxNxGxD.shape}, {v_BxNxGxD.shape}")
    kk = labels_BxPxNxK.shape[-1]
    bits_lib.check_labels(num_labels, kk)
    if block < 1:
        raise ValueError(f"block must be >= 1, got {block}")
    scale = 1.0 / math.sqrt(dh) if scale is None else scale
    capacity = capacity or default_capacity(n, base, num_labels, kk, block)
    p = labels_BxPxNxK.shape[1]
    r = h // g
    if p == 1:
        q6 = q_BxNxHxD.reshape(b, 1, n, g, r, dh)
        k5, v5 = k_BxNxGxD[:, None], v_BxNxGxD[:, None]
    else:  # per-head labels: each head is its own layout, reading its KV group
        q6 = jnp.transpose(q_BxNxHxD, (0, 2, 1, 3)).reshape(b, h, n, 1, 1, dh)
        grp = jnp.arange(h) // r
        k5 = jnp.transpose(k_BxNxGxD[:, :, grp], (0, 2, 1, 3))[:, :, :, None]
        v5 = jnp.transpose(v_BxNxGxD[:, :, grp], (0, 2, 1, 3))[:, :, :, None]
    labels = jnp.broadcast_to(labels_BxPxNxK, (b,) + labels_BxPxNxK.shape[1:]).astype(jnp.int32)
    vl = jnp.full((b,), n, jnp.int32) if valid_len is None else jnp.asarray(valid_len, jnp.int32).reshape(b)

    def one(q, k, v, lab, length):
        return _one_sequence(
            q, k, v, lab, length, num_labels=num_labels, base=base, scale=scale, block=block, capacity=capacity
        )

    per_head = jax.vmap(one, in_axes=(0, 0 if p > 1 else 0, 0 if p > 1 else 0, 0, None))
    out, lse, keys, overflow = jax.vmap(per_head, in_axes=(0, 0, 0, 0, 0))(q6, k5, v5, labels, vl)
    # out [B, P, N, G', R', D] -> [B, N, H, D]
    out = jnp.moveaxis(out, 1, 2).reshape(b, n, h, dh).astype(q_BxNxHxD.dtype)
    lse = jnp.moveaxis(lse, 1, 2).reshape(b, n, h)
    return out, lse, dict(overflow=jnp.sum(overflow), keys=keys)

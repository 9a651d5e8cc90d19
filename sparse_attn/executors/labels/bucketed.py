"""Work-skipping executor for the hard label pattern: bucket-sorted keys, contiguous ranges, log-sum-exp merge.

Each token is copied into its k label buckets (entries sorted by (label, position), `patterns.labels.buckets`).
Inside a bucket the window is a contiguous range of entries, so block x of `block` consecutive entries reads the
static band of entries [x block - reach, (x + 1) block + reach) (no alignment to key blocks: built from shifted
contiguous copies, no gather), scores it with one einsum, masks the range ends and the lowest-shared-label dedup,
and softmaxes. A token's k bucket outputs and the landmark pass (landmarks outside the window: a small dense
[N, L] pass) are merged by log-sum-exp. Every allowed pair is counted exactly once and only the band is scored.
Keys a block needs beyond its static reach are counted in `info["overflow"]`, never hidden.

Non-finite inputs: a band holds entries its rows may not read (other buckets, the dedup, padding), and `0 * NaN` in
P.V, dS.K or dS^T.Q would carry them there. The passes only ever see finite values (non-finite entries selected to 0
once); a row that reads a non-finite q, k or v (its q, a key entry in one of its bucket ranges, or a landmark it
attends) is set to NaN afterwards, from prefix counts over the entries. See docs/labels.md ("Non-finite values").
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sparse_attn.executors.labels.band import (
    GROUP_ENTRIES,
    Ranges,
    band_attention,
    band_mask,
    band_width,
)
from sparse_attn.executors.labels.heads import merge_heads, split_heads
from sparse_attn.executors.softmax import finite_rows, masked_softmax, merge_lse, range_any
from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.buckets import BucketLayout, bucket_layout

DEFAULT_BLOCK = 128


def default_reach(n: int, base: BaseGraph, num_labels: int, top_k: int, factor: float = 1.25) -> int:
    """Static key entries a block reads on each side of itself: `factor` x the expected bucket entries of one side
    of the window, +4σ, rounded up to 8.

    With balanced buckets one side of the window (w positions) holds ~ w k / d entries of a bucket (Poisson-like).
    """
    mu = min(base.radius, n) * top_k / num_labels
    reach = math.ceil(factor * mu + 4.0 * math.sqrt(mu)) + 1
    return min(-(-reach // 8) * 8, n * top_k)


def fallback_reaches(reach: int, radius: int, n: int) -> tuple:
    """Static band tiers: the planned `reach`, then x4 up to min(radius, n), which holds any bucket's range.

    Inside a bucket entries have distinct positions, so an entry's range holds at most `radius` entries on each
    side of it: a block never needs more than that, whatever the labels.
    """
    cap = min(radius, n)
    tiers = [reach]
    while tiers[-1] < cap:
        tiers.append(min(4 * tiers[-1] if tiers[-1] else 8, cap))
    return tuple(tiers)


def required_reach(lo_xE, hi_xE, block: int) -> jax.Array:
    """int32[..., E]: the reach entry e's block needs to hold e's range (0 for empty ranges)."""
    e = lo_xE.shape[-1]
    start = ((jnp.arange(e, dtype=jnp.int32) // block) * block).reshape((1,) * (lo_xE.ndim - 1) + (e,))
    need = jnp.maximum(start - lo_xE, hi_xE - (start + block - 1))
    return jnp.where(lo_xE <= hi_xE, jnp.maximum(need, 0), 0)


def _bucket_pass(q_NxGxRxD, k_NxGxD, v_NxGxD, lay: BucketLayout, tier, scale, block, reaches, causal, group):
    """Attention of every entry over its bucket range: (out[E, G, R, D], lse[E, G, R], keys[E]).

    Block b of entries reads the static band of entries [b block - reach, (b + 1) block + reach) of the tier in
    use (causal: up to its own end); `tier` is the narrowest that holds every range of the batch.
    """
    _, g, r, dh = q_NxGxRxD.shape
    e = lay.token_E.shape[0]
    nb = -(-e // block)
    pad = nb * block - e
    lo = jnp.pad(lay.lo_E, (0, pad), constant_values=1).reshape(nb, block)
    hi = jnp.pad(lay.hi_E, (0, pad), constant_values=0).reshape(nb, block)
    tok = jnp.pad(lay.token_E, (0, pad))
    q_xBxGxRxD = q_NxGxRxD[tok].reshape(nb, block, g, r, dh)
    k_ExGxD = jnp.pad(k_NxGxD[lay.token_E], ((0, pad), (0, 0), (0, 0)))
    v_ExGxD = jnp.pad(v_NxGxD[lay.token_E], ((0, pad), (0, 0), (0, 0)))
    below = None
    if lay.entry_NxK.shape[1] > 1:  # k = 1: one bucket per token, nothing to dedup
        below = jnp.pad(lay.below_E, ((0, pad), (0, 0))).reshape(nb, block, -1)
    ranges = Ranges(lo, hi, below, lay.bits_E)
    ok_xBxC = band_mask(ranges, block, reaches[0], band_width(block, reaches[0], causal))
    # A scan step of more blocks than the pass has would only score padding (at n = 128, k = 2: 2 blocks of 128
    # entries padded to the 8 of GROUP_ENTRIES, 4x the work).
    group = min(group, nb)

    # The keys come from the pass's own masks: a separate count would build every wider tier's mask once more
    # (one more switch to compile).
    o, lse, keys = band_attention(
        q_xBxGxRxD, k_ExGxD, v_ExGxD, ok_xBxC, ranges, tier, block, reaches, scale, group, causal
    )
    o = o.reshape(nb * block, g, r, dh)[:e]
    lse = jnp.transpose(lse, (0, 3, 1, 2)).reshape(nb * block, g, r)[:e]
    return o, lse, keys.reshape(-1)[:e]


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
    return o, lse, ok_NxL


def _one_sequence(
    q_NxGxRxD, k_NxGxD, v_NxGxD, kv_bad_NxG, labels_NxK, lay, tier, vl, *, num_labels, base, scale, block, reaches,
    group,
):  # fmt: skip
    o_E, lse_E, keys_E = _bucket_pass(q_NxGxRxD, k_NxGxD, v_NxGxD, lay, tier, scale, block, reaches, base.causal, group)
    keys = jnp.sum(keys_E[lay.entry_NxK], axis=1)
    return combine_sequence(o_E, lse_E, keys, q_NxGxRxD, k_NxGxD, v_NxGxD, kv_bad_NxG, labels_NxK, lay, vl,
                            num_labels=num_labels, base=base, scale=scale)


def combine_sequence(o_ExGxRxD, lse_ExGxR, window_keys_N, q_NxGxRxD, k_NxGxD, v_NxGxD, kv_bad_NxG, labels_NxK, lay,
                     vl, *, num_labels, base, scale):  # fmt: skip
    """One sequence's bucket-pass results back at its tokens, merged with the landmark pass by log-sum-exp:
    (out [N, G, R, D], lse [N, G, R], keys int32[N] (the window's + the landmarks'), reads bool[N, G]: the row
    reads a non-finite key or value). Shared by the bucket executors ("bucketed", "bucketed_pallas")."""
    outs, lses = [o_ExGxRxD[lay.entry_NxK]], [lse_ExGxR[lay.entry_NxK]]  # [N, k, G, R, (D)]
    keys = window_keys_N
    # Every key entry in a bucket range shares that label with the row, so the row reads it (the dedup only picks
    # the bucket that scores the pair): a row reads a non-finite key iff one lies in one of its ranges.
    reads_E = range_any(kv_bad_NxG[lay.token_E][None], lay.lo_E[None], lay.hi_E[None])[0]  # [E, G]
    reads = jnp.any(reads_E[lay.entry_NxK], axis=1)  # [N, G]
    if base.landmark_every:
        bits_NxW = bits_lib.pack_labels(labels_NxK, num_labels)
        o_l, lse_l, ok_NxL = _landmark_pass(q_NxGxRxD, k_NxGxD, v_NxGxD, bits_NxW, base, vl, scale)
        outs.append(o_l[:, None])
        lses.append(lse_l[:, None])
        keys = keys + jnp.sum(ok_NxL, axis=-1, dtype=jnp.int32)
        lm = jnp.asarray(base.landmarks(q_NxGxRxD.shape[0]))
        reads = reads | jnp.any(ok_NxL[:, :, None] & kv_bad_NxG[lm][None], axis=1)
    out, lse = merge_lse(jnp.concatenate(outs, 1), jnp.concatenate(lses, 1), axis=1)
    return out, lse, keys, reads


def bucket_layouts(labels_BxPxNxK, num_labels: int, base: BaseGraph, valid_len_B) -> BucketLayout:
    """The bucket layout of every (batch, label head): `bucket_layout` vmapped, leaves [B, P, ...]."""
    one = lambda lab, length: bucket_layout(lab, num_labels, base, length)  # noqa: E731
    return jax.vmap(jax.vmap(one, in_axes=(0, None)))(labels_BxPxNxK, valid_len_B)


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
    reach: int | None = None,
    group_entries: int = GROUP_ENTRIES,
    layout: BucketLayout | None = None,
):
    """Hard label attention that skips the disallowed pairs' work.

    Args:
      q_BxNxHxD, k_BxNxGxD, v_BxNxGxD: queries, keys, values (GQA: H % G == 0).
      labels_BxPxNxK: int32[B|1, P, N, k] each token's k distinct labels; P = 1 (shared by heads) or H.
      num_labels: d <= 64. base: the base graph H. valid_len: int32[B] or None.
      block: entries per block. reach: key entries read on each side of a block (the planned capacity; default
        `default_reach`, for balanced buckets; wider tiers, up to the window radius, run when a range exceeds it).
        group_entries: entries per scan step (memory bound).
      layout: `bucket_layouts(labels, num_labels, base, valid_len)` when already built (a prepared pattern), with
        batch B or 1; None: built here.

    Returns:
      out [B, N, H, D], lse [B, N, H] (float32, -inf on padding; a row that reads a non-finite q, k or v gives
      NaN in both, and every other row, and the gradients of a loss that skips those rows, are what finite values
      there would give), exact for any labels, and info: `overflow` (int32, bucket entries over the batch whose
      range the planned `reach` does not hold; when > 0 the batch ran a wider band tier), `reach` (int32, the
      tier's reach that ran), `tier` (int32, its index in `fallback_reaches`: 0 = the planned band), `needed`
      (int32, the widest reach a block of the batch needed: the planned reach holds the batch iff needed <= reach),
      `keys` (int32[B, P, N], allowed keys per token, self included).
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
    reach = default_reach(n, base, num_labels, kk) if reach is None else reach
    if reach < 0:
        raise ValueError(f"reach must be >= 0, got {reach}")
    p = labels_BxPxNxK.shape[1]
    (q_BxNxHxD, q_bad), (k_BxNxGxD, k_bad), (v_BxNxGxD, v_bad) = map(finite_rows, (q_BxNxHxD, k_BxNxGxD, v_BxNxGxD))
    q6, k5, v5, bad4 = split_heads(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, k_bad | v_bad, p)
    labels = jnp.broadcast_to(labels_BxPxNxK, (b,) + labels_BxPxNxK.shape[1:]).astype(jnp.int32)
    vl = jnp.full((b,), n, jnp.int32) if valid_len is None else jnp.asarray(valid_len, jnp.int32).reshape(b)

    lay = bucket_layouts(labels, num_labels, base, vl) if layout is None else layout
    lay = jax.tree.map(lambda x: jnp.broadcast_to(x, (b,) + x.shape[1:]), lay)
    # One tier for the whole batch: `tier` must stay unbatched under the vmaps below, so that the switch runs one
    # branch (a batched index would run them all).
    reaches = fallback_reaches(reach, base.radius, n)
    need_BxPxE = required_reach(lay.lo_E, lay.hi_E, block)
    needed = jnp.max(need_BxPxE)
    tier = jnp.sum(jnp.asarray(reaches[:-1], jnp.int32) < needed, dtype=jnp.int32)
    overflow = jnp.sum(need_BxPxE > reach, dtype=jnp.int32)

    def one(q, k, v, bad, lab, lay, length):
        kw = dict(num_labels=num_labels, base=base, scale=scale, block=block, reaches=reaches)
        return _one_sequence(q, k, v, bad, lab, lay, tier, length, group=max(1, group_entries // block), **kw)

    per_head = jax.vmap(one, in_axes=(0, 0, 0, 0, 0, 0, None))
    out, lse, keys, reads = jax.vmap(per_head)(q6, k5, v5, bad4, labels, lay, vl)
    out, lse = merge_heads(out, lse, reads, q_bad, q_BxNxHxD.dtype)
    used = jnp.asarray(reaches, jnp.int32)[tier]
    return out, lse, dict(overflow=overflow, reach=used, tier=tier, needed=needed, keys=keys)

"""Per-batch label-attention statistics (docs/labels.md, "Statistics"): keys per query, candidate degree,
disconnected tokens, bucket sizes, capacity, attention FLOPs vs dense. Unprefixed names: the model prefixes them.
"""

from __future__ import annotations

import jax.numpy as jnp

from sparse_attn.patterns.labels.stats import HIST_EDGES, bucket_histogram, dense_pairs


def _live(shape, valid_len):
    b, p, n = shape
    if valid_len is None:
        return jnp.ones(shape, bool)
    return jnp.broadcast_to(jnp.arange(n)[None, None] < jnp.reshape(valid_len, (-1, 1, 1)), shape)


def label_stats(keys_BxPxN, hard_keys_BxPxN, sizes_BxPxL, *, heads: int, head_dim: int, causal: bool,
                valid_len=None, overflow=0, needed=0, reach=1, tier=0, dropped_BxPxN=None):
    """Scalar statistics of one layer's forward.

    Args:
      keys_BxPxN: int32 keys each query attends in this forward (self included; soft phases: every edge of H),
        P = 1 or H label heads.
      hard_keys_BxPxN: int32 keys the hard pattern allows (self included): degree and disconnection.
      sizes_BxPxL: int32 hard bucket sizes.
      overflow, needed, reach, tier: the hard executor's capacity figures: entries over the planned reach, the reach
        the batch needed, the planned reach, the band tier that ran (0: the planned band). 0 outside the hard phase
        (reach: the planned one in every phase).
      dropped_BxPxN: float32 attention weight on edges the hard pattern drops (soft phases; None: 0).
    """
    b, p, n = keys_BxPxN.shape
    live = _live(keys_BxPxN.shape, valid_len)
    count = jnp.maximum(jnp.sum(live), 1)
    attended = jnp.where(live, keys_BxPxN, 0).astype(jnp.float32)
    deg = jnp.where(live, hard_keys_BxPxN - 1, 0).astype(jnp.float32)  # candidates exclude self
    pairs = jnp.sum(attended) * (heads // p)
    dense = dense_pairs(n, causal, valid_len) * heads * (b if valid_len is None else 1)
    s = sizes_BxPxL.astype(jnp.float32)
    hist = bucket_histogram(sizes_BxPxL)
    out = dict(
        keys_per_query=jnp.sum(attended) / count,
        mean_degree=jnp.sum(deg) / count,
        max_degree=jnp.max(deg),
        frac_disconnected=jnp.sum(live & (deg == 0)) / count,
        capacity_overflow=jnp.asarray(overflow, jnp.float32),
        reach_needed_ratio=jnp.asarray(needed, jnp.float32) / max(reach, 1),
        reach_needed=jnp.asarray(needed, jnp.float32),
        reach_planned=jnp.asarray(reach, jnp.float32),
        reach_tier=jnp.asarray(tier, jnp.float32),
        bucket_size_mean=jnp.mean(s),
        bucket_size_min=jnp.min(s),
        bucket_size_max=jnp.max(s),
        attention_flops=4.0 * pairs * head_dim,
        flops_vs_dense=pairs / jnp.maximum(dense, 1.0),
    )
    if dropped_BxPxN is not None:
        out["dropped_mass"] = jnp.sum(jnp.where(live, dropped_BxPxN, 0.0)) / count
    for j in range(len(HIST_EDGES) - 1):
        out[f"bucket_hist/{HIST_EDGES[j]:g}-{HIST_EDGES[j + 1]:g}"] = hist[j].astype(jnp.float32)
    return out

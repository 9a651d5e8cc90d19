"""The hard label pattern through the block-sparse kernels in bucket-entry space: executor "bucketed_pallas".

The bucketed executor's idea on the accelerator. Each token is copied into its k label buckets (entries sorted by
(label, position), `patterns.labels.buckets`), so inside a bucket a query's window is one contiguous range of
entries: in entry space the pattern is an `Intervals` whose tiles are dense in shared labels, whatever the labels
(over positions, random labels make every tile of a window partial). The kernels run it with the lowest-shared-label
dedup as an exclusion test on the label words (`TokenMeta.exclude`); each token's k entry outputs come back by a
gather, and the landmark pass and the log-sum-exp merge are the bucketed executor's (`combine_sequence`).

Tiles visited per layout: about (k N / block_q) x (block_q + 2 reach) / block_k, reach ~ radius k / d entries,
against (N / block_q) x (block_q + 2 radius) / block_k for the window carrying label bits ("pallas"); exact for
any labels (the tile lists are built from the ranges on device, no capacity). See docs/labels.md.
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sparse_attn.executors.labels import check_labels
from sparse_attn.executors.labels.bucketed import bucket_layouts, combine_sequence
from sparse_attn.executors.labels.heads import merge_heads, split_heads
from sparse_attn.executors.pallas import KernelMeta, pallas_attention, prepare_pallas
from sparse_attn.executors.registry import register_executor
from sparse_attn.executors.softmax import finite_rows
from sparse_attn.kernels.config import KernelConfig
from sparse_attn.patterns.intervals import Intervals
from sparse_attn.patterns.labels import counts
from sparse_attn.patterns.labels.buckets import BucketLayout
from sparse_attn.patterns.labels.pattern import LabelPattern


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PreparedBuckets:
    """What "bucketed_pallas" builds from the pattern alone: the bucket layouts (leaves [B, P, ...]), the kernels'
    metadata over the B * P entry sequences, and the window keys per token (for the statistics)."""

    layout: BucketLayout
    kernel: KernelMeta
    window_keys: jax.Array  # int32[B, P, N]


def _labels_and_lengths(pattern: LabelPattern, batch: int | None):
    """(labels int32[B, P, N, k], valid_len int32[B]) broadcast to the batch (B = the pattern's when None)."""
    check_labels(pattern, "bucketed_pallas")
    lab = pattern.labels
    b = lab.shape[0] if batch is None else batch
    n = pattern.num_tokens
    vl = jnp.full((b,), n, jnp.int32) if pattern.valid_len is None else pattern.valid_len
    vl = jnp.broadcast_to(jnp.asarray(vl, jnp.int32).reshape(-1), (b,))
    return jnp.broadcast_to(lab, (b,) + lab.shape[1:]).astype(jnp.int32), vl


def entry_intervals(lay: BucketLayout, radius: int, causal: bool) -> Intervals:
    """The bucket ranges as one `Intervals` per (batch, label head): lo/hi [B P, 1, E], the entries' label bits
    (so the tile lists keep only tiles whose label summaries meet). Inside a bucket an entry's range holds at most
    `radius` entries on each side (positions are distinct), which is its static reach."""
    flat = lambda x: x.reshape((-1, 1) + x.shape[2:])  # noqa: E731  [B, P, E, ...] -> [B P, 1, E, ...]
    reach = (radius, 0 if causal else radius)
    return Intervals(flat(lay.lo_E), flat(lay.hi_E), label_bits=flat(lay.bits_E), reach=reach)


def prepare_bucketed_pallas(pattern: LabelPattern, *, head_dim: int | None = None, config: KernelConfig | None = None,
                            batch: int | None = None) -> PreparedBuckets:
    """Layouts, entry-space kernel metadata and window key counts (`sparse_attn.prepare(..., head_dim=D)`), for
    the pattern's batch (or `batch`)."""
    lab, vl = _labels_and_lengths(pattern, batch)
    lay = bucket_layouts(lab, pattern.num_labels, pattern.base, vl)
    mask = entry_intervals(lay, pattern.base.radius, pattern.base.causal)
    km = prepare_pallas(mask, head_dim=head_dim, config=config)
    if lab.shape[-1] > 1:  # k = 1: one bucket per token, nothing to dedup
        below = jax.lax.bitcast_convert_type(lay.below_E, jnp.int32).reshape((-1, 1) + lay.below_E.shape[2:])
        below = jnp.swapaxes(below, -1, -2)  # [B P, 1, W, E]
        pad = km.meta.labels.shape[-1] - below.shape[-1]
        below = jnp.pad(below, ((0, 0), (0, 0), (0, 0), (0, pad)))
        meta = dataclasses.replace(km.meta, labels=jnp.concatenate([km.meta.labels, below], axis=2), exclude=True)
        km = dataclasses.replace(km, meta=meta)
    base, d = pattern.base, pattern.num_labels
    window = jax.vmap(jax.vmap(lambda x, length: counts.window_key_counts(x, d, base, length), (0, None)))(lab, vl)
    return PreparedBuckets(lay, km, window)


def bucketed_pallas(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern: LabelPattern, *, scale: float,
                    config: KernelConfig | None = None, prepared: PreparedBuckets | None = None):
    """The "bucketed_pallas" executor: (out [B, N, H, D], lse [B, N, H], aux with `keys` int32[B, P, N], each
    query's allowed keys, self included). Non-finite inputs follow the "bucketed" executor's rule (rows that read
    one are NaN; every other row and its gradients are what finite values would give)."""
    if (config or KernelConfig()).backward != "pallas":
        raise ValueError("implementation 'bucketed_pallas' needs KernelConfig(backward='pallas'): the XLA reference "
                         "backward does not know the entry-space dedup")
    b, n, h, dh = q_BxNxHxD.shape
    lab, vl = _labels_and_lengths(pattern, b)
    p = lab.shape[1]
    prep = prepared if prepared is not None else prepare_bucketed_pallas(pattern, head_dim=dh, config=config, batch=b)
    if prep.kernel.meta.lo.shape[0] not in (1, b * p):  # one entry sequence per (batch, label head), or one for all
        raise ValueError(f"bucketed_pallas: metadata prepared for {prep.kernel.meta.lo.shape[0]} (batch, label head) "
                         f"sequences, called with {b} x {p}")
    lay = jax.tree.map(lambda x: jnp.broadcast_to(x, (b,) + x.shape[1:]), prep.layout)
    (q, q_bad), (k, k_bad), (v, v_bad) = map(finite_rows, (q_BxNxHxD, k_BxNxGxD, v_BxNxGxD))
    q6, k5, v5, bad4 = split_heads(q, k, v, k_bad | v_bad, p)  # q [B, P, N, G', R', D], k/v [B, P, N, G', D]
    _, _, _, g, r, _ = q6.shape
    e = lay.token_E.shape[-1]
    tok = lay.token_E.reshape(b * p, e)
    gather = jax.vmap(lambda x, t: x[t])  # [B P, N, ...] at the entries' tokens -> [B P, E, ...]
    flat = lambda x: x.reshape((b * p,) + x.shape[2:])  # noqa: E731
    q_E = gather(flat(q6), tok).reshape(b * p, e, g * r, dh)
    k_E, v_E = gather(flat(k5), tok), gather(flat(v5), tok)
    mask = entry_intervals(lay, pattern.base.radius, pattern.base.causal)
    o_E, lse_E = pallas_attention(q_E, k_E, v_E, mask, scale, config=config, prepared=prep.kernel)
    o_E, lse_E = o_E.reshape(b, p, e, g, r, dh), lse_E.reshape(b, p, e, g, r)
    window = jnp.broadcast_to(prep.window_keys, (b,) + prep.window_keys.shape[1:])

    def one(o, lse, keys, q, k, v, bad, labels, lay, length):
        return combine_sequence(o, lse, keys, q, k, v, bad, labels, lay, length, num_labels=pattern.num_labels,
                                base=pattern.base, scale=scale)

    per_head = jax.vmap(one, in_axes=(0,) * 9 + (None,))
    out, lse, keys, reads = jax.vmap(per_head)(o_E, lse_E, window, q6, k5, v5, bad4, lab, lay, vl)
    out, lse = merge_heads(out, lse, reads, q_bad, q_BxNxHxD.dtype)
    return out, lse, dict(keys=keys)


register_executor(LabelPattern, "bucketed_pallas", bucketed_pallas, prepare=prepare_bucketed_pallas, aux=True)

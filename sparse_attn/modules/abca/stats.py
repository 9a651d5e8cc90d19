"""Per-batch ABCA statistics (docs/abca.md, "Statistics"): k, zone sizes, inserted anchors, overflow, keys per query."""

from __future__ import annotations

import jax.numpy as jnp

from sparse_attn.patterns import abca
from sparse_attn.patterns.abca.zones import Zones


def _range_pairs(lo_BxN, hi_BxN, rows_BxN):
    return jnp.sum(jnp.where(rows_BxN, jnp.maximum(hi_BxN - lo_BxN + 1, 0), 0).astype(jnp.float32))


def _handshake_pairs(k_B, causal: bool, handshake: str, max_anchors: int | None):
    """Allowed pairs of one handshake step, from the anchor count alone (the patterns in `patterns.abca.handshake`).

    chain: every anchor sees itself and its previous anchor [and its next, bidirectional]. global: the first
    M = max_anchors anchors see each other [causal: the earlier ones]; anchors past M keep the chain.
    """
    k = k_B.astype(jnp.float32)

    def chain(ranks, with_prev):
        return ranks + with_prev + (0.0 if causal else jnp.maximum(ranks - 1.0, 0.0))

    if handshake == "chain":
        return chain(k, jnp.maximum(k - 1.0, 0.0))
    head = jnp.minimum(k, float(max_anchors))
    rest = k - head  # ranks >= M: all have a previous anchor; the last has no next
    dense = head * (head + 1.0) / 2.0 if causal else head * head
    return dense + chain(rest, rest)


def abca_stats(
    zones: Zones,
    inserted_B,
    info: dict,
    *,
    causal: bool,
    handshake: str,
    handshake_steps: int,
    max_anchors: int | None,
    slot_width: int | None = None,
    summaries_per_anchor: int = 1,
) -> dict:
    """Scalars (float32) for logging, unprefixed. `keys_per_query` counts the keys of every pass (stage 1, each
    handshake step, stage 3) per valid query, so that it times 4 * head_dim * heads * valid tokens is the forward
    attention FLOPs; `slot_keys_per_query` is what the packed slots compute (their tiles, masked or not). With
    P summaries per anchor, stages 1 and 2 run P times and each stage-3 row reads P - 1 more keys per anchor."""
    pos = jnp.arange(zones.num_tokens, dtype=jnp.int32)[None]
    live = pos < zones.valid_len[:, None]
    anchors, tokens = live & zones.is_anchor, live & ~zones.is_anchor
    g_lo, g_hi = abca.gather_lo_hi(zones, causal)
    z_lo, z_hi = abca.zone_lo_hi(zones, causal)
    p = summaries_per_anchor
    summary_pairs = _range_pairs(g_lo, g_hi, anchors) + handshake_steps * jnp.sum(
        _handshake_pairs(zones.num_anchors, causal, handshake, max_anchors)
    )
    extra_reads = (p - 1) * jnp.sum(abca.anchors_read(zones, causal)[1].astype(jnp.float32)) if p > 1 else 0.0
    pairs = p * summary_pairs + _range_pairs(z_lo, z_hi, tokens) + extra_reads
    queries = jnp.maximum(jnp.sum(zones.valid_len), 1).astype(jnp.float32)
    out = dict(abca.zone_stats(zones))
    out.update(
        inserted_anchors=jnp.mean(inserted_B.astype(jnp.float32)),
        handshake_overflow=jnp.sum(info.get("handshake_overflow", jnp.zeros(()))).astype(jnp.float32),
        keys_per_query=pairs / queries,
    )
    if "slots_used" in info and slot_width is not None:
        slot_pairs = jnp.sum(info["slots_used"]).astype(jnp.float32) * slot_width * (slot_width + 1)
        out["slot_keys_per_query"] = slot_pairs / queries
    return {k: v.astype(jnp.float32) for k, v in out.items()}

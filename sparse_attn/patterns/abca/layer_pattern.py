"""The Intervals of ABCA's stages 1 (anchor gather) and 3 (zone attention), bidirectional and causal.

Under SPEC §1 every query's keys are one contiguous range, so one `Intervals` per stage describes it:
  stage 1, anchor a_j:        [a_{j-1}, right(a_j)]   causal [a_{j-1}, a_j]   (a_{-1} := a_0 = 0)
  stage 3, interval token t:  [left(t), right(t)]     causal [left(t), t]
Rows of the other kind (and padding) are empty (lo > hi). Both fit `reach = (max_zone, max_zone)` once the zone cap
holds.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparse_attn.patterns.abca.zones import Zones
from sparse_attn.patterns.intervals import Intervals


def _rows(zones: Zones) -> tuple[jax.Array, jax.Array, jax.Array]:
    pos = jnp.arange(zones.num_tokens, dtype=jnp.int32)[None]
    live = pos < zones.valid_len[:, None]
    return pos, live & zones.is_anchor, live & ~zones.is_anchor


def _pattern(lo_BxN, hi_BxN, rows_BxN, zones: Zones, causal: bool, max_zone: int) -> Intervals:
    lo = jnp.where(rows_BxN, lo_BxN, 0)[:, None]
    hi = jnp.where(rows_BxN, hi_BxN, -1)[:, None]
    return Intervals(lo, hi, valid_len=zones.valid_len, causal=causal, reach=(max_zone, max_zone))


def gather_lo_hi(zones: Zones, causal: bool) -> tuple[jax.Array, jax.Array]:
    """(lo, hi) int32[B, N] of stage 1 at anchor rows (undefined elsewhere)."""
    pos = jnp.arange(zones.num_tokens, dtype=jnp.int32)[None]
    lo = jnp.where(zones.prev_anchor >= 0, zones.prev_anchor, pos)
    hi = pos if causal else zones.right
    return lo, hi


def zone_lo_hi(zones: Zones, causal: bool) -> tuple[jax.Array, jax.Array]:
    """(lo, hi) int32[B, N] of stage 3 at interval-token rows (undefined elsewhere)."""
    pos = jnp.arange(zones.num_tokens, dtype=jnp.int32)[None]
    return zones.left, (pos if causal else zones.right)


def gather_intervals(zones: Zones, *, causal: bool, max_zone: int) -> Intervals:
    """Stage 1: anchors attend both zones they bound [causal: the zone before]."""
    _, anchors, _ = _rows(zones)
    lo, hi = gather_lo_hi(zones, causal)
    return _pattern(lo, hi, anchors, zones, causal, max_zone)


def zone_intervals(zones: Zones, *, causal: bool, max_zone: int) -> Intervals:
    """Stage 3: interval tokens attend their zone and its two anchors [causal: left anchor up to themselves]."""
    _, _, tokens = _rows(zones)
    lo, hi = zone_lo_hi(zones, causal)
    return _pattern(lo, hi, tokens, zones, causal, max_zone)


def layer_intervals(zones: Zones, *, causal: bool, max_zone: int) -> Intervals:
    """Stages 1 and 3 in one pattern: anchor rows from stage 1, interval-token rows from stage 3."""
    _, anchors, tokens = _rows(zones)
    glo, ghi = gather_lo_hi(zones, causal)
    zlo, zhi = zone_lo_hi(zones, causal)
    lo = jnp.where(anchors, glo, zlo)
    hi = jnp.where(anchors, ghi, zhi)
    return _pattern(lo, hi, anchors | tokens, zones, causal, max_zone)

"""The Intervals of ABCA's stages 1 (anchor gather) and 3 (zone attention), bidirectional and causal.

Under our reading of the ABCA research document (docs/abca.md) every query's keys are one contiguous range, so one
`Intervals` per stage describes it:
  stage 1, anchor a_j:        [a_{j-1}, right(a_j)]   causal [a_{j-1}, a_j]   (a_{-1} := a_0 = 0)
  stage 3, interval token t:  [left(t), right(t)]     causal [left(t), t]
Rows of the other kind (and padding) are empty (lo > hi). Both fit `reach = (max_zone, max_zone)` once the zone cap
holds.
"""

from __future__ import annotations

import dataclasses

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


def anchors_read(zones: Zones, causal: bool) -> tuple[jax.Array, jax.Array]:
    """(pos int32[B, N, 2], reads bool[B, N, 2]): the anchors an interval token's stage-3 row holds — left(t), and
    right(t) where it is an anchor (bidirectional only) — for the extra anchor summaries (`summaries_per_anchor`).
    Every `pos` is a valid index (padding's -1 clipped to 0); `reads` says which are held."""
    _, _, tokens = _rows(zones)
    lo, hi = zone_lo_hi(zones, causal)
    hi = jnp.broadcast_to(hi, lo.shape)  # causal: hi = t, [1, N]
    pos = jnp.clip(jnp.stack([lo, hi], axis=-1), 0, zones.num_tokens - 1)
    at = jax.vmap(lambda a, i: a[i])(zones.is_anchor, pos)
    reads = at & tokens[..., None] & jnp.stack([jnp.ones_like(lo, bool), hi != lo], axis=-1)
    return pos, reads


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


STAGES = ("gather", "zones", "layer")


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ZonePattern:
    """ABCA's own pattern type: stage 1 ("gather"), stage 3 ("zones") or both ("layer") over `zones`.

    A first-class pattern for `sparse_attn.attention`: `to_dense()` is the oracle ("reference"), "xla" and
    "pallas" run its `intervals()`, and "packed" runs the key-major anchor gather and the zones packed in slots.
    Every query's keys are one contiguous range within `max_zone` of it (the zone cap must hold).
    """

    zones: Zones
    stage: str = dataclasses.field(default="layer", metadata={"static": True})
    causal: bool = dataclasses.field(default=False, metadata={"static": True})
    max_zone: int = dataclasses.field(default=1, metadata={"static": True})

    @property
    def num_tokens(self) -> int:
        return self.zones.num_tokens

    def intervals(self) -> Intervals:
        build = {"gather": gather_intervals, "zones": zone_intervals, "layer": layer_intervals}[self.stage]
        return build(self.zones, causal=self.causal, max_zone=self.max_zone)

    def validate(self, batch: int | None = None, heads: int | None = None) -> ZonePattern:
        if self.stage not in STAGES:
            raise ValueError(f"ZonePattern.stage must be one of {STAGES}, got {self.stage!r}")
        if not isinstance(self.max_zone, int) or self.max_zone < 1:
            raise ValueError(f"ZonePattern.max_zone must be an int >= 1, got {self.max_zone!r}")
        if batch is not None and self.zones.is_anchor.shape[0] != batch:
            raise ValueError(f"ZonePattern.zones has batch {self.zones.is_anchor.shape[0]}, expected {batch}")
        self.intervals().validate(batch, heads)
        return self

    def to_dense(self) -> jax.Array:
        """bool[B, 1, N, N]: the oracle mask."""
        return self.intervals().to_dense()

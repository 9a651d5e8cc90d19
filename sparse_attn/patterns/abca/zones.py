"""ABCA zones (docs/abca.md): left/right anchor of each position, zone ids, the anchor chain, zone statistics."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sparse_attn.patterns.abca.placement import check_valid_len


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class Zones:
    """Zone structure of anchors a_0 = 0 < a_1 < ... < a_{k-1} < valid_len; -1 marks "none" (and padding).

    Attributes:
      is_anchor: bool[B, N] (False on padding).
      valid_len: int32[B].
      left: int32[B, N] nearest anchor <= t.
      right: int32[B, N] nearest anchor > t, else the last valid position (it closes the last zone).
      zone_id: int32[B, N] index j of left(t) (= the anchor's rank at anchors).
      prev_anchor, next_anchor: int32[B, N] at anchors: the previous / next anchor of the chain (-1 if none);
        -1 at non-anchors.
      num_anchors: int32[B] k.
    """

    is_anchor: jax.Array
    valid_len: jax.Array
    left: jax.Array
    right: jax.Array
    zone_id: jax.Array
    prev_anchor: jax.Array
    next_anchor: jax.Array
    num_anchors: jax.Array

    @property
    def num_tokens(self) -> int:
        return self.is_anchor.shape[1]


def compute_zones(is_anchor_BxN: jax.Array, valid_len_B=None) -> Zones:
    """Zones from an anchor mask whose position 0 is an anchor (see `enforce_zone_cap`)."""
    if is_anchor_BxN.ndim != 2 or is_anchor_BxN.dtype != jnp.bool_:
        raise ValueError(f"is_anchor must be bool[B, N], got {is_anchor_BxN.dtype}{is_anchor_BxN.shape}")
    b, n = is_anchor_BxN.shape
    vl = check_valid_len(valid_len_B, b, n)
    pos = jnp.arange(n, dtype=jnp.int32)[None]
    live = pos < vl[:, None]
    anchor = is_anchor_BxN & live
    left = jax.lax.cummax(jnp.where(anchor, pos, -1), axis=1)
    # Smallest anchor strictly after t: a reverse running minimum, shifted by one.
    at_or_after = jax.lax.cummin(jnp.where(anchor, pos, n), axis=1, reverse=True)
    after = jnp.concatenate([at_or_after[:, 1:], jnp.full((b, 1), n, jnp.int32)], axis=1)
    right = jnp.where(after < n, after, vl[:, None] - 1)
    zone_id = jnp.cumsum(anchor, axis=1, dtype=jnp.int32) - 1
    before = jnp.concatenate([jnp.full((b, 1), -1, jnp.int32), left[:, :-1]], axis=1)
    none = jnp.int32(-1)
    return Zones(
        is_anchor=anchor,
        valid_len=vl,
        left=jnp.where(live, left, none),
        right=jnp.where(live, right, none),
        zone_id=jnp.where(live, zone_id, none),
        prev_anchor=jnp.where(anchor, before, none),
        next_anchor=jnp.where(anchor & (after < n), after, none),
        num_anchors=jnp.sum(anchor, axis=1, dtype=jnp.int32),
    )


def zone_sizes(zones: Zones) -> jax.Array:
    """int32[B, N]: at each anchor a_j the size of its zone a_{j+1} - a_j (the last: valid_len - a_{k-1}); else 0.

    Sizes count the left anchor and the interval tokens, so they sum to valid_len (n = k * m).
    """
    pos = jnp.arange(zones.num_tokens, dtype=jnp.int32)[None]
    end = jnp.where(zones.next_anchor >= 0, zones.next_anchor, zones.valid_len[:, None])
    return jnp.where(zones.is_anchor, end - pos, 0)


def zone_stats(zones: Zones) -> dict[str, jax.Array]:
    """Scalars: mean anchors per sequence (k), mean and max zone size."""
    k = zones.num_anchors.astype(jnp.float32)
    total = jnp.sum(zones.valid_len).astype(jnp.float32)
    return {
        "anchors": jnp.mean(k),
        "mean_zone": total / jnp.maximum(jnp.sum(k), 1.0),
        "max_zone": jnp.max(zone_sizes(zones)),
    }

"""ABCA anchor placement (docs/abca.md): explicit, fixed interval, learned; zone cap with fallback anchors.

Every function is pure and jit-able and returns or consumes `is_anchor: bool[B, N]`. Padding (positions at or after
`valid_len`) never holds an anchor; position 0 is always an anchor of a non-empty sequence.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np

from sparse_attn.patterns import common


def _check_bn(name: str, x, dtype_kind: str | None = None) -> None:
    if jnp.ndim(x) != 2:
        raise ValueError(f"{name} must be [B, N], got shape {jnp.shape(x)}")
    if dtype_kind == "bool" and jnp.asarray(x).dtype != jnp.bool_:
        raise ValueError(f"{name} must be bool, got {jnp.asarray(x).dtype}")
    if dtype_kind == "int":
        common.check_int(name, x, 2)


def check_valid_len(valid_len_B, batch: int, n: int) -> jax.Array:
    """int32[B]; None means every position is valid."""
    if valid_len_B is None:
        return jnp.full((batch,), n, jnp.int32)
    common.check_int("valid_len", valid_len_B, 1)
    if valid_len_B.shape[0] != batch:
        raise ValueError(f"valid_len has {valid_len_B.shape[0]} entries for a batch of {batch}")
    if common.is_concrete(valid_len_B):
        vl = common.host(valid_len_B)
        if np.any((vl < 0) | (vl > n)):
            raise ValueError(f"valid_len must lie in [0, {n}], got {vl}")
    return jnp.asarray(valid_len_B, jnp.int32)


def explicit_anchors(
    mask_BxN=None, *, tokens_BxN=None, anchor_id: int | None = None, vocab_size: int | None = None
) -> jax.Array:
    """Anchors from a user mask, or where `tokens == anchor_id` (anchor tokens in the vocabulary)."""
    if (mask_BxN is None) == (tokens_BxN is None):
        raise ValueError("explicit_anchors takes exactly one of a mask or tokens")
    if mask_BxN is not None:
        _check_bn("anchor mask", mask_BxN, "bool")
        return jnp.asarray(mask_BxN)
    _check_bn("tokens", tokens_BxN, "int")
    if anchor_id is None:
        raise ValueError("explicit_anchors(tokens=...) needs anchor_id")
    if vocab_size is not None and not 0 <= anchor_id < vocab_size:
        raise ValueError(f"anchor_id {anchor_id} lies outside the vocabulary [0, {vocab_size})")
    return tokens_BxN == anchor_id


def fixed_interval_anchors(batch: int, length: int, interval: int) -> jax.Array:
    """Every `interval`-th position, starting at 0 (the fallback placement)."""
    if interval < 1:
        raise ValueError(f"anchor interval must be >= 1, got {interval}")
    pos = jnp.arange(length, dtype=jnp.int32)
    return jnp.broadcast_to(pos % interval == 0, (batch, length))


def learned_anchors(scores_BxN: jax.Array) -> jax.Array:
    """Anchor wherever the anchor-score head is positive."""
    _check_bn("anchor scores", scores_BxN)
    return scores_BxN > 0


def placement_loss(scores_BxN: jax.Array, target_BxN: jax.Array, valid_len_B: jax.Array) -> jax.Array:
    """Binary cross-entropy of the anchor logits against a target boundary mask, mean over valid positions."""
    if scores_BxN.shape != target_BxN.shape:
        raise ValueError(f"placement scores {scores_BxN.shape} and target {target_BxN.shape} differ in shape")
    s = scores_BxN.astype(jnp.float32)
    y = target_BxN.astype(jnp.float32)
    per_token = jnp.maximum(s, 0.0) - s * y + jnp.log1p(jnp.exp(-jnp.abs(s)))  # stable BCE with logits
    live = jnp.arange(s.shape[1])[None] < valid_len_B[:, None]
    return jnp.sum(jnp.where(live, per_token, 0.0)) / jnp.maximum(jnp.sum(live), 1)


def straight_through_gate(scores_BxN: jax.Array, is_anchor_BxN: jax.Array) -> jax.Array:
    """float32[B, N]: the hard decision (1.0 at anchors) in the forward pass, d sigmoid(score) in the backward pass."""
    soft = jax.nn.sigmoid(scores_BxN.astype(jnp.float32))
    return is_anchor_BxN.astype(jnp.float32) + soft - jax.lax.stop_gradient(soft)


def enforce_zone_cap(is_anchor_BxN: jax.Array, valid_len_B, max_zone: int) -> tuple[jax.Array, jax.Array]:
    """Forces position 0 and inserts fallback anchors so that consecutive anchors lie at most `max_zone` apart.

    Fallbacks sit at `a + max_zone, a + 2 max_zone, ...` after each placed anchor `a` (the greedy left-to-right
    rule); each depends only on earlier positions, so the rule is causal.

    Returns:
      (is_anchor bool[B, N], inserted int32[B]): inserted counts anchors the placement did not produce
      (position 0 included when it was missing).
    """
    if not isinstance(max_zone, (int, np.integer)) or max_zone < 1:
        raise ValueError(f"max_zone must be an int >= 1, got {max_zone!r}")
    _check_bn("is_anchor", is_anchor_BxN, "bool")
    b, n = is_anchor_BxN.shape
    valid_len_B = check_valid_len(valid_len_B, b, n)
    pos = jnp.arange(n, dtype=jnp.int32)[None]
    live = pos < valid_len_B[:, None]
    placed = is_anchor_BxN & live
    placed = placed | ((pos == 0) & live)
    last_placed = jax.lax.cummax(jnp.where(placed, pos, 0), axis=1)
    fallback = live & ~placed & ((pos - last_placed) % max_zone == 0)
    anchors = placed | fallback
    inserted = jnp.sum(anchors & ~(is_anchor_BxN & live), axis=1, dtype=jnp.int32)
    return anchors, inserted

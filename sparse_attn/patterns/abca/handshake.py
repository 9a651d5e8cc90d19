"""ABCA boundary-handshake patterns over anchors (docs/abca.md, stage 2), as neighbour lists in position space.

chain:  anchor a_j attends {a_{j-1}, a_j, a_{j+1}}   [causal: {a_{j-1}, a_j}]   (K = 3)
global: anchor a_j attends every anchor              [causal: a_0..a_j]         (K = max_anchors, static)
Global overflow (k > max_anchors) is detected and reported; the anchors beyond the capacity keep the chain handshake
(they are never left without one), and the first max_anchors anchors see each other only.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparse_attn.patterns.abca.zones import Zones
from sparse_attn.patterns.neighbours import NeighbourList


def _chain_rows(zones: Zones, causal: bool) -> tuple[jax.Array, jax.Array]:
    pos = jnp.arange(zones.num_tokens, dtype=jnp.int32)[None]
    idx = jnp.stack([zones.prev_anchor, pos + 0 * zones.prev_anchor, zones.next_anchor], axis=-1)
    ok = jnp.stack([zones.prev_anchor >= 0, zones.is_anchor, (zones.next_anchor >= 0) & (not causal)], axis=-1)
    ok = ok & zones.is_anchor[..., None]
    return jnp.where(ok, idx, _own_row(zones, idx.shape[-1])), ok


def _own_row(zones: Zones, k: int) -> jax.Array:
    """[B, N, K]: each row's own position, the index of its unused slots. Any in-range index is correct there, but
    a gather executor's backward pass scatter-adds every slot: position 0 for all of them made the K (N - k) slots
    of the empty rows collide on one row (atomic adds on a GPU), the own row collides K ways at most."""
    pos = jnp.arange(zones.num_tokens, dtype=jnp.int32)[None, :, None]
    return jnp.broadcast_to(pos, zones.is_anchor.shape + (k,))


def chain_handshake(zones: Zones, *, causal: bool) -> NeighbourList:
    """NeighbourList idx/valid [B, 1, N, 3]: slots (previous, self, next) at anchor rows; other rows empty."""
    idx, ok = _chain_rows(zones, causal)
    return NeighbourList(idx[:, None], ok[:, None])


def anchor_positions(zones: Zones, capacity: int) -> jax.Array:
    """int32[B, capacity]: anchor positions in order, padded with N."""
    n = zones.num_tokens
    rows = jax.vmap(lambda m: jnp.nonzero(m, size=capacity, fill_value=n)[0])(zones.is_anchor)
    return rows.astype(jnp.int32)


def global_handshake(zones: Zones, *, max_anchors: int, causal: bool) -> tuple[NeighbourList, jax.Array]:
    """Anchors x anchors with a static capacity.

    Returns:
      (NeighbourList [B, 1, N, max(max_anchors, 3)], overflow int32[B] = max(k - max_anchors, 0)).
    """
    if max_anchors < 1:
        raise ValueError(f"max_anchors must be >= 1, got {max_anchors}")
    width = max(max_anchors, 3)
    anc = anchor_positions(zones, max_anchors)  # [B, M]
    slot = jnp.arange(max_anchors, dtype=jnp.int32)
    rank = zones.zone_id[..., None]  # [B, N, 1]
    ok = (slot[None, None] < zones.num_anchors[:, None, None]) & zones.is_anchor[..., None]
    if causal:
        ok = ok & (slot[None, None] <= rank)
    idx = jnp.broadcast_to(anc[:, None], ok.shape)
    pad = width - max_anchors
    idx = jnp.pad(idx, ((0, 0), (0, 0), (0, pad)))
    ok = jnp.pad(ok, ((0, 0), (0, 0), (0, pad)))
    over = rank >= max_anchors  # these anchors are not among the M slots: keep the chain handshake
    cidx, cok = _chain_rows(zones, causal)
    cidx = jnp.pad(cidx, ((0, 0), (0, 0), (0, width - 3)))
    cok = jnp.pad(cok, ((0, 0), (0, 0), (0, width - 3)))
    ok = jnp.where(over, cok, ok)
    idx = jnp.where(ok, jnp.where(over, cidx, idx), _own_row(zones, width))
    overflow = jnp.maximum(zones.num_anchors - max_anchors, 0)
    return NeighbourList(idx[:, None], ok[:, None]), overflow

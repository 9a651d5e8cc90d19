"""Executors of ABCA's `ZonePattern`: "packed" (anchor gather key-major, zones in slots), "xla" and "pallas" (its
`intervals()` through the generic executors), "reference" (the registry's oracle). See docs/abca.md.

Files: `anchors.py` (key-major anchor gather, anchor projections, paged rank-space handshake), `packed.py` (zones
packed into slots).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sparse_attn.executors import registry
from sparse_attn.executors.abca import packed as abca_packed
from sparse_attn.executors.abca.anchors import anchor_gather, gather_roles
from sparse_attn.patterns.abca.layer_pattern import ZonePattern, zone_lo_hi
from sparse_attn.patterns.intervals import Intervals


def slot_chunk(batch_heads: int, slot_width: int) -> int:
    """Slots per scan step: about one 256 x 257 x 4-head score tile. Re-measured on the head-major executor (the
    core's jitted fwd+bwd with this function patched to a constant, median of 10 calls): n=4096, H=4: 1 slot
    75-77 ms, 2: 71, 4: 74; n=16384, H=1: 1: 87, 2: 70, 4: 78-117, 8: 108 -- within this machine's run-to-run noise
    except for 8, so the rule stays."""
    return max(1, (256 * 257 * 4) // (batch_heads * slot_width * (slot_width + 1)))


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class PackedMeta:
    """What `prepare_packed` builds from a `ZonePattern` alone (None for the stage that does not run).

    roles: int32[R, B, N] stage 1's readers of each key (`anchors.gather_roles`).
    lo, hi: int32[B, N] stage 3's key range of each interval token (empty elsewhere).
    slots: the slot layout of stage 3.
    """

    roles: jax.Array | None
    lo: jax.Array | None
    hi: jax.Array | None
    slots: abca_packed.SlotLayout | None


def prepare_packed(pattern: ZonePattern, *, head_dim=None, slot_width=None) -> PackedMeta:
    """The "packed" executor's metadata: anchor roles (stage 1) and the zones' slot layout (stage 3)."""
    del head_dim  # nothing here depends on it
    zones = pattern.zones
    width = _slot_width(pattern, slot_width)
    roles = lo = hi = slots = None
    if pattern.stage in ("gather", "layer"):
        roles = jnp.stack(gather_roles(zones, pattern.causal))
    if pattern.stage in ("zones", "layer"):
        zlo, zhi = zone_lo_hi(zones, pattern.causal)
        rows = ~zones.is_anchor & (zones.left >= 0)
        lo, hi = jnp.where(rows, zlo, 0), jnp.where(rows, zhi, -1)
        slots = abca_packed.slot_layout(zones.left, zones.valid_len, width)
    return PackedMeta(roles, lo, hi, slots)


def _slot_width(pattern: ZonePattern, slot_width) -> int:
    width = slot_width or pattern.max_zone
    if width < pattern.max_zone:
        raise ValueError(f"slot_width ({width}) must be >= max_zone ({pattern.max_zone})")
    return width


def packed_attention(
    q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern: ZonePattern, *, scale: float, slot_width=None, prepared=None
):
    """The "packed" executor: anchor rows by the key-major gather (stage 1), interval-token rows by zones packed
    into slots of `slot_width` queries (default `max_zone`; stage 3). `prepared`: `prepare_packed`'s metadata
    (None: built here). Returns (out [B, N, H, D], lse [B, N, H])."""
    zones = pattern.zones
    width = _slot_width(pattern, slot_width)
    meta = prepared if prepared is not None else prepare_packed(pattern, slot_width=slot_width)
    parts = []
    if pattern.stage in ("gather", "layer"):
        parts.append(
            anchor_gather(
                q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, zones, scale, causal=pattern.causal, roles=list(meta.roles)
            )
        )
    if pattern.stage in ("zones", "layer"):
        b, _, h, _ = q_BxNxHxD.shape
        parts.append(
            abca_packed.packed_zone_attention(
                q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, meta.lo, meta.hi, meta.slots, scale, chunk=slot_chunk(b * h, width)
            )
        )
    if len(parts) == 1:
        return parts[0]
    (s, s_lse), (o, o_lse) = parts
    anchor = zones.is_anchor[..., None]
    return jnp.where(anchor[..., None], s, o), jnp.where(anchor, s_lse, o_lse)


def _via_intervals(name: str):
    """(executor, prepare) running a ZonePattern as its `intervals()` through the Intervals executor `name`."""

    def run(q, k, v, pattern: ZonePattern, *, scale, prepared=None, **options):
        if prepared is not None:
            options["prepared"] = prepared
        return registry.lookup(Intervals, name)(q, k, v, pattern.intervals(), scale=scale, **options)

    def prepare(pattern: ZonePattern, *, head_dim=None, **options):
        fn = registry.preparer(Intervals, name)
        return None if fn is None else fn(pattern.intervals(), head_dim=head_dim, **options)

    run.__name__ = f"zone_pattern_{name}"
    return dict(fn=run, prepare=prepare)


registry.register_executor(
    ZonePattern, "packed", packed_attention, default_on=("cpu", "gpu", "tpu"), prepare=prepare_packed
)
registry.register_executor(ZonePattern, "xla", **_via_intervals("xla"), scores=True)
registry.register_executor(ZonePattern, "pallas", **_via_intervals("pallas"), scores=True)

"""Executors of ABCA's `ZonePattern`: "packed" (anchor gather key-major, zones in slots), "xla" and "pallas" (its
`intervals()` through the generic executors), "reference" (the registry's oracle). See docs/abca.md.

Files: `anchors.py` (key-major anchor gather, anchor projections, paged rank-space handshake), `packed.py` (zones
packed into slots).
"""

from __future__ import annotations

import jax.numpy as jnp

from sparse_attn.executors import registry
from sparse_attn.executors.abca import packed as abca_packed
from sparse_attn.executors.abca.anchors import anchor_gather
from sparse_attn.patterns.abca.layer_pattern import ZonePattern, zone_lo_hi
from sparse_attn.patterns.intervals import Intervals


def slot_chunk(batch_heads: int, slot_width: int) -> int:
    """Slots per scan step: about one 256 x 257 x 4-head score tile. Re-measured on the head-major executor (the
    core's jitted fwd+bwd with this function patched to a constant, median of 10 calls): n=4096, H=4: 1 slot
    75-77 ms, 2: 71, 4: 74; n=16384, H=1: 1: 87, 2: 70, 4: 78-117, 8: 108 -- within this machine's run-to-run noise
    except for 8, so the rule stays."""
    return max(1, (256 * 257 * 4) // (batch_heads * slot_width * (slot_width + 1)))


def packed_attention(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern: ZonePattern, *, scale: float, slot_width=None):
    """The "packed" executor: anchor rows by the key-major gather (stage 1), interval-token rows by zones packed
    into slots of `slot_width` queries (default `max_zone`; stage 3). Returns (out [B, N, H, D], lse [B, N, H])."""
    zones = pattern.zones
    width = slot_width or pattern.max_zone
    if width < pattern.max_zone:
        raise ValueError(f"slot_width ({width}) must be >= max_zone ({pattern.max_zone})")
    parts = []
    if pattern.stage in ("gather", "layer"):
        parts.append(anchor_gather(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, zones, scale, causal=pattern.causal))
    if pattern.stage in ("zones", "layer"):
        zlo, zhi = zone_lo_hi(zones, pattern.causal)
        rows = ~zones.is_anchor & (zones.left >= 0)
        layout = abca_packed.slot_layout(zones.left, zones.valid_len, width)
        b, _, h, _ = q_BxNxHxD.shape
        parts.append(
            abca_packed.packed_zone_attention(
                q_BxNxHxD,
                k_BxNxGxD,
                v_BxNxGxD,
                jnp.where(rows, zlo, 0),
                jnp.where(rows, zhi, -1),
                layout,
                scale,
                chunk=slot_chunk(b * h, width),
            )
        )
    if len(parts) == 1:
        return parts[0]
    (s, s_lse), (o, o_lse) = parts
    anchor = zones.is_anchor[..., None]
    return jnp.where(anchor[..., None], s, o), jnp.where(anchor, s_lse, o_lse)


def _via_intervals(name: str):
    def run(q, k, v, pattern: ZonePattern, *, scale, **options):
        return registry.lookup(Intervals, name)(q, k, v, pattern.intervals(), scale=scale, **options)

    run.__name__ = f"zone_pattern_{name}"
    return run


registry.register_executor(ZonePattern, "packed", packed_attention, default_on=("cpu", "gpu", "tpu"))
registry.register_executor(ZonePattern, "xla", _via_intervals("xla"))
registry.register_executor(ZonePattern, "pallas", _via_intervals("pallas"))

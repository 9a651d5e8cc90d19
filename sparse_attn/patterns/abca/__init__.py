"""ABCA (docs/abca.md): anchor placement, zones, the Intervals of stages 1 and 3, handshake patterns. Pure, jit-able."""

from sparse_attn.patterns.abca.handshake import anchor_positions, chain_handshake, global_handshake
from sparse_attn.patterns.abca.layer_pattern import (
    ZonePattern,
    anchors_read,
    gather_intervals,
    gather_lo_hi,
    layer_intervals,
    zone_intervals,
    zone_lo_hi,
)
from sparse_attn.patterns.abca.placement import (
    enforce_zone_cap,
    explicit_anchors,
    fixed_interval_anchors,
    learned_anchors,
    placement_loss,
    straight_through_gate,
)
from sparse_attn.patterns.abca.zones import Zones, compute_zones, zone_sizes, zone_stats

__all__ = [
    "ZonePattern",
    "Zones",
    "anchor_positions",
    "anchors_read",
    "chain_handshake",
    "compute_zones",
    "enforce_zone_cap",
    "explicit_anchors",
    "fixed_interval_anchors",
    "gather_intervals",
    "gather_lo_hi",
    "global_handshake",
    "layer_intervals",
    "learned_anchors",
    "placement_loss",
    "straight_through_gate",
    "zone_intervals",
    "zone_lo_hi",
    "zone_sizes",
    "zone_stats",
]

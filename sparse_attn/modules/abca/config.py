"""The frozen config of ABCA attention; `make(model_dim, num_heads, rngs=...)` builds the NNX module."""

from __future__ import annotations

import dataclasses

from flax import nnx

from sparse_attn.modules.abca.core import IMPLEMENTATIONS

PLACEMENTS = ("explicit", "fixed", "learned")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AnchorAttentionConfig:
    """ABCA (SPEC §1) for one layer.

    Attributes:
      placement: "explicit" (anchors where `ctx.tokens == anchor_id`, or an `anchor_mask` passed to the call),
        "fixed" (every `interval`-th position), or "learned" (a score head; anchor iff score > 0).
      max_zone: static zone cap; fallback anchors are inserted where anchors lie further apart.
      handshake: "chain" (prev/self/next anchor) or "global" (all anchors, first `max_anchors`).
      handshake_steps: handshake passes before zone attention (>= 1).
      max_anchors: the global handshake's dense head (anchors past it keep the chain, reported as overflow), and
        the handshake page of the "xla" core (default 4 ceil(n / max_zone)); more anchors take more pages (exact).
      boundary_ids: learned placement's BCE target: positions whose token is one of these.
      placement_loss_weight: weight of that loss in `aux_losses`.
      straight_through: learned placement also gets gradients through the anchor decisions (ST estimator).
      implementation: "xla" (packed; default), "xla_blocks" or "pallas" (the three stages as position-space
        patterns through the block-gather XLA executor or the Pallas kernels), or "reference" (dense oracle).
      slot_width: queries per slot of the packed executor (default max_zone).
      num_kv_heads: KV heads (grouped-query attention; default num_heads). Anchor states stay per query head; an
        anchor's zone key/value for a group re-projects its heads' states.
    """

    placement: str = "fixed"
    interval: int = 64
    anchor_id: int | None = None
    vocab_size: int | None = None
    max_zone: int = 128
    handshake: str = "chain"
    handshake_steps: int = 1
    max_anchors: int | None = None
    boundary_ids: tuple[int, ...] = ()
    placement_loss_weight: float = 0.1
    straight_through: bool = False
    score_bias_init: float = -2.0
    implementation: str = "xla"
    slot_width: int | None = None
    rope_base: float | None = 10_000.0
    num_kv_heads: int | None = None

    def __post_init__(self):
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.max_zone < 1:
            raise ValueError(f"max_zone must be >= 1, got {self.max_zone}")
        if self.placement == "fixed" and self.interval < 1:
            raise ValueError(f"interval must be >= 1, got {self.interval}")
        if self.anchor_id is not None and self.vocab_size is not None and not 0 <= self.anchor_id < self.vocab_size:
            raise ValueError(f"anchor_id {self.anchor_id} lies outside the vocabulary [0, {self.vocab_size})")
        if self.handshake not in ("chain", "global"):
            raise ValueError(f"handshake must be 'chain' or 'global', got {self.handshake!r}")
        if self.handshake_steps < 1:
            raise ValueError(f"handshake_steps must be >= 1, got {self.handshake_steps}")
        if self.handshake == "global" and self.max_anchors is None:
            raise ValueError("handshake='global' needs max_anchors >= 1")
        if self.max_anchors is not None and self.max_anchors < 1:
            raise ValueError(f"max_anchors must be >= 1, got {self.max_anchors}")
        if self.implementation not in IMPLEMENTATIONS:
            raise ValueError(f"implementation must be one of {IMPLEMENTATIONS}, got {self.implementation!r}")
        if self.slot_width is not None and self.slot_width < self.max_zone:
            raise ValueError(f"slot_width ({self.slot_width}) must be >= max_zone ({self.max_zone})")

    def make(self, model_dim: int, num_heads: int, *, rngs: nnx.Rngs):
        from sparse_attn.modules.abca.module import AnchorAttention

        return AnchorAttention(self, model_dim, num_heads, rngs=rngs)

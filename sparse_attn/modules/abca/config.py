"""The frozen config of ABCA attention; `make(model_dim, num_heads, rngs=...)` builds the NNX module."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from flax import nnx

from sparse_attn.modules.abca.core import check_options
from sparse_attn.modules.base import build_module

PLACEMENTS = ("explicit", "fixed", "learned")


@dataclasses.dataclass(frozen=True, kw_only=True)
class AnchorAttentionConfig:
    """ABCA (docs/abca.md) for one layer.

    Attributes:
      placement: "explicit" (anchors where `ctx.tokens == anchor_id`, or an `anchor_mask` passed to the call),
        "fixed" (every `interval`-th position), or "learned" (a score head; anchor iff score > 0).
      max_zone: static zone cap; fallback anchors are inserted where anchors lie further apart.
      handshake: "chain" (prev/self/next anchor) or "global" (all anchors, first `max_anchors`).
      handshake_steps: handshake passes before zone attention (>= 1).
      max_anchors: the global handshake's dense head (anchors past it keep the chain, reported as overflow), and
        the handshake page of the "packed" core (default 4 ceil(n / max_zone)); more anchors take more pages (exact).
      boundary_ids: learned placement's BCE target: positions whose token is one of these.
      placement_loss_weight: weight of that loss in `aux_losses`.
      straight_through: learned placement also gets gradients from the task loss through the anchor decisions (ST
        estimator). On by default: without `boundary_ids` it is the score head's only training signal
        (docs/abca.md, "Placement and the zone cap", measured on a toy task).
      implementation: None (the platform default: "packed"), "packed" (anchor gather key-major, zones in slots),
        "xla" or "pallas" (stages 1 and 3 as Intervals through the block-gather XLA executor or the Pallas
        kernels), or "reference" (dense oracle): the executors registered for `patterns.abca.ZonePattern`.
      slot_width: queries per slot of the packed executor (default max_zone).
      num_kv_heads: KV heads (grouped-query attention; default num_heads). Anchor states stay per query head; an
        anchor's zone key/value for a group re-projects its heads' states.
      summaries_per_anchor: P, pooled writes (issue 37, docs/abca.md "Pooled writes"): 1 = the seed's one state per
        anchor; P > 1 adds P - 1 summaries, each gathering with its own query map and read by zone queries as one
        more key per anchor. The incremental decoder and the diagnostics run every P.
    """

    mechanism: ClassVar[str] = "abca"

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
    straight_through: bool = True
    score_bias_init: float = -2.0
    implementation: str | None = None
    slot_width: int | None = None
    rope_base: float | None = 10_000.0
    num_kv_heads: int | None = None
    summaries_per_anchor: int = 1

    def __post_init__(self):
        if self.placement not in PLACEMENTS:
            raise ValueError(f"placement must be one of {PLACEMENTS}, got {self.placement!r}")
        if self.placement == "fixed" and self.interval < 1:
            raise ValueError(f"interval must be >= 1, got {self.interval}")
        if self.summaries_per_anchor < 1:
            raise ValueError(f"summaries_per_anchor must be >= 1, got {self.summaries_per_anchor}")
        if self.anchor_id is not None and self.vocab_size is not None and not 0 <= self.anchor_id < self.vocab_size:
            raise ValueError(f"anchor_id {self.anchor_id} lies outside the vocabulary [0, {self.vocab_size})")
        check_options(
            max_zone=self.max_zone,
            handshake=self.handshake,
            handshake_steps=self.handshake_steps,
            max_anchors=self.max_anchors,
            implementation=self.implementation,
            slot_width=self.slot_width,
        )

    def make(self, model_dim: int, num_heads: int, *, rngs: nnx.Rngs) -> nnx.Module:
        """The `AnchorAttention` layer (registered by its module file)."""
        return build_module(self, model_dim, num_heads, rngs=rngs)

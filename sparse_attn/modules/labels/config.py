"""Frozen configuration of label-intersection attention (one per layer)."""

from __future__ import annotations

import dataclasses

from flax import nnx

from sparse_attn.modules.labels.attention import LabelAttention
from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels import schedule

PHASE_CHOICES = ("schedule", "soft", "straight_through", "hard")
BALANCE_CHOICES = ("cv2", "switch", "none")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LabelAttentionConfig:
    """Label attention: H = window(radius) ∪ landmarks(every landmark_every) ∪ self, filtered by shared labels.

    Phase: "schedule" follows the step (soft for `soft_steps`, straight-through for `straight_through_steps`, then
    hard); "soft" / "straight_through" / "hard" pin it (e.g. "hard" for inference and benchmarks).
    Temperature: τ anneals geometrically tau_start -> tau_end over `anneal_steps`.
    Losses (already weighted in the output): sparsity_weight · mean(p), balance_weight · (CV² or Switch),
    z_loss_weight · router z-loss.
    """

    num_labels: int = 32
    top_k: int = 2
    radius: int = 64
    landmark_every: int = 0
    router_hidden: int = 64
    per_head_labels: bool = False
    phase: str = "schedule"
    soft_steps: int = 1000
    straight_through_steps: int = 500
    tau_start: float = 1.0
    tau_end: float = 0.1
    anneal_steps: int = 1000
    eps: float = 1e-6
    sparsity_weight: float = 1e-3
    balance: str = "cv2"
    balance_weight: float = 1e-2
    z_loss_weight: float = 0.0
    block: int = 128
    reach_factor: float = 1.25
    soft_block: int = 64
    num_kv_heads: int | None = None
    rope_base: float | None = 10_000.0

    def __post_init__(self):
        bits_lib.check_labels(self.num_labels, self.top_k)
        if self.phase not in PHASE_CHOICES:
            raise ValueError(f"phase must be one of {PHASE_CHOICES}, got {self.phase!r}")
        if self.balance not in BALANCE_CHOICES:
            raise ValueError(f"balance must be one of {BALANCE_CHOICES}, got {self.balance!r}")
        if self.radius < 0 or self.landmark_every < 0 or self.router_hidden < 1:
            raise ValueError("radius and landmark_every must be >= 0 and router_hidden >= 1")
        if self.block < 1 or self.soft_block < 1 or self.reach_factor <= 0 or not 0 < self.eps < 1:
            raise ValueError("block, soft_block >= 1, reach_factor > 0 and 0 < eps < 1 required")
        schedule.temperature(0, tau_start=self.tau_start, tau_end=self.tau_end, anneal_steps=self.anneal_steps)
        schedule.phase(0, soft_steps=self.soft_steps, straight_through_steps=self.straight_through_steps)

    def make(self, model_dim: int, num_heads: int, *, rngs: nnx.Rngs):
        return LabelAttention(self, model_dim, num_heads, rngs=rngs)

"""Frozen configuration of label-intersection attention (one per layer), validated once here."""

from __future__ import annotations

import dataclasses
from typing import ClassVar

from flax import nnx

from sparse_attn.attention import available_implementations
from sparse_attn.modules.base import build_module
from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels import position, schedule
from sparse_attn.patterns.labels.pattern import LabelPattern

PHASE_CHOICES = ("schedule", "soft", "straight_through", "hard")
BALANCE_CHOICES = ("cv2", "switch", "none")
MEMBERSHIP_CHOICES = ("centred", "sigmoid")


@dataclasses.dataclass(frozen=True, kw_only=True)
class LabelAttentionConfig:
    """Label attention: H = window(radius) ∪ landmarks(every landmark_every) ∪ self, filtered by shared labels.

    Defaults and the measurements behind them: docs/labels.md ("Defaults").
    Phase: "schedule" follows the step through soft -> ramp -> straight-through -> hard, each phase a fraction of
    the run (`soft_frac`, `ramp_frac`, `straight_through_frac`; the rest is hard) of `num_steps` steps. With
    `num_steps=None` the train loop sets the run's length (`LabelAttention.fit_schedule`). "soft" /
    "straight_through" / "hard" pin the phase.
    Temperature: τ anneals geometrically tau_start -> tau_end over the first `anneal_frac` of the run.
    Absolute schedule: `soft_steps` or `straight_through_steps` given fixes every phase length in steps instead
    (`ramp_steps` default 0, `anneal_steps` default `soft_steps`), whatever the run's length.
    Memberships: "centred" σ((R - θ)/τ) with θ between the k-th and (k+1)-th logit (tends to the top-k labels the
    hard phase uses), or "sigmoid" σ(R/τ).
    ramp_thinning: in the ramp, each edge the hard pattern drops takes part with probability 1 - α (drawn afresh
    every step), besides being down-weighted; False: down-weighted only (the ramp before the thinning).
    freeze_router_when_hard: no gradient to the router in the hard phase, from the router losses either (its top-k
    gets none from the task there); False: the router losses keep moving it.
    router_input_gradient: True (the seed's) = the router's gradients, from the task and from its losses, flow on
    into the residual stream it reads; False = the router reads stop_gradient(x): it still learns, but it moves no
    representation (issue 37's diagnosis of the LM loss, docs/labels.md).
    landmark_every: landmark stride; None = `radius` (about one landmark per window), 0 = no landmarks.
    position_cell: 0 = the seed's pattern; an even c >= 2 adds two position labels per token (its cell in two grids
    of c positions offset by c/2, `patterns.labels.position`), so every pair closer than c/2 is kept whatever the
    router says (the near neighbours a byte LM needs most; docs/labels.md, "Position labels").
    Losses (already weighted in the output): sparsity_weight · mean(p), balance_weight · (CV² or Switch),
    z_loss_weight · router z-loss.
    Capacity (the "bucketed" hard executor): `reach` key entries read on each side of a block of `block` bucket
    entries — the planned band, tier 0; None: `reach_factor` x the balanced buckets' expectation + 4σ
    (`default_reach`). Batches that need more run a wider exact tier (`reach_tier` > 0); `calibrate_reach` sets a
    trained model's layers from the reach its batches needed.
    implementation: the hard phase's executor for its `LabelPattern` (None: the platform's default, "bucketed";
    "reference" is the dense oracle; "xla" / "pallas" run only without landmarks).
    """

    mechanism: ClassVar[str] = "labels"  # statistics are filed as "layer{i}/labels/{key}" by the model

    num_labels: int = 32
    top_k: int = 2
    radius: int = 64
    landmark_every: int | None = None
    position_cell: int = 0
    router_hidden: int = 64
    per_head_labels: bool = False
    phase: str = "schedule"
    membership: str = "centred"
    ramp_thinning: bool = True
    freeze_router_when_hard: bool = True
    router_input_gradient: bool = True
    num_steps: int | None = None
    soft_frac: float = 0.3
    ramp_frac: float = 0.2
    straight_through_frac: float = 0.3
    anneal_frac: float = 0.3
    soft_steps: int | None = None
    ramp_steps: int | None = None
    straight_through_steps: int | None = None
    anneal_steps: int | None = None
    tau_start: float = 1.0
    tau_end: float = 0.1
    eps: float = 1e-6
    sparsity_weight: float = 1e-3
    balance: str = "cv2"
    balance_weight: float = 1e-2
    z_loss_weight: float = 0.0
    block: int = 128
    reach: int | None = None
    reach_factor: float = 1.25
    soft_block: int = 64
    num_kv_heads: int | None = None
    rope_base: float | None = 10_000.0
    implementation: str | None = None

    def __post_init__(self):
        bits_lib.check_labels(self.num_labels, self.top_k)
        names = available_implementations(LabelPattern)
        if self.implementation is not None and self.implementation not in names:
            raise ValueError(f"implementation must be None or one of {sorted(names)}, got {self.implementation!r}")
        for name, value, choices in (
            ("phase", self.phase, PHASE_CHOICES),
            ("balance", self.balance, BALANCE_CHOICES),
            ("membership", self.membership, MEMBERSHIP_CHOICES),
        ):
            if value not in choices:
                raise ValueError(f"{name} must be one of {choices}, got {value!r}")
        if self.radius < 0 or (self.landmark_every is not None and self.landmark_every < 0) or self.router_hidden < 1:
            raise ValueError("radius and landmark_every must be >= 0 and router_hidden >= 1")
        if self.block < 1 or self.soft_block < 1 or self.reach_factor <= 0 or not 0 < self.eps < 1:
            raise ValueError("block, soft_block >= 1, reach_factor > 0 and 0 < eps < 1 required")
        bad_reach = not isinstance(self.reach, int) or isinstance(self.reach, bool) or self.reach < 0
        if self.reach is not None and bad_reach:
            raise ValueError(f"reach must be None or an int >= 0, got {self.reach!r}")
        if self.num_steps is not None and self.num_steps < 1:
            raise ValueError(f"num_steps must be None or >= 1, got {self.num_steps}")
        schedule.check_fractions(**self.fractions)
        for name in ("soft_steps", "ramp_steps", "straight_through_steps", "anneal_steps"):
            value = getattr(self, name)
            if value is not None and (value < 0 or (name == "anneal_steps" and value < 1)):
                raise ValueError(f"{name} must be None or >= {int(name == 'anneal_steps')}, got {value}")
        schedule.temperature(0, tau_start=self.tau_start, tau_end=self.tau_end, anneal_steps=1)
        position.check_cell(self.position_cell, self.radius, self.num_labels, bits_lib.MAX_LABELS)

    @property
    def landmarks(self) -> int:
        """The landmark stride in use (0: none)."""
        return self.radius if self.landmark_every is None else self.landmark_every

    @property
    def total_labels(self) -> int:
        """Labels the pattern numbers: the router's `num_labels`, plus the position labels."""
        return self.num_labels + position.num_position_labels(self.position_cell, self.radius)

    @property
    def fractions(self) -> dict:
        return dict(
            soft=self.soft_frac, ramp=self.ramp_frac, straight_through=self.straight_through_frac,
            anneal=self.anneal_frac,
        )

    @property
    def absolute_schedule(self) -> bool:
        return self.soft_steps is not None or self.straight_through_steps is not None

    def phase_steps(self, num_steps: int) -> schedule.Schedule:
        """The phase lengths in steps for a run of `num_steps` (fixed ones under an absolute schedule)."""
        if self.absolute_schedule:
            soft = self.soft_steps or 0
            return schedule.Schedule(soft=soft, ramp=self.ramp_steps or 0,
                                     straight_through=self.straight_through_steps or 0,
                                     anneal=self.anneal_steps or max(soft, 1))
        return schedule.Schedule.resolve(num_steps, **self.fractions)

    def make(self, model_dim: int, num_heads: int, *, rngs: nnx.Rngs) -> nnx.Module:
        """The `LabelAttention` layer (registered by its module file)."""
        return build_module(self, model_dim, num_heads, rngs=rngs)

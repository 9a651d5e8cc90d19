"""Frozen configuration of label-intersection attention (one per layer), validated once here.

One place per decision: the top level says what pattern the layer attends (labels, window, landmarks, position
labels, phase, ...); three small groups hold the rest:

* `schedule` (`LabelSchedule`): when each phase runs, as fractions of a run of `num_steps`, and τ's anneal;
* `router` (`LabelRouterConfig`): the routing head, how its logits become memberships, where its gradients flow and
  its losses;
* `capacity` (`LabelCapacity`): the executors' sizes: the bucketed hard executor's block and planned band, the soft
  executor's query block.

Each group validates its own values. The flat fields of earlier versions (`soft_frac=`, `router_hidden=`, `block=`,
`soft_steps=` ...) are refused with the name to use instead (`MOVED`, `REMOVED`); `flat_fields()` still gives
every setting under its flat name, for the result rows that record them.
"""

from __future__ import annotations

import dataclasses
import math
import numbers
from typing import ClassVar

from flax import nnx

from sparse_attn.attention import available_implementations
from sparse_attn.modules.base import build_module, check_floats, refuse_old_fields
from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels import position
from sparse_attn.patterns.labels import schedule as schedule_lib
from sparse_attn.patterns.labels.pattern import LabelPattern

PHASE_CHOICES = ("schedule", "soft", "straight_through", "hard")
BALANCE_CHOICES = ("cv2", "switch", "none")
MEMBERSHIP_CHOICES = ("centred", "sigmoid")


# ---------------------------------------------------------------------------------------------- value checks

def _is_int(value) -> bool:
    return isinstance(value, numbers.Integral) and not isinstance(value, bool)


def _check_int(owner: str, name: str, value, *, minimum: int, optional: bool = False) -> None:
    if (value is None and optional) or (_is_int(value) and value >= minimum):
        return
    raise ValueError(f"{owner}.{name} must be {'None or ' if optional else ''}an int >= {minimum}, got {value!r}")


def _check_float(owner: str, name: str, value, *, low: float, high: float = math.inf, open_low: bool = False,
                 open_high: bool = False) -> None:
    number = isinstance(value, numbers.Real) and not isinstance(value, bool) and math.isfinite(value)
    if number and (value > low if open_low else value >= low) and (value < high if open_high else value <= high):
        return
    span = f"{'>' if open_low else '>='} {low:g}"
    if high < math.inf:
        span += f" and {'<' if open_high else '<='} {high:g}"
    raise ValueError(f"{owner}.{name} must be a finite number {span}, got {value!r}")


def _check_bool(owner: str, name: str, value) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name} must be True or False, got {value!r}")


def _check_choice(owner: str, name: str, value, choices: tuple) -> None:
    if value not in choices:
        raise ValueError(f"{owner}.{name} must be one of {choices}, got {value!r}")


# ---------------------------------------------------------------------------------------------- the groups

@dataclasses.dataclass(frozen=True, kw_only=True)
class LabelSchedule:
    """When each phase runs under `phase="schedule"`, and the temperature's anneal.

    Phases in order: soft (τ anneals), ramp (the soft score blends into the hard pattern), straight-through (hard
    forward, soft gradient), hard (the rest). `soft`, `ramp`, `straight_through` and `anneal` are fractions of a run
    of `num_steps` steps, each rounded to whole steps (`patterns.labels.schedule.Schedule.resolve`; the anneal lasts
    at least one step); soft + ramp + straight_through <= 1. `num_steps=None`: the train loop sets the run's length
    (`LabelAttention.fit_schedule`), so the schedule scales with the run. Phase lengths fixed in steps whatever the
    run's length: give `num_steps` and the steps as fractions of it (`LabelSchedule(num_steps=90, soft=40 / 90,
    ramp=0, straight_through=20 / 90, anneal=40 / 90)` runs soft for exactly steps 0-39: round((s / N) * N) == s
    for every whole s <= N).
    Temperature: τ anneals geometrically `tau_start` -> `tau_end` over the anneal, then stays at `tau_end`.
    """

    soft: float = 0.3
    ramp: float = 0.2
    straight_through: float = 0.3
    anneal: float = 0.3
    num_steps: int | None = None
    tau_start: float = 1.0
    tau_end: float = 0.1

    def __post_init__(self):
        for name, value in self.fractions.items():
            _check_float("LabelSchedule", name, value, low=0.0, high=1.0)
        if self.soft + self.ramp + self.straight_through > 1 + 1e-9:
            raise ValueError(f"LabelSchedule: soft + ramp + straight_through fractions exceed 1: {self.soft} + "
                             f"{self.ramp} + {self.straight_through}")
        _check_int("LabelSchedule", "num_steps", self.num_steps, minimum=1, optional=True)
        _check_float("LabelSchedule", "tau_start", self.tau_start, low=0.0, open_low=True)
        _check_float("LabelSchedule", "tau_end", self.tau_end, low=0.0, open_low=True)

    @property
    def fractions(self) -> dict[str, float]:
        """{phase: its fraction of the run}: soft, ramp, straight_through and anneal."""
        return dict(soft=self.soft, ramp=self.ramp, straight_through=self.straight_through, anneal=self.anneal)

    def phase_steps(self, run_steps: int | None = None) -> schedule_lib.Schedule:
        """The phase lengths in steps, for `num_steps` (this schedule's), else `run_steps`, else
        `patterns.labels.schedule.DEFAULT_NUM_STEPS` (neither a config nor a train loop gave a run length)."""
        steps = self.num_steps or run_steps or schedule_lib.DEFAULT_NUM_STEPS
        return schedule_lib.Schedule.resolve(steps, **self.fractions)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LabelRouterConfig:
    """The routing head R = MLP(x) and what trains it.

    hidden: the MLP's hidden width. per_head: one label head per attention head (else one shared by the heads).
    membership: the soft phases' memberships from R: "centred" σ((R - θ)/τ) with θ between the k-th and (k+1)-th
    logit (tends to the top-k labels the hard phase uses), or "sigmoid" σ(R/τ).
    input_gradient: True = the router's gradients, from the task and from its losses, flow on into the residual
    stream it reads; False = the router reads stop_gradient(x): it still learns, but it moves no representation
    (docs/labels.md, "Known limits").
    freeze_when_hard: no gradient to the router in the hard phase, from its losses either (its top-k gets none
    from the task there); False: the losses keep moving it.
    Losses (already weighted in the output): sparsity_weight · mean(p), balance_weight · ("cv2": the CV² of the
    soft bucket sizes, "switch": the Switch loss, "none"), z_loss_weight · the router z-loss.
    """

    hidden: int = 64
    per_head: bool = False
    membership: str = "centred"
    input_gradient: bool = True
    freeze_when_hard: bool = True
    sparsity_weight: float = 1e-3
    balance: str = "cv2"
    balance_weight: float = 1e-2
    z_loss_weight: float = 0.0

    def __post_init__(self):
        _check_int("LabelRouterConfig", "hidden", self.hidden, minimum=1)
        for name in ("per_head", "input_gradient", "freeze_when_hard"):
            _check_bool("LabelRouterConfig", name, getattr(self, name))
        _check_choice("LabelRouterConfig", "membership", self.membership, MEMBERSHIP_CHOICES)
        _check_choice("LabelRouterConfig", "balance", self.balance, BALANCE_CHOICES)
        for name in ("sparsity_weight", "balance_weight", "z_loss_weight"):
            _check_float("LabelRouterConfig", name, getattr(self, name), low=0.0)


@dataclasses.dataclass(frozen=True, kw_only=True)
class LabelCapacity:
    """The executors' sizes (what they hold at once; the outputs do not depend on them).

    block, reach, reach_factor: the "bucketed" hard executor reads `reach` key entries on each side of a block of
    `block` bucket entries — the planned band, tier 0; `reach=None`: `reach_factor` x the balanced buckets'
    expectation + 4σ (`executors.labels.bucketed.default_reach`). Batches that need more run a wider exact tier
    (`reach_tier` > 0); `calibrate_reach` sets a trained model's layers from the reach its batches needed.
    soft_block: the soft phases' executor's query block (`executors.labels.soft`).
    """

    block: int = 128
    reach: int | None = None
    reach_factor: float = 1.25
    soft_block: int = 64

    def __post_init__(self):
        _check_int("LabelCapacity", "block", self.block, minimum=1)
        _check_int("LabelCapacity", "reach", self.reach, minimum=0, optional=True)
        _check_float("LabelCapacity", "reach_factor", self.reach_factor, low=0.0, open_low=True)
        _check_int("LabelCapacity", "soft_block", self.soft_block, minimum=1)


GROUPS = {"schedule": LabelSchedule, "router": LabelRouterConfig, "capacity": LabelCapacity}

# The flat fields of earlier versions -> (group, its field): one table for the refusals and for `flat_fields`.
MOVED = {
    "num_steps": ("schedule", "num_steps"),
    "soft_frac": ("schedule", "soft"),
    "ramp_frac": ("schedule", "ramp"),
    "straight_through_frac": ("schedule", "straight_through"),
    "anneal_frac": ("schedule", "anneal"),
    "tau_start": ("schedule", "tau_start"),
    "tau_end": ("schedule", "tau_end"),
    "router_hidden": ("router", "hidden"),
    "per_head_labels": ("router", "per_head"),
    "membership": ("router", "membership"),
    "router_input_gradient": ("router", "input_gradient"),
    "freeze_router_when_hard": ("router", "freeze_when_hard"),
    "sparsity_weight": ("router", "sparsity_weight"),
    "balance": ("router", "balance"),
    "balance_weight": ("router", "balance_weight"),
    "z_loss_weight": ("router", "z_loss_weight"),
    "block": ("capacity", "block"),
    "reach": ("capacity", "reach"),
    "reach_factor": ("capacity", "reach_factor"),
    "soft_block": ("capacity", "soft_block"),
}
# The absolute schedule's fields are gone: a schedule is fractions of `num_steps`, which states any step count.
REMOVED = {
    f"{phase}_steps": f"schedule=LabelSchedule(num_steps=N, {phase}={phase}_steps / N) (phase lengths are fractions "
                      "of num_steps; a fixed N keeps them in whole steps)"
    for phase in ("soft", "ramp", "straight_through", "anneal")
}


def instead_of(name: str) -> str | None:
    """What to write instead of the old flat field `name` (None: not an old field)."""
    if name in MOVED:
        group, field = MOVED[name]
        return f"{group}={GROUPS[group].__name__}({field}=...)"
    return REMOVED.get(name)


# ---------------------------------------------------------------------------------------------- the config

@refuse_old_fields(instead_of)
@dataclasses.dataclass(frozen=True, kw_only=True)
class LabelAttentionConfig:
    """Label attention: H = window(radius) ∪ landmarks(every landmark_every) ∪ self, filtered by shared labels.

    Defaults and the measurements behind them: docs/labels.md ("Defaults").
    num_labels, top_k: each token's router picks its top_k of num_labels labels; a pair is kept when it shares one.
    landmark_every: landmark stride; None = `radius` (about one landmark per window), 0 = no landmarks.
    position_cell: 0 = the research document's pattern; an even c >= 2 adds two position labels per token (its cell
    in two grids of c positions offset by c/2, `patterns.labels.position`), so every pair closer than c/2 is kept
    whatever the router says (the near neighbours a byte LM needs most; docs/labels.md, "Position labels").
    phase: "schedule" follows the step through soft -> ramp -> straight-through -> hard (`schedule`); "soft" /
    "straight_through" / "hard" pin the phase.
    ramp_thinning: in the ramp, each edge the hard pattern drops takes part with probability 1 - α (drawn afresh
    every step), besides being down-weighted; False: down-weighted only (the ramp before the thinning).
    eps: the soft score's floor, log(q_uv + eps) on the edges of H.
    implementation: the hard phase's executor for its `LabelPattern` (None: the platform's default, "bucketed";
    "reference" is the dense oracle; "xla" / "pallas" run only without landmarks).
    schedule, router, capacity: the groups above (`LabelSchedule`, `LabelRouterConfig`, `LabelCapacity`).
    """

    mechanism: ClassVar[str] = "labels"  # statistics are filed as "layer{i}/labels/{key}" by the model

    num_labels: int = 32
    top_k: int = 2
    radius: int = 64
    landmark_every: int | None = None
    position_cell: int = 0
    phase: str = "schedule"
    ramp_thinning: bool = True
    eps: float = 1e-6
    num_kv_heads: int | None = None
    rope_base: float | None = 10_000.0
    implementation: str | None = None
    schedule: LabelSchedule = LabelSchedule()
    router: LabelRouterConfig = LabelRouterConfig()
    capacity: LabelCapacity = LabelCapacity()

    def __post_init__(self):
        check_floats(self)
        for name, group in GROUPS.items():
            if not isinstance(getattr(self, name), group):
                raise TypeError(f"LabelAttentionConfig.{name} must be a {group.__name__}, got "
                                f"{getattr(self, name)!r}")
        bits_lib.check_labels(self.num_labels, self.top_k)
        names = available_implementations(LabelPattern)
        if self.implementation is not None and self.implementation not in names:
            raise ValueError(f"implementation must be None or one of {sorted(names)}, got {self.implementation!r}")
        _check_choice("LabelAttentionConfig", "phase", self.phase, PHASE_CHOICES)
        _check_int("LabelAttentionConfig", "radius", self.radius, minimum=0)
        _check_int("LabelAttentionConfig", "landmark_every", self.landmark_every, minimum=0, optional=True)
        _check_bool("LabelAttentionConfig", "ramp_thinning", self.ramp_thinning)
        _check_float("LabelAttentionConfig", "eps", self.eps, low=0.0, high=1.0, open_low=True, open_high=True)
        position.check_cell(self.position_cell, self.radius, self.num_labels, bits_lib.MAX_LABELS)

    def __getattr__(self, name: str):
        # Only called for names the instance does not have: an old flat field says where it went.
        instead = instead_of(name)
        if instead:
            raise AttributeError(f"{type(self).__name__} has no field {name!r}: use {instead}")
        raise AttributeError(f"{type(self).__name__!r} object has no attribute {name!r}")

    @property
    def landmarks(self) -> int:
        """The landmark stride in use (0: none)."""
        return self.radius if self.landmark_every is None else self.landmark_every

    @property
    def total_labels(self) -> int:
        """Labels the pattern numbers: the router's `num_labels`, plus the position labels."""
        return self.num_labels + position.num_position_labels(self.position_cell, self.radius)

    def flat_fields(self) -> dict:
        """Every setting under its flat name (the top level's fields, and each group's under its name before the
        grouping, `MOVED`: `router_input_gradient`, `block`, `soft_frac`, ...): what result rows record."""
        top = {f.name: getattr(self, f.name) for f in dataclasses.fields(self) if f.name not in GROUPS}
        return {**top, **{old: getattr(getattr(self, group), field) for old, (group, field) in MOVED.items()}}

    def make(self, model_dim: int, num_heads: int, *, rngs: nnx.Rngs) -> nnx.Module:
        """The `LabelAttention` layer (its mechanism record, `sparse_attn.registry`)."""
        return build_module(self, model_dim, num_heads, rngs=rngs)

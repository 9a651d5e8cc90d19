"""Phase and temperature schedules of label attention: pure functions of the training step (jit-safe, traced step).

Phases, in order: soft (τ anneals), ramp (the soft pattern blends into the hard one), straight-through (hard forward,
soft gradient), hard. Lengths are fractions of the run (`Schedule.resolve`); see docs/labels.md for the defaults.
"""

from __future__ import annotations

import dataclasses

import jax.numpy as jnp

SOFT, RAMP, STRAIGHT_THROUGH, HARD = 0, 1, 2, 3
PHASES = {"soft": SOFT, "ramp": RAMP, "straight_through": STRAIGHT_THROUGH, "hard": HARD}
# The run length a fraction schedule assumes when neither its config nor a train loop gave one.
DEFAULT_NUM_STEPS = 2000
# A step past the end of any schedule: the hard phase at the final temperature (inference).
INFERENCE_STEP = 2**31 - 1


@dataclasses.dataclass(frozen=True)
class Schedule:
    """Phase lengths in steps (the hard phase runs from `soft + ramp + straight_through` on) and τ's anneal length."""

    soft: int
    ramp: int
    straight_through: int
    anneal: int

    @classmethod
    def resolve(cls, num_steps: int, *, soft: float, ramp: float, straight_through: float, anneal: float):
        """Fractions of a `num_steps` run -> steps (each rounded; the anneal lasts at least one step)."""
        if num_steps < 1:
            raise ValueError(f"num_steps must be >= 1, got {num_steps}")
        fr = dict(soft=soft, ramp=ramp, straight_through=straight_through, anneal=anneal)
        check_fractions(**fr)
        return cls(
            soft=round(soft * num_steps),
            ramp=round(ramp * num_steps),
            straight_through=round(straight_through * num_steps),
            anneal=max(round(anneal * num_steps), 1),
        )

    def cut_short(self, run_steps: int, fractions: dict) -> list[str]:
        """Why this schedule does not fit a run of `run_steps`: phases asked for but given no step, or not reached."""
        notes = []
        starts = dict(soft=0, ramp=self.soft, straight_through=self.soft + self.ramp)
        starts["hard"] = starts["straight_through"] + self.straight_through
        lengths = dict(soft=self.soft, ramp=self.ramp, straight_through=self.straight_through)
        for name, frac in fractions.items():
            if name in lengths and frac > 0 and lengths[name] == 0:
                notes.append(f"the {name} phase ({frac:g} of the run) rounds to 0 steps")
        for name, start in starts.items():
            if start >= run_steps and (name == "hard" or lengths[name] > 0):
                notes.append(f"the {name} phase starts at step {start}, at or after the run's end ({run_steps})")
        if self.anneal > run_steps:
            notes.append(f"the temperature anneal lasts {self.anneal} steps, longer than the run ({run_steps})")
        return notes


def check_fractions(*, soft: float, ramp: float, straight_through: float, anneal: float) -> None:
    for name, f in dict(soft=soft, ramp=ramp, straight_through=straight_through, anneal=anneal).items():
        if not 0 <= f <= 1:
            raise ValueError(f"schedule fraction {name} must be in [0, 1], got {f}")
    if soft + ramp + straight_through > 1 + 1e-9:
        raise ValueError(f"soft + ramp + straight_through fractions exceed 1: {soft} + {ramp} + {straight_through}")


def temperature(step, *, tau_start: float = 1.0, tau_end: float = 0.1, anneal_steps: int = 1000):
    """Geometric anneal τ_start -> τ_end over `anneal_steps`, then constant (float32 scalar)."""
    if tau_start <= 0 or tau_end <= 0 or anneal_steps < 1:
        raise ValueError(
            f"need tau_start, tau_end > 0 and anneal_steps >= 1, got {tau_start}, {tau_end}, {anneal_steps}"
        )
    frac = jnp.clip(jnp.asarray(step, jnp.float32) / anneal_steps, 0.0, 1.0)
    return jnp.float32(tau_start) * (jnp.float32(tau_end / tau_start) ** frac)


def phase(step, *, soft_steps: int, straight_through_steps: int, ramp_steps: int = 0):
    """int32 of `step`'s shape: SOFT before `soft_steps`, RAMP for `ramp_steps`, STRAIGHT_THROUGH for
    `straight_through_steps`, then HARD (elementwise, so a vector of steps gives their phases)."""
    if soft_steps < 0 or straight_through_steps < 0 or ramp_steps < 0:
        raise ValueError(f"phase lengths must be >= 0, got {soft_steps}, {ramp_steps}, {straight_through_steps}")
    step = jnp.asarray(step, jnp.int32)
    ends = (soft_steps, soft_steps + ramp_steps, soft_steps + ramp_steps + straight_through_steps)
    return sum((step >= e).astype(jnp.int32) for e in ends)


def hard_weight(step, *, soft_steps: int, ramp_steps: int):
    """α: 0 through the soft phase, (i + 1) / (ramp + 1) at the ramp's step i (so 0 < α < 1 there: the soft score
    still carries gradient), 1 after it (float32 scalar)."""
    t = jnp.asarray(step, jnp.float32) - soft_steps
    return jnp.clip((t + 1.0) / (ramp_steps + 1), 0.0, 1.0) if ramp_steps else (t >= 0).astype(jnp.float32)

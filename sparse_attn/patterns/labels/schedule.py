"""Temperature and phase schedules: pure functions of the training step (jit-safe, traced step allowed)."""

from __future__ import annotations

import jax.numpy as jnp

SOFT, STRAIGHT_THROUGH, HARD = 0, 1, 2
PHASES = {"soft": SOFT, "straight_through": STRAIGHT_THROUGH, "hard": HARD}


def temperature(step, *, tau_start: float = 1.0, tau_end: float = 0.1, anneal_steps: int = 1000):
    """Geometric anneal τ_start -> τ_end over `anneal_steps`, then constant (float32 scalar)."""
    if tau_start <= 0 or tau_end <= 0 or anneal_steps < 1:
        raise ValueError(
            f"need tau_start, tau_end > 0 and anneal_steps >= 1, got {tau_start}, {tau_end}, {anneal_steps}"
        )
    frac = jnp.clip(jnp.asarray(step, jnp.float32) / anneal_steps, 0.0, 1.0)
    return jnp.float32(tau_start) * (jnp.float32(tau_end / tau_start) ** frac)


def phase(step, *, soft_steps: int, straight_through_steps: int):
    """int32: SOFT before `soft_steps`, STRAIGHT_THROUGH for the next `straight_through_steps`, then HARD."""
    if soft_steps < 0 or straight_through_steps < 0:
        raise ValueError(f"phase lengths must be >= 0, got {soft_steps}, {straight_through_steps}")
    step = jnp.asarray(step, jnp.int32)
    return jnp.where(
        step < soft_steps, SOFT, jnp.where(step < soft_steps + straight_through_steps, STRAIGHT_THROUGH, HARD)
    ).astype(jnp.int32)

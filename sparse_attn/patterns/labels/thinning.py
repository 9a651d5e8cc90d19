"""The ramp's edge thinning (docs/labels.md, "Ramp"): each edge of H that the hard pattern drops takes part in the
ramp's forward with probability 1 - α, drawn afresh every step by a counter-based hash of (seed, query, key).

A down-weighted edge can be offset by a larger q·k score; an edge that is usually absent cannot, so the model stops
relying on the edges the hard pattern will drop before the straight-through switch. Pure functions (no RNG state):
the same (seed, positions) always give the same draw, so evaluation at a step reproduces training's forward.
"""

from __future__ import annotations

import jax.numpy as jnp


def mix32(x):
    """A 32-bit integer finaliser (xor-shift-multiply, full avalanche); uint32 in, uint32 out. Shifts and multipliers
    are the published "lowbias32" constants of C. Wellons' hash-prospector search."""
    x = jnp.asarray(x, jnp.uint32)
    x = (x ^ (x >> 16)) * jnp.uint32(0x7FEB352D)
    x = (x ^ (x >> 15)) * jnp.uint32(0x846CA68B)
    return x ^ (x >> 16)


def seeds(step, count: int):
    """uint32[count]: one independent seed per (batch row, label head) for the thinning at `step`."""
    return mix32(mix32(jnp.asarray(step).astype(jnp.uint32)) + jnp.arange(count, dtype=jnp.uint32))


def uniform(seed, qpos, kpos):
    """float32 in [0, 1), uniform over (seed, query, key) triples; the position arrays broadcast."""
    h = mix32(mix32(seed ^ mix32(jnp.asarray(qpos).astype(jnp.uint32))) + jnp.asarray(kpos).astype(jnp.uint32))
    return (h >> 8).astype(jnp.float32) * jnp.float32(2.0**-24)


def present(seed, qpos, kpos, alpha):
    """Whether a dropped edge takes part in the ramp's forward: with probability 1 - α (all at α = 0, none at 1)."""
    return uniform(seed, qpos, kpos) >= alpha

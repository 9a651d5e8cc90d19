"""Helpers shared by the pattern types: validation and per-token metadata gathers."""

from __future__ import annotations

import jax
import jax.numpy as jnp
import numpy as np


def is_concrete(*xs) -> bool:
    """True when every array is a concrete value (not traced), so its contents can be checked on the host."""
    return all(not isinstance(x, jax.core.Tracer) for x in xs if x is not None)


def check_int(name: str, x, ndim: int | None = None) -> None:
    if not jnp.issubdtype(jnp.asarray(x).dtype, jnp.integer):
        raise ValueError(f"{name} must have an integer dtype, got {jnp.asarray(x).dtype}")
    if ndim is not None and jnp.ndim(x) != ndim:
        raise ValueError(f"{name} must have rank {ndim}, got shape {jnp.shape(x)}")


def check_lead(name: str, shape: tuple[int, ...], batch: int | None, heads: int | None) -> None:
    """Leading pattern axes [B|1, H|1, ...] must broadcast against the attention's batch and heads."""
    if batch is not None and shape[0] not in (1, batch):
        raise ValueError(f"{name} has batch axis {shape[0]}; expected 1 or {batch}")
    if heads is not None and len(shape) > 1 and shape[1] not in (1, heads):
        raise ValueError(f"{name} has head axis {shape[1]}; expected 1 or {heads}")


def host(x) -> np.ndarray:
    return np.asarray(jax.device_get(x))


def take_tokens(tok_BxHxN: jax.Array, pos_BxHxM: jax.Array) -> jax.Array:
    """Gathers per-token metadata at positions; leading axes broadcast (size 1 or equal).

    Extra trailing axes of `tok` (e.g. label words) are carried along.
    """
    extra = tok_BxHxN.shape[3:]
    lead = jnp.broadcast_shapes(tok_BxHxN.shape[:2], pos_BxHxM.shape[:2])
    tok = jnp.broadcast_to(tok_BxHxN, lead + tok_BxHxN.shape[2:])
    pos = jnp.broadcast_to(pos_BxHxM, lead + pos_BxHxM.shape[2:])
    idx = pos.reshape(lead + (-1,) + (1,) * len(extra))
    out = jnp.take_along_axis(tok, idx, axis=2, mode="clip")
    return out.reshape(lead + pos_BxHxM.shape[2:] + extra)

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


def static_int(name: str, value, *, low: int = 0, high: int | None = None, none_ok: bool = False, why: str = ""):
    """`value` as a Python int in [low, high] (bools and floats rejected), else ValueError naming it and the range.

    Builder arguments that size static shapes (lengths, radii, block sizes, counts) go through this before any
    tracing; `none_ok` lets None through unchanged, `why` explains where the bound comes from.
    """
    if value is None and none_ok:
        return None
    allowed = f"an int >= {low}" if high is None else f"an int in [{low}, {high}]"
    allowed = f"None or {allowed}" if none_ok else allowed
    ok = isinstance(value, (int, np.integer)) and not isinstance(value, (bool, np.bool_))
    if not ok or value < low or (high is not None and value > high):
        raise ValueError(f"{name} must be {allowed}{why}, got {value!r}")
    return int(value)


def valid_len_array(valid_len, n: int) -> jax.Array | None:
    """`valid_len` as int32[B]: an integer dtype (never silently truncated), rank 1, in [0, n] when concrete."""
    if valid_len is None:
        return None
    if not isinstance(valid_len, jax.Array):
        valid_len = np.asarray(valid_len)  # host values: checked before any int32 cast can wrap them
    if not jnp.issubdtype(valid_len.dtype, jnp.integer):
        raise ValueError(f"valid_len must have an integer dtype (lengths in [0, {n}]), got {valid_len.dtype}")
    if valid_len.ndim != 1:
        raise ValueError(f"valid_len must be int32[B], got shape {valid_len.shape}")
    if is_concrete(valid_len):
        vl = host(valid_len)
        if np.any((vl < 0) | (vl > n)):
            raise ValueError(f"valid_len must lie in [0, {n}], got {vl}")
    return jnp.asarray(valid_len, jnp.int32)


def check_batches(**sizes: int | None) -> None:
    """Batch axes of a builder's arguments must broadcast: each 1 or all equal (None: argument absent)."""
    given = {k: v for k, v in sizes.items() if v is not None}
    if len({v for v in given.values() if v != 1}) > 1:
        listed = ", ".join(f"{k}={v}" for k, v in given.items())
        raise ValueError(f"batch axes must be 1 or equal, got {listed}")


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

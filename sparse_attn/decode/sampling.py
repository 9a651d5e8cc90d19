"""Next-token sampling from logits: temperature, top-k, top-p (nucleus); temperature 0 is greedy."""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp


def check_sampling(temperature: float, top_k: int | None, top_p: float | None) -> None:
    """ValueError naming the argument: a finite temperature >= 0, top_k an int >= 1, top_p in (0, 1] (NaN fails
    every comparison, so each bound is written to hold only for good values)."""
    if not (isinstance(temperature, (int, float)) and math.isfinite(temperature) and temperature >= 0):
        raise ValueError(f"temperature must be a finite number >= 0 (0: greedy), got {temperature}")
    if top_k is not None and not (isinstance(top_k, int) and top_k >= 1):
        raise ValueError(f"top_k must be an int >= 1 or None, got {top_k}")
    if top_p is not None and not (isinstance(top_p, (int, float)) and 0 < top_p <= 1):
        raise ValueError(f"top_p must be in (0, 1] or None, got {top_p}")


def sample(key: jax.Array, logits_BxV: jax.Array, *, temperature: float = 1.0, top_k: int | None = None,
           top_p: float | None = None) -> jax.Array:
    """int32[B] next tokens. top-k keeps the k largest logits; top-p the smallest set of most likely tokens whose
    probability reaches p (the most likely token always stays)."""
    logits = logits_BxV.astype(jnp.float32)
    if temperature == 0:
        return jnp.argmax(logits, axis=-1).astype(jnp.int32)
    logits = logits / temperature
    if top_k is not None and top_k < logits.shape[-1]:
        kth = jax.lax.top_k(logits, top_k)[0][:, -1:]
        logits = jnp.where(logits >= kth, logits, -jnp.inf)
    if top_p is not None and top_p < 1:
        sorted_desc = -jnp.sort(-logits, axis=-1)
        probs = jax.nn.softmax(sorted_desc, axis=-1)
        before = jnp.cumsum(probs, axis=-1) - probs  # mass of the strictly more likely tokens
        cutoff = jnp.min(jnp.where(before < top_p, sorted_desc, jnp.inf), axis=-1, keepdims=True)
        logits = jnp.where(logits >= cutoff, logits, -jnp.inf)
    return jax.random.categorical(key, logits, axis=-1).astype(jnp.int32)

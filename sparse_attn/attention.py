"""The one public entry point: `attention(q, k, v, pattern, *, implementation=None, ...)`."""

from __future__ import annotations

import inspect
import math
from typing import Callable

import jax
import jax.numpy as jnp

import sparse_attn.executors  # noqa: F401  (registers the reference, XLA and mechanism executors)
import sparse_attn.kernels  # noqa: F401  (registers the Pallas kernels)
from sparse_attn.executors import registry
from sparse_attn.executors.registry import register_executor
from sparse_attn.patterns.intervals import Intervals

__all__ = ["attention", "available_implementations", "default_implementation", "register_executor"]


def available_implementations(pattern_type: type = Intervals) -> tuple[str, ...]:
    """Implementation names registered for a pattern type (default: `Intervals`)."""
    return registry.implementations(pattern_type)


def default_implementation(platform: str | None = None, pattern_type: type = Intervals) -> str:
    """What `implementation=None` runs for a pattern type on a platform (default: this one)."""
    return registry.default(pattern_type, platform or jax.default_backend())


def _check_inputs(q, k, v, pattern) -> None:
    for name, x in (("q", q), ("k", k), ("v", v)):
        if x.ndim != 4:
            raise ValueError(f"{name} must be [B, N, heads, D], got shape {x.shape}")
        if not jnp.issubdtype(x.dtype, jnp.floating):
            raise ValueError(f"{name} must be floating point, got {x.dtype}")
    b, n, h, d = q.shape
    for axis, size in (("length N", n), ("query heads H", h), ("KV heads G", k.shape[2]), ("head size D", d)):
        if size < 1:
            raise ValueError(f"{axis} must be >= 1, got q shape {q.shape}, k/v shape {k.shape}")
    if k.shape != v.shape:
        raise ValueError(f"k {k.shape} and v {v.shape} must have the same shape")
    if k.shape[0] != b or k.shape[1] != n or k.shape[3] != d:
        raise ValueError(f"k/v {k.shape} do not match q {q.shape} in batch, length or head size")
    if h % k.shape[2]:
        raise ValueError(f"query heads ({h}) must be a multiple of KV heads ({k.shape[2]})")
    if pattern.num_tokens != n:
        raise ValueError(f"pattern covers {pattern.num_tokens} tokens but q has {n}")
    pattern.validate(batch=b, heads=h)


def _empty_batch(q, fn, args, options):
    """B = 0: empty outputs without running an executor (kernels cannot launch an empty grid)."""
    inspect.signature(fn).bind(*args, **options)  # a bad option fails as it would with B > 0
    b, n, h, _ = q.shape
    return jnp.zeros(q.shape, q.dtype), jnp.zeros((b, n, h), jnp.float32)


def attention(
    q_BxNxHxD: jax.Array,
    k_BxNxGxD: jax.Array,
    v_BxNxGxD: jax.Array,
    pattern,
    *,
    implementation: str | None = None,
    scale: float | None = None,
    return_lse: bool = False,
    **options,
):
    """Sparse attention of q over the (k, v) pairs a pattern allows.

    Args:
      q_BxNxHxD: queries [batch, length, query heads, head size].
      k_BxNxGxD, v_BxNxGxD: keys and values with G KV heads (H % G == 0: grouped-query attention).
      pattern: any registered pattern type over the N tokens (Intervals, BlockLayout, NeighbourList, and each
        mechanism's own: `patterns.abca.ZonePattern`, `patterns.labels.LabelPattern`), leading axes [B|1, H|1].
      implementation: a name registered for the pattern's type ("reference" for every type, "xla", "pallas",
        or a mechanism executor such as "packed" or "bucketed"), or None (the platform's default for that type).
        Any other value (including "") or an explicit choice that cannot run raises ValueError naming what can.
      scale: logit scale, default 1/sqrt(D).
      return_lse: also return the float32 log-sum-exp [B, N, H] (-inf on rows with no allowed key).
      **options: executor options (e.g. `block` for "xla", `config` for "pallas").

    Returns:
      out [B, N, H, D] in q's dtype (0 on rows with no allowed key), and lse if asked. An empty batch (B = 0)
      gives empty outputs; N, H, G and D must be >= 1.
    """
    name = default_implementation(None, type(pattern)) if implementation is None else implementation
    fn = registry.lookup(type(pattern), name)
    _check_inputs(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern)
    scale = 1.0 / math.sqrt(q_BxNxHxD.shape[-1]) if scale is None else scale
    args = (q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern)
    if q_BxNxHxD.shape[0] == 0:
        out, lse = _empty_batch(q_BxNxHxD, fn, args, dict(options, scale=scale))
    else:
        out, lse = fn(*args, scale=scale, **options)
    return (out, lse) if return_lse else out

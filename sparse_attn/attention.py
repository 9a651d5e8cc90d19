"""The one public entry point: `attention(q, k, v, pattern, *, implementation=None, ...)`."""

from __future__ import annotations

import inspect
import math
from typing import Callable

import jax
import jax.numpy as jnp

from sparse_attn.executors.reference import reference_attention
from sparse_attn.executors.xla import xla_attention
from sparse_attn.kernels import pallas_attention
from sparse_attn.patterns.block_layout import BlockLayout
from sparse_attn.patterns.intervals import Intervals
from sparse_attn.patterns.neighbours import NeighbourList

_EXECUTORS: dict[str, Callable] = {"reference": reference_attention, "xla": xla_attention, "pallas": pallas_attention}
_ACCELERATED: dict[str, Callable] = {"pallas": pallas_attention}  # preferred on GPU/TPU


def register_executor(name: str, fn: Callable, *, accelerated: bool = False) -> None:
    """Adds an executor `fn(q, k, v, pattern, scale, **options) -> (out, lse)`."""
    _EXECUTORS[name] = fn
    if accelerated:
        _ACCELERATED[name] = fn


def available_implementations() -> tuple[str, ...]:
    return tuple(_EXECUTORS)


def default_implementation(platform: str | None = None) -> str:
    """Pallas kernels on GPU/TPU when registered, XLA gathers everywhere else."""
    platform = platform or jax.default_backend()
    if platform in ("gpu", "cuda", "rocm", "tpu") and "pallas" in _ACCELERATED:
        return "pallas"
    return "xla"


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
    if not isinstance(pattern, (Intervals, BlockLayout, NeighbourList)):
        raise ValueError(f"pattern must be Intervals, BlockLayout or NeighbourList, got {type(pattern).__name__}")
    if pattern.num_tokens != n:
        raise ValueError(f"pattern covers {pattern.num_tokens} tokens but q has {n}")
    pattern.validate(batch=b, heads=h)


def _resolve_implementation(implementation) -> str:
    if implementation is None:
        return default_implementation()
    if not isinstance(implementation, str) or implementation not in _EXECUTORS:
        raise ValueError(
            f"implementation must be None or one of {sorted(_EXECUTORS)}, got {implementation!r} "
            "(an unknown or unavailable implementation)"
        )
    return implementation


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
      pattern: Intervals, BlockLayout or NeighbourList over the N tokens, leading axes [B|1, H|1].
      implementation: "reference", "xla", "pallas" or None (best available for the platform). Any other value
        (including "") or an explicit choice that cannot run raises ValueError.
      scale: logit scale, default 1/sqrt(D).
      return_lse: also return the float32 log-sum-exp [B, N, H] (-inf on rows with no allowed key).
      **options: executor options (e.g. `block` for "xla").

    Returns:
      out [B, N, H, D] in q's dtype (0 on rows with no allowed key), and lse if asked. An empty batch (B = 0)
      gives empty outputs; N, H, G and D must be >= 1.
    """
    name = _resolve_implementation(implementation)
    _check_inputs(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern)
    scale = 1.0 / math.sqrt(q_BxNxHxD.shape[-1]) if scale is None else scale
    args = (q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern, scale)
    if q_BxNxHxD.shape[0] == 0:
        out, lse = _empty_batch(q_BxNxHxD, _EXECUTORS[name], args, options)
    else:
        out, lse = _EXECUTORS[name](*args, **options)
    return (out, lse) if return_lse else out

"""A drop-in `attention_fn` for `flax.nnx.MultiHeadAttention`: `make_attention_fn(pattern_or_mask_fn,
implementation=...)` returns a callable with `flax.nnx.dot_product_attention`'s signature that runs this library's
executors through `sparse_attn.attention`.

    window = and_masks(causal_mask, sliding_window_mask(128))          # sparse_attn.patterns.mask_fns
    mha = nnx.MultiHeadAttention(num_heads=8, in_features=512, decode=False, rngs=nnx.Rngs(0),
                                 attention_fn=sa.make_attention_fn(window))

A caller's dense `mask` / `bias` / `is_causal` that the pattern cannot carry go through `DenseBias`, a dense logit
bias pattern (-inf where not allowed) that only the "reference" executor runs: O(N^2) per (batch, head), like the
mask itself.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import inspect

import jax
import jax.numpy as jnp
from flax.nnx.nn.dtypes import promote_dtype as _flax_promote_dtype

from sparse_attn.attention import attention, resolve_implementation
from sparse_attn.executors.prepared import Prepared
from sparse_attn.patterns.baselines import dense as dense_pattern
from sparse_attn.patterns.dense_bias import DenseBias
from sparse_attn.patterns.intervals import Intervals
from sparse_attn.patterns.mask_pattern import from_mask_fn, trace_mask_fn

__all__ = ["make_attention_fn"]


def _dense_lead(x, name: str, batch: tuple[int, ...], heads: int, n: int, m: int) -> jax.Array:
    """A flax-style mask or bias, broadcastable to [batch..., heads, n, m], as [B|1, heads|1, n, m]."""
    x = jnp.asarray(x)
    target = (*batch, heads, n, m)
    if x.ndim > len(target):
        raise ValueError(f"{name} must broadcast to [batch..., heads, q_len, kv_len] = {target}, got shape {x.shape}")
    x = x.reshape((1,) * (len(target) - x.ndim) + x.shape)
    try:
        jnp.broadcast_shapes(x.shape, target)
    except ValueError:
        raise ValueError(
            f"{name} must broadcast to [batch..., heads, q_len, kv_len] = {target}, got shape {x.shape}"
        ) from None
    lead = x.shape[: len(batch)]
    b = 1 if all(s == 1 for s in lead) else math.prod(batch)
    h = x.shape[-3]
    x = jnp.broadcast_to(x, (*(lead if b == 1 else batch), h, n, m))
    return x.reshape(b, h, n, m)


def _everywhere(b, h, q_idx, kv_idx):
    del b, h, kv_idx
    return q_idx >= 0


def is_mask_fn(fn) -> bool:
    """A callable of four positional parameters (b, h, q_idx, kv_idx) is a mask function; of one, a pattern
    factory `n -> pattern`."""
    try:
        params = inspect.signature(fn).parameters.values()
    except (TypeError, ValueError):
        return False
    positional = [p for p in params if p.kind in (p.POSITIONAL_ONLY, p.POSITIONAL_OR_KEYWORD) and p.default is p.empty]
    return len(positional) == 4


def _pattern_bias(pattern) -> jax.Array:
    """float32[B|1, H|1, N, N]: the pattern's own logit bias (NeighbourList slot biases), -inf where not allowed."""
    if hasattr(pattern, "dense_bias"):
        return pattern.dense_bias().astype(jnp.float32)
    return jnp.where(pattern.to_dense(), 0.0, -jnp.inf).astype(jnp.float32)


def make_attention_fn(pattern_or_mask_fn=None, *, score_fn=None, implementation: str | None = None,
                      block_size: int | tuple[int, int] | None = None, **options) -> Callable[..., jax.Array]:
    """An `attention_fn` for `flax.nnx.MultiHeadAttention` (flax.nnx.dot_product_attention's signature) that runs
    `sparse_attn.attention(q, k, v, pattern, score_fn=score_fn, implementation=implementation, **options)`.

    Args:
      pattern_or_mask_fn: the sparsity pattern: None (dense attention: `patterns.dense(n)`, or every key of a
        cross-attention), a pattern built for
        the lengths (any type `sparse_attn.attention` accepts, a `Prepared` one included), a callable
        `n -> pattern` called at trace time with the static length, so one fn serves every length (e.g.
        `lambda n: patterns.sliding_window(n, 128, causal=True)`, or `patterns.causal` itself), or a mask function
        `mask_fn(b, h, q_idx, kv_idx) -> bool` (four positional parameters; `patterns.mask_fns`), turned into
        `patterns.from_mask_fn(mask_fn, Nq, Nk, block_size=block_size)` on every call (for the flattened batch and
        the query heads where it reads b or h): O(Nq Nk) predicate evaluations per call, so for long sequences
        build the pattern once and pass it. Leading pattern axes [B|1, H|1] are those of the flattened batch and
        the query heads.
      score_fn: None, or `score_fn(score, b, h, q_idx, kv_idx) -> score` on the scaled logits (`sparse_attn.attention`,
        `sparse_attn.score_fns`), on both routes below; a caller's `bias` is added after it.
      block_size: the mask function's block size (`patterns.from_mask_fn`); unused otherwise.
      implementation: the executor, as in `sparse_attn.attention` (None: this platform's default for the pattern);
        checked against the pattern on every call, also on calls that run the dense route below.
      **options: executor options passed to `sparse_attn.attention` on the sparse route (e.g.
        `config=kernels.KernelConfig(...)` for "pallas"); not passed to the dense route's "reference".

    The returned fn(query, key, value, bias=None, mask=None, broadcast_dropout=True, dropout_rng=None,
    dropout_rate=0.0, deterministic=False, dtype=None, precision=None, module=None, promote_dtype=flax's,
    is_causal=False), query [batch..., N, H, D], key/value [batch..., N, G, D] (H % G == 0), returns
    [batch..., N, H, D]. Decisions:

    * Leading batch dims are flattened to one axis B and restored; no batch dim at all is B = 1 (as in flax).
    * Query and key lengths may differ (cross-attention) with a mask function or a pattern built for (Nq, Nk)
      (`patterns.from_mask_fn`); other patterns need equal lengths (`decode=True` caches are refused, naming both
      lengths; `is_causal` needs equal lengths); key and value must have the same shape.
    * `mask` (True or nonzero = attend, flax's convention, e.g. `nnx.make_causal_mask`'s float mask; broadcastable
      to [batch..., H|1, N|1, N]), `bias` (additive logits, same broadcasting; -inf excludes a pair) and
      `is_causal` are honoured exactly by intersecting them with the
      pattern. `is_causal` on an unprepared `Intervals` (and on None) stays sparse: the pattern's own causal
      flag, which every executor runs. Any `mask` or `bias` (or `is_causal` on another pattern type) takes the
      *dense route*: the pattern's `to_dense()` (or `dense_bias()`) intersected with them becomes one
      `DenseBias` pattern run by the "reference" executor, whatever `implementation` says: O(N^2) memory and
      time per (batch, head), like the mask itself (without a mask or bias, `implementation` runs as chosen). A
      padding mask is better expressed as a pattern built with `valid_len`, which stays sparse.
    * Fully masked query rows output 0 (this library's rule, with zero gradients), not flax's mean of V (its
      default gives every key the same finite large negative logit, hence uniform weights). A row whose bias is
      -inf on every allowed key is empty too and outputs 0.
    * `bias` is implemented exactly (the reference executor adds a dense logit bias and differentiates it), not
      refused; it is cast to float32 and added to the float32 logits (flax adds it in the compute dtype).
    * Dropout on the attention weights is not implemented: `dropout_rate > 0` with `deterministic=False` raises
      ValueError; a zero rate or `deterministic=True` runs without dropout (`dropout_rng`, `broadcast_dropout`
      unused).
    * `module` (flax passes it with `sow_weights=True`) raises ValueError: the sparse executors never materialise
      the attention weights to sow.
    * `dtype`: query, key and value are cast with `promote_dtype(..., dtype=dtype)` as flax does (None: their
      common type) and the output has that dtype; the executors keep float32 softmax statistics.
      `precision` is ignored: the executors take no matmul precision argument and use the platform's default.
    """

    def attention_fn(
        query: jax.Array,
        key: jax.Array,
        value: jax.Array,
        bias: jax.Array | None = None,
        mask: jax.Array | None = None,
        broadcast_dropout: bool = True,
        dropout_rng: jax.Array | None = None,
        dropout_rate: float = 0.0,
        deterministic: bool = False,
        dtype: Any = None,
        precision: Any = None,
        module: Any = None,
        promote_dtype: Callable = _flax_promote_dtype,
        is_causal: bool = False,
    ) -> jax.Array:
        del broadcast_dropout, dropout_rng, precision  # no dropout; executors take no precision (docstring)
        if dropout_rate > 0.0 and not deterministic:
            raise ValueError(
                f"dropout_rate={dropout_rate} with deterministic=False: dropout on the attention weights is not "
                "implemented by sparse_attn's executors; use dropout_rate=0.0 or deterministic=True"
            )
        if module is not None:
            raise ValueError(
                "module is not None (MultiHeadAttention(sow_weights=True)): sparse_attn's executors never "
                "materialise the attention weights to sow; call it with sow_weights=False"
            )
        query, key, value = promote_dtype((query, key, value), dtype=dtype)
        if not (query.ndim == key.ndim == value.ndim) or query.ndim < 3:
            raise ValueError(
                f"query, key, value must be [batch..., len, heads, dim] of equal rank, got shapes {query.shape}, "
                f"{key.shape}, {value.shape}"
            )
        batch = query.shape[:-3]
        if key.shape[:-3] != batch or value.shape[:-3] != batch:
            raise ValueError(f"q, k, v batch dims must match, got shapes {query.shape}, {key.shape}, {value.shape}")
        n, h, d = query.shape[-3:]
        m = key.shape[-3]
        if value.shape[-3] != m:
            raise ValueError(f"key length {m} and value length {value.shape[-3]} must be equal")
        b = math.prod(batch)
        q = query.reshape(b, n, *query.shape[-2:])
        k, v = (x.reshape(b, m, *x.shape[-2:]) for x in (key, value))

        source = pattern_or_mask_fn
        if callable(source) and is_mask_fn(source):
            predicate = trace_mask_fn(source)[0]
            pat = from_mask_fn(source, n, m, batch=b if predicate.reads_batch else None,
                               heads=h if predicate.reads_heads else None, block_size=block_size)  # fmt: skip
        elif callable(source) and not isinstance(source, Prepared):
            pat = source(n)
        else:
            pat = source
        if pat is None:  # dense: over the sequence, or every key of a cross-attention
            pat = dense_pattern(n) if n == m else from_mask_fn(_everywhere, n, m, block_size=block_size)
        if is_causal and isinstance(pat, Intervals):  # exact on every executor: causality cuts every clause
            pat, is_causal = dataclasses.replace(pat, causal=True), False
        if not hasattr(pat, "num_tokens"):
            raise ValueError(f"pattern_or_mask_fn must be None, a pattern, a callable n -> pattern or a mask function "
                             f"mask_fn(b, h, q_idx, kv_idx), got {pat!r}")  # fmt: skip
        kv_tokens = getattr(pat.pattern if isinstance(pat, Prepared) else pat, "num_kv_tokens", pat.num_tokens)
        if (pat.num_tokens, kv_tokens) != (n, m):
            raise ValueError(
                f"the pattern covers {pat.num_tokens} queries and {kv_tokens} keys but the call has {n} and {m}: "
                "build it for these lengths, or pass a callable n -> pattern or a mask function"
            )
        if is_causal and n != m:
            raise ValueError(f"is_causal with query length {n} != key length {m}: express the mask as a mask "
                             "function instead")  # fmt: skip
        if not isinstance(pat, Prepared):
            resolve_implementation(pat, implementation)  # a bad name fails on every route

        if mask is None and bias is None and not is_causal:
            out = attention(q, k, v, pat, implementation=implementation, score_fn=score_fn, **options)
            return out.reshape(query.shape)

        # The dense route: the pattern intersected with the mask, bias and causality as one dense logit bias.
        base = pat.pattern if isinstance(pat, Prepared) else pat
        base.validate(batch=b, heads=h)
        logits = _pattern_bias(base)
        if mask is not None:
            allowed = _dense_lead(mask, "mask", batch, h, n, m).astype(jnp.bool_)
            logits = jnp.where(allowed, logits, -jnp.inf)
        if bias is not None:  # added on allowed pairs only: a NaN or inf bias on an excluded pair stays excluded
            extra = _dense_lead(bias, "bias", batch, h, n, m).astype(jnp.float32)
            logits = jnp.where(jnp.isneginf(logits), -jnp.inf, logits + extra)
        if is_causal:
            logits = jnp.where(jnp.tril(jnp.ones((1, 1, n, n), jnp.bool_)), logits, -jnp.inf)
        out = attention(q, k, v, DenseBias(logits), implementation="reference", score_fn=score_fn)
        return out.reshape(query.shape)

    return attention_fn

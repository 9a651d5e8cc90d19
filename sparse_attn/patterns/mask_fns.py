"""Mask functions (FlexAttention's `mask_mod`): `mask_fn(b, h, q_idx, kv_idx) -> bool`, any jnp-traceable predicate
of broadcasting int32 index arrays, True where query `q_idx` may attend key `kv_idx` of batch row `b`, head `h`.

    window = and_masks(causal_mask, sliding_window_mask(128))
    docs = document_mask(segment_ids_BxN)                   # closes over an array: indexed by b, q_idx, kv_idx
    allowed_BxHxQxK = evaluate(or_masks(window, prefix_lm_mask(prefix_len_B)), 1, 1, n, n)

Ready-made predicates and their equal pattern builders (`tests/foundation/test_mask_fns.py` checks each pair on
random sizes): `causal_mask` = `patterns.causal`, `sliding_window_mask(r)` = `patterns.sliding_window(n, r)` (and with
`causal_mask`, the causal window), `document_mask(ids)` = `patterns.document_mask(ids)`, `padding_mask(lengths)` =
the `valid_len` of the builders. `prefix_lm_mask`, `chunked_mask` and `dilated_mask` have no builder of their own.
Those closing over arrays carry `check(batch, q_len, kv_len)`, which `patterns.from_mask_fn` calls to refuse arrays
of the wrong length before anything is traced (a gather would clamp an out-of-range index silently).

`patterns.from_mask_fn` turns a predicate into a block-sparse pattern; `evaluate` is the dense oracle: it holds the
whole [B, H, Q, K] mask, for tests and small problems.
"""

from __future__ import annotations

import functools
import operator
from collections.abc import Callable

import jax
import jax.numpy as jnp

from sparse_attn.patterns import common

MaskFn = Callable[[jax.Array, jax.Array, jax.Array, jax.Array], jax.Array]


def causal_mask(b, h, q_idx, kv_idx):
    """Keys at or before the query."""
    del b, h
    return kv_idx <= q_idx


def sliding_window_mask(radius: int) -> MaskFn:
    """Keys within `radius` positions of the query, on both sides (`and_masks` it with `causal_mask` for the past
    side only)."""
    radius = common.static_int("radius", radius)

    def mask_fn(b, h, q_idx, kv_idx):
        del b, h
        return jnp.abs(q_idx - kv_idx) <= radius

    mask_fn.__name__ = "sliding_window_mask"
    return mask_fn


def document_mask(segment_ids_BxN, kv_segment_ids_BxM=None) -> MaskFn:
    """Keys of the query's own document: `segment_ids[b, q] == kv_segment_ids[b, k]` (default: the same ids for
    queries and keys; any ids, not only contiguous runs: the packed documents of `patterns.document_mask` are the
    contiguous case)."""
    seg = jnp.asarray(segment_ids_BxN)
    common.check_int("segment_ids", seg, 2)
    kv_seg = seg if kv_segment_ids_BxM is None else jnp.asarray(kv_segment_ids_BxM)
    common.check_int("kv_segment_ids", kv_seg, 2)

    def mask_fn(b, h, q_idx, kv_idx):
        del h
        return seg[b, q_idx] == kv_seg[b, kv_idx]

    def check(batch, q_len, kv_len):
        _check_rows("document_mask segment_ids", seg.shape[0], batch)
        _check_rows("document_mask kv_segment_ids", kv_seg.shape[0], batch)
        if seg.shape[1] != q_len or kv_seg.shape[1] != kv_len:
            raise ValueError(f"document_mask ids cover {seg.shape[1]} queries and {kv_seg.shape[1]} keys; the pattern "
                             f"has q_len {q_len}, kv_len {kv_len} (cross-attention: pass kv_segment_ids)")

    mask_fn.check = check
    mask_fn.__name__ = "document_mask"
    return mask_fn


def prefix_lm_mask(prefix_len_B) -> MaskFn:
    """Prefix-LM: every query sees the whole prefix `[0, prefix_len[b])`, and the causal past beyond it."""
    prefix = jnp.asarray(prefix_len_B)
    common.check_int("prefix_len", prefix, 1)

    def mask_fn(b, h, q_idx, kv_idx):
        del h
        return (kv_idx <= q_idx) | (kv_idx < prefix[b])

    mask_fn.check = lambda batch, q_len, kv_len: _check_rows("prefix_lm_mask prefix_len", prefix.shape[0], batch)
    mask_fn.__name__ = "prefix_lm_mask"
    return mask_fn


def padding_mask(valid_len_B, kv_valid_len_B=None) -> MaskFn:
    """Padded sequences: query and key both before their row's length (`kv_valid_len`: the keys' own lengths,
    default the same)."""
    q_len = jnp.asarray(valid_len_B)
    common.check_int("valid_len", q_len, 1)
    kv_len = q_len if kv_valid_len_B is None else jnp.asarray(kv_valid_len_B)
    common.check_int("kv_valid_len", kv_len, 1)

    def mask_fn(b, h, q_idx, kv_idx):
        del h
        return (q_idx < q_len[b]) & (kv_idx < kv_len[b])

    def check(batch, n_q, n_kv):
        _check_rows("padding_mask valid_len", q_len.shape[0], batch)
        _check_rows("padding_mask kv_valid_len", kv_len.shape[0], batch)
        if common.is_concrete(q_len, kv_len) and (bool(jnp.any((q_len < 0) | (q_len > n_q)))
                                                  or bool(jnp.any((kv_len < 0) | (kv_len > n_kv)))):
            raise ValueError(f"padding_mask lengths must lie in [0, {n_q}] (queries) and [0, {n_kv}] (keys), got "
                             f"{q_len} and {kv_len}")  # fmt: skip

    mask_fn.check = check
    mask_fn.__name__ = "padding_mask"
    return mask_fn


def _check_rows(name: str, rows: int, batch: int | None) -> None:
    """A per-row array must have one row per batch row, and the pattern must be built for that batch."""
    if batch is None and rows != 1:
        raise ValueError(f"{name} has {rows} rows: the mask depends on the batch row, pass batch={rows}")
    if batch is not None and rows != batch:
        raise ValueError(f"{name} has {rows} rows but the pattern is built for batch={batch}")


def chunked_mask(chunk: int) -> MaskFn:
    """Chunked local attention: query and key in the same chunk of `chunk` positions (`and_masks` it with
    `causal_mask` for the causal form)."""
    chunk = common.static_int("chunk", chunk, low=1)

    def mask_fn(b, h, q_idx, kv_idx):
        del b, h
        return q_idx // chunk == kv_idx // chunk

    mask_fn.__name__ = "chunked_mask"
    return mask_fn


def dilated_mask(dilation: int, radius: int) -> MaskFn:
    """Dilated window: keys at a multiple of `dilation` positions from the query, at most `radius` dilated steps
    away on either side."""
    dilation = common.static_int("dilation", dilation, low=1)
    radius = common.static_int("radius", radius)

    def mask_fn(b, h, q_idx, kv_idx):
        del b, h
        d = q_idx - kv_idx
        return (d % dilation == 0) & (jnp.abs(d) <= radius * dilation)

    mask_fn.__name__ = "dilated_mask"
    return mask_fn


def and_masks(*mask_fns: MaskFn) -> MaskFn:
    """Pairs every predicate allows."""
    return _combine("and_masks", operator.and_, mask_fns)


def or_masks(*mask_fns: MaskFn) -> MaskFn:
    """Pairs some predicate allows."""
    return _combine("or_masks", operator.or_, mask_fns)


def _combine(name: str, op, mask_fns) -> MaskFn:
    if not mask_fns or not all(callable(fn) for fn in mask_fns):
        raise ValueError(f"{name} takes one or more mask functions mask_fn(b, h, q_idx, kv_idx), got {mask_fns!r}")

    def mask_fn(b, h, q_idx, kv_idx):
        return functools.reduce(op, (fn(b, h, q_idx, kv_idx) for fn in mask_fns))

    def check(batch, q_len, kv_len):
        for fn in mask_fns:
            if getattr(fn, "check", None) is not None:
                fn.check(batch, q_len, kv_len)

    mask_fn.check = check
    mask_fn.__name__ = f"{name}({', '.join(getattr(fn, '__name__', '?') for fn in mask_fns)})"
    return mask_fn


def evaluate(mask_fn: MaskFn, batch: int, heads: int, q_len: int, kv_len: int) -> jax.Array:
    """bool[batch, heads, q_len, kv_len]: the predicate on every index (the dense oracle; O(B H Q K) memory).

    Raises ValueError when the predicate does not return booleans of that shape.
    """
    b = jnp.arange(batch, dtype=jnp.int32).reshape(-1, 1, 1, 1)
    h = jnp.arange(heads, dtype=jnp.int32).reshape(1, -1, 1, 1)
    q = jnp.arange(q_len, dtype=jnp.int32).reshape(1, 1, -1, 1)
    k = jnp.arange(kv_len, dtype=jnp.int32).reshape(1, 1, 1, -1)
    out = jnp.asarray(mask_fn(b, h, q, k))
    if out.dtype != jnp.bool_:
        raise ValueError(f"mask_fn must return bool, got {out.dtype}")
    shape = (batch, heads, q_len, kv_len)
    try:
        return jnp.broadcast_to(out, shape)
    except ValueError:
        raise ValueError(f"mask_fn returned shape {out.shape}, which does not broadcast to {shape}") from None

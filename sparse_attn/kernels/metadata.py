"""What the kernels read besides q, k, v: O(n) per-token arrays and per-tile block lists, built on device.

Per-token arrays mask partial tiles in the kernel; block lists (from `BlockLayout.from_intervals`) say which tiles
to visit. Every array is broadcast to one leading shape `[Bm, Hm]` (Bm in {1, B}, Hm in {1, H}) so that a kernel
indexes all of them with the same (b', h').

The kernel's element rule is the Intervals rule without the global-*query* clause (global rows are recomputed by
a dense pass, as in the XLA executor), plus BigBird random tiles:

    valid(i) and valid(j) and (lo[i] <= j <= hi[i] or global(j) or random_tile(i, j))
    and (not causal or j <= i) and (no labels or labels[i] & labels[j] != 0)
    and (not exclude or excluded[i] & labels[j] == 0)
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from sparse_attn.patterns.block_layout import BlockLayout
from sparse_attn.patterns.intervals import Intervals

VALID, GLOBAL = 1, 2  # bits of `tok`


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TokenMeta:
    """Per-token arrays, padded to Np (padding: invalid, empty range).

    Attributes:
      lo, hi: int32[Bm, Hm, Np] inclusive key range of each query.
      tok: int32[Bm, Np] bit 0 valid, bit 1 global key.
      labels: int32[Bm, Hm, W, Np] label bitmask words (uint32 bit patterns) or None.
      causal: static.
      exclude: static. With it `labels` holds 2W words per token: its labels, then the labels a query excludes —
        (i, j) is allowed only if no excluded word of i meets a label word of j (the bucketed executor's
        lowest-shared-label dedup, run in bucket-entry space by `executors/labels/pallas.py`).
    """

    lo: jax.Array
    hi: jax.Array
    tok: jax.Array
    labels: jax.Array | None
    causal: bool = dataclasses.field(metadata=dict(static=True))
    exclude: bool = dataclasses.field(default=False, metadata=dict(static=True))

    @property
    def lead(self) -> tuple[int, int]:
        return self.lo.shape[:2]


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class TileLists:
    """One layout's lists, lead [Bm, Hm]. Forward/dQ walk `kv_*` (masked) then `full_*`; dK/dV walk `q_*`, `full_q_*`.

    `*_rand` (int32, same shape as the index list, or None) flags a partial tile that is a BigBird random tile: all of
    it is allowed before validity, causality and labels. Lists are exact (width = all tiles); the Mosaic kernels
    merge partial and full lists into one capped list (`merged`, `capacity`) because they walk it as a grid axis.
    """

    kv_count: jax.Array
    kv_idx: jax.Array
    kv_rand: jax.Array | None
    full_count: jax.Array
    full_idx: jax.Array
    q_count: jax.Array
    q_idx: jax.Array
    q_rand: jax.Array | None
    full_q_count: jax.Array
    full_q_idx: jax.Array
    block_q: int = dataclasses.field(metadata=dict(static=True))
    block_k: int = dataclasses.field(metadata=dict(static=True))


def split_pattern(pattern) -> tuple[Intervals, jax.Array | None, int, tuple[int, int] | None]:
    """(mask, random_blocks, max_random, pinned tile sizes) of an Intervals or BlockLayout."""
    if isinstance(pattern, Intervals):
        return pattern, None, 0, None
    pinned = (pattern.block_q, pattern.block_k) if pattern.random_blocks is not None else None
    return pattern.mask, pattern.random_blocks, pattern.max_random, pinned


def lead_shape(mask: Intervals, random_blocks: jax.Array | None) -> tuple[int, int]:
    shapes = [mask.lo.shape[:2]]
    if mask.valid_len is not None:
        shapes.append((mask.valid_len.shape[0], 1))
    if mask.global_tokens is not None:
        shapes.append((mask.global_tokens.shape[0], 1))
    if mask.label_bits is not None:
        shapes.append(mask.label_bits.shape[:2])
    if random_blocks is not None:
        shapes.append(random_blocks.shape[:2])
    return jnp.broadcast_shapes(*shapes)


def token_meta(mask: Intervals, lead: tuple[int, int], n_pad: int) -> TokenMeta:
    n = mask.num_tokens
    pad = n_pad - n
    lo, hi = mask.bounds()  # cut to the declared reach (part of the element rule)
    lo = jnp.pad(jnp.broadcast_to(lo, lead + (n,)), ((0, 0), (0, 0), (0, pad)), constant_values=1)
    hi = jnp.pad(jnp.broadcast_to(hi, lead + (n,)), ((0, 0), (0, 0), (0, pad)), constant_values=0)
    pos = jnp.arange(n, dtype=jnp.int32)[None]
    valid = jnp.ones((1, n), bool) if mask.valid_len is None else pos < mask.valid_len.reshape(-1, 1)
    tok = valid.astype(jnp.int32) * VALID
    if mask.global_tokens is not None:
        tok = tok + (mask.global_tokens & valid).astype(jnp.int32) * GLOBAL
    tok = jnp.pad(jnp.broadcast_to(tok, (lead[0], n)), ((0, 0), (0, pad)))
    labels = None
    if mask.label_bits is not None:
        lb = jax.lax.bitcast_convert_type(mask.label_bits, jnp.int32)  # bit tests are sign-agnostic
        lb = jnp.swapaxes(jnp.broadcast_to(lb, lead + lb.shape[2:]), -1, -2)
        labels = jnp.pad(lb, ((0, 0), (0, 0), (0, 0), (0, pad)))
    return TokenMeta(lo.astype(jnp.int32), hi.astype(jnp.int32), tok, labels, mask.causal)


def tile_lists(mask: Intervals, random_blocks, max_random: int, lead, block_q: int, block_k: int) -> TileLists:
    layout = BlockLayout.from_intervals(
        mask, block_q, block_k, random_blocks=random_blocks, max_random=max_random, global_rows=False
    )

    def b(x):
        return jnp.broadcast_to(x, lead + x.shape[2:])

    kv_rand = q_rand = None
    if random_blocks is not None:
        rb = b(random_blocks).astype(jnp.int32)
        kv_rand = _flag_slots(rb, b(layout.kv_idx), b(layout.kv_count))
        q_rand = _flag_slots(jnp.swapaxes(rb, -1, -2), b(layout.q_idx), b(layout.q_count))
    return TileLists(
        b(layout.kv_count), b(layout.kv_idx), kv_rand, b(layout.full_count), b(layout.full_idx),
        b(layout.q_count), b(layout.q_idx), q_rand, b(layout.full_q_count), b(layout.full_q_idx),
        block_q, block_k,
    )  # fmt: skip


def _flag_slots(flags_BxHxRxM, idx_BxHxRxC, count_BxHxR):
    got = jnp.take_along_axis(flags_BxHxRxM, idx_BxHxRxC, axis=-1)
    slot = jnp.arange(idx_BxHxRxC.shape[-1], dtype=jnp.int32).reshape(1, 1, 1, -1)
    return jnp.where(slot < count_BxHxR[..., None], got, 0)


def merged(count_p, idx_p, rand_p, count_f, idx_f, cap: int):
    """One list of width `cap`: partial tiles, then full ones, padded with the last (re-reading a loaded tile).

    Returns (count, idx, masked, rand) with masked/rand int32 flags per slot (rand None when rand_p is None).
    """
    t = jnp.arange(cap, dtype=jnp.int32).reshape((1,) * count_p.ndim + (cap,))
    cp, cf = count_p[..., None], count_f[..., None]
    from_p = t < cp
    take = lambda x, s: jnp.take_along_axis(x, jnp.clip(s, 0, x.shape[-1] - 1), axis=-1)  # noqa: E731
    ts = jnp.broadcast_to(t, idx_p.shape[:-1] + (cap,))
    idx = jnp.where(from_p, take(idx_p, ts), take(idx_f, ts - cp))
    total = cp + cf
    last = jnp.take_along_axis(idx, jnp.clip(total - 1, 0, cap - 1), axis=-1)
    idx = jnp.where(t < total, idx, last)
    rand = None if rand_p is None else jnp.where(from_p, take(rand_p, ts), 0)
    return jnp.minimum(total[..., 0], cap), idx, from_p.astype(jnp.int32), rand


def capacity(mask: Intervals, random: bool, max_random: int, block_q: int, block_k: int, transposed: bool) -> int:
    """Static bound on tiles in one (merged) list: from `reach`, global keys and random tiles."""
    n = mask.num_tokens
    rows, cols = (block_k, block_q) if transposed else (block_q, block_k)
    width = math.ceil(n / cols)
    if mask.reach is None:
        return width
    if transposed and (mask.global_tokens is not None or random):
        return width  # every query tile may visit a global or random key tile
    left, right = mask.reach
    span = math.ceil((rows + left + right - 1) / cols) + 1
    extra = 0 if transposed else min(mask.max_global, width) + max_random
    return min(width, span + extra)

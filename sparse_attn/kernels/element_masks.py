"""What the kernels read for a `MaskFnPattern`: its block lists and the element masks of its partial tiles.

A mask function cannot run inside a kernel in general (it may gather from its buffers anywhere), so, as splash
attention stores its partial mask blocks, the predicate is evaluated once per listed partial tile on device and the
kernels read that tile: int8 [bq, bk] per (batch', head', query block, partial slot), so O(B' H' Qb C bq bk) bytes
for C partial key blocks per query block (a causal window of radius 128 or 256 in 128-token blocks has C = 2: 32 MiB
at n = 131072, by count). Full tiles need no mask; dK/dV walk the transposed lists and read the same tiles
transposed (`bwd_slot`).
"""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sparse_attn.kernels.metadata import TileLists
from sparse_attn.patterns.block_layout import compact_flags
from sparse_attn.patterns.mask_pattern import CHUNK_ELEMENTS, FULL, PARTIAL, MaskFnPattern, tile_mask


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class ElementMasks:
    """Partial tiles' element masks, in place of `TokenMeta` for mask-function patterns.

    Attributes:
      tiles: int8[T, bq, bk] (1 = allowed; positions past the lengths 0).
      fwd_slot: int32[Bm, Hm, Qb, C] row of `tiles` for each partial slot of the forward lists.
      bwd_slot: int32[Bm, Hm, Kb, Cq] row of `tiles` for each partial slot of the transposed lists.
    """

    tiles: jax.Array
    fwd_slot: jax.Array
    bwd_slot: jax.Array

    @property
    def lead(self) -> tuple[int, int]:
        return self.fwd_slot.shape[:2]


def kernel_flags(meta, score) -> dict:
    """The kernels' static arguments for a mask source (`TokenMeta` or `ElementMasks`) and a score function."""
    if isinstance(meta, ElementMasks):
        return dict(causal=False, labels=False, exclude=False, stored=True, score=score)
    return dict(causal=meta.causal, labels=meta.labels is not None, exclude=meta.exclude, stored=False, score=score)


def lists_and_masks(pattern: MaskFnPattern, lead: tuple[int, int]) -> tuple[TileLists, ElementMasks, jax.Array]:
    """(tile lists, element masks, overflow bool[Bm, Hm, Qb]) for the pattern's blocks, broadcast to `lead` =
    (Bm, Hm). Counts are cut to the list widths (the overflowing query blocks' rows are NaN in the executor)."""
    state = jnp.broadcast_to(pattern.block_state, lead + pattern.block_state.shape[2:])
    b = lambda x: jnp.broadcast_to(x, lead + x.shape[2:])  # noqa: E731
    kv_idx, full_idx = _at_least_one(b(pattern.kv_idx)), _at_least_one(b(pattern.full_idx))
    cp, cf = pattern.kv_idx.shape[-1], pattern.full_idx.shape[-1]
    overflow = (b(pattern.kv_count) > cp) | (b(pattern.full_count) > cf)
    kv_count, full_count = jnp.minimum(b(pattern.kv_count), cp), jnp.minimum(b(pattern.full_count), cf)

    partial_t, full_t = jnp.swapaxes(state == PARTIAL, -1, -2), jnp.swapaxes(state == FULL, -1, -2)
    widths = [_width(x) for x in (partial_t, full_t)]
    q_count, q_idx, _ = compact_flags(partial_t, widths[0])
    full_q_count, full_q_idx, _ = compact_flags(full_t, widths[1])
    q_idx, full_q_idx = _at_least_one(q_idx), _at_least_one(full_q_idx)
    lists = TileLists(kv_count, kv_idx, None, full_count, full_idx, q_count, q_idx, None, full_q_count, full_q_idx,
                      pattern.block_q, pattern.block_k)  # fmt: skip

    bm, hm, nqb, width = kv_idx.shape
    rows = jnp.arange(bm * hm, dtype=jnp.int32).reshape(bm, hm, 1, 1) * nqb
    qb = jnp.arange(nqb, dtype=jnp.int32).reshape(1, 1, -1, 1)
    fwd_slot = (rows + qb) * width + jnp.arange(width, dtype=jnp.int32).reshape(1, 1, 1, -1)
    # A transposed partial entry (key block kb, query block qb) reads the forward tile of qb's slot holding kb: its
    # rank among qb's partial blocks.
    rank = jnp.cumsum(state == PARTIAL, axis=-1, dtype=jnp.int32) - 1  # [Bm, Hm, Qb, Kb]
    slot = jnp.take_along_axis(jnp.swapaxes(rank, -1, -2), q_idx, axis=-1)  # [Bm, Hm, Kb, Cq]
    bwd_slot = (rows + q_idx) * width + jnp.clip(slot, 0, width - 1)
    return lists, ElementMasks(_tiles(pattern, kv_idx, kv_count), fwd_slot, bwd_slot), overflow


def _width(flags) -> int:
    """A transposed list's width: the exact maximum when known on the host, else every block."""
    try:
        return max(int(jnp.max(jnp.sum(flags, axis=-1))), 1)
    except jax.errors.ConcretizationTypeError:
        return flags.shape[-1]


def _at_least_one(idx):
    """Lists of width 0 get one (never read) slot: refs of size 0 are not portable."""
    return idx if idx.shape[-1] else jnp.zeros(idx.shape[:-1] + (1,), jnp.int32)


def _tiles(pattern: MaskFnPattern, kv_idx, kv_count) -> jax.Array:
    """int8[Bm * Hm * Qb * C, bq, bk]: the predicate on every listed partial tile (unused slots 0)."""
    bm, hm, nqb, width = kv_idx.shape
    bq, bk = pattern.block_q, pattern.block_k
    reads_b, reads_h = pattern.block_state.shape[0] > 1, pattern.block_state.shape[1] > 1

    def one(b, h, qb, t):
        q = qb * bq + jnp.arange(bq, dtype=jnp.int32)
        k = kv_idx[b, h, qb, t] * bk + jnp.arange(bk, dtype=jnp.int32)
        ok = tile_mask(pattern.predicate, pattern.buffers, b if reads_b else 0, h if reads_h else 0,
                       jnp.minimum(q, pattern.q_len - 1), jnp.minimum(k, pattern.kv_len - 1))  # fmt: skip
        ok = ok & (q < pattern.q_len)[:, None] & (k < pattern.kv_len)[None, :] & (t < kv_count[b, h, qb])
        return ok.astype(jnp.int8)

    ix = [jnp.arange(x, dtype=jnp.int32) for x in (bm, hm, nqb, width)]
    flat = tuple(g.reshape(-1) for g in jnp.meshgrid(*ix, indexing="ij"))
    per_step = max(1, CHUNK_ELEMENTS // (bq * bk))  # the predicate's peak memory, as in `from_mask_fn`
    return jax.lax.map(lambda t: one(*t), flat, batch_size=min(per_step, flat[0].shape[0]))

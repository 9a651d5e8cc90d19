"""Block-sparse layout (FlexAttention-style), built on device from an Intervals pattern, never from a dense mask.

Per query block: a list of partial key blocks (masked in the kernel by the element rule) and a list of full key
blocks (no mask needed); per key block the transposed lists that a dK/dV pass walks. Widths are static
capacities, counts are dynamic, so data-dependent patterns never recompile. Blocks that do not fit a capacity are
counted in `overflow`, never dropped silently.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from sparse_attn.patterns import common
from sparse_attn.patterns.intervals import Intervals

_BIG = jnp.iinfo(jnp.int32).max // 2


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class BlockLayout:
    """Block lists over an element rule.

    Attributes:
      mask: the Intervals element rule.
      random_blocks: bool[B|1, H|1, Qb, Kb] extra blocks allowed whole (BigBird), subject to validity, causality and
        labels; None for none.
      kv_count, kv_idx: int32[B', H', Qb], int32[B', H', Qb, C] partial key blocks of each query block (ascending).
      full_count, full_idx: int32[B', H', Qb], int32[B', H', Qb, Cf] full key blocks (empty when not split).
      q_count, q_idx, full_q_count, full_q_idx: the transposed lists, per key block its query blocks.
      overflow: int32[] blocks that did not fit a capacity (0 when the lists are exact).
      block_q, block_k: static block sizes.
      max_random: static upper bound on random blocks per query block (sizes static gathers).
    """

    mask: Intervals
    random_blocks: jax.Array | None
    kv_count: jax.Array
    kv_idx: jax.Array
    full_count: jax.Array
    full_idx: jax.Array
    q_count: jax.Array
    q_idx: jax.Array
    full_q_count: jax.Array
    full_q_idx: jax.Array
    overflow: jax.Array
    block_q: int = dataclasses.field(metadata=dict(static=True))
    block_k: int = dataclasses.field(metadata=dict(static=True))
    max_random: int = dataclasses.field(default=0, metadata=dict(static=True))

    @property
    def num_tokens(self) -> int:
        return self.mask.num_tokens

    def validate(self, batch: int | None = None, heads: int | None = None) -> BlockLayout:
        self.mask.validate(batch, heads)
        if self.random_blocks is not None:
            common.check_lead("BlockLayout.random_blocks", self.random_blocks.shape, batch, heads)
        if common.is_concrete(self.overflow) and int(self.overflow) > 0:
            raise ValueError(f"BlockLayout: {int(self.overflow)} key blocks exceed the list capacity")
        return self

    def allowed(self, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """bool[B', H', X, Q, K]: the element rule (Intervals rule or a random block)."""
        ok = self.mask.allowed(q_pos, k_pos)
        if self.random_blocks is None:
            return ok
        return ok | self.random_allowed(q_pos, k_pos)

    def random_allowed(self, q_pos: jax.Array, k_pos: jax.Array) -> jax.Array:
        """bool[B', H', X, Q, K]: pairs allowed through a random block (validity, causality, labels applied)."""
        rb = self.random_blocks
        qb = q_pos[..., :, None] // self.block_q
        kb = k_pos[..., None, :] // self.block_k
        lead = jnp.broadcast_shapes(rb.shape[:2], q_pos.shape[:2], k_pos.shape[:2])
        rb = jnp.broadcast_to(rb, lead + rb.shape[2:])
        flat = rb.reshape(lead + (-1,))
        lin = jnp.broadcast_to(qb * rb.shape[-1] + kb, lead + jnp.broadcast_shapes(qb.shape, kb.shape)[2:])
        ok = jnp.take_along_axis(flat, lin.reshape(lead + (-1,)), axis=-1).reshape(lin.shape)
        qi, kj = q_pos[..., :, None], k_pos[..., None, :]
        m = self.mask
        if m.causal:
            ok = ok & (kj <= qi)
        vl = m.num_tokens if m.valid_len is None else m.valid_len.reshape(-1, 1, 1, 1, 1)
        ok = ok & (qi < vl) & (kj < vl)
        if m.label_bits is not None:
            ok = ok & m.labels_share(q_pos, k_pos)
        return ok

    def to_dense(self) -> jax.Array:
        n = self.num_tokens
        pos = jnp.arange(n, dtype=jnp.int32).reshape(1, 1, 1, n)
        return self.allowed(pos, pos)[:, :, 0]

    @classmethod
    def from_intervals(
        cls,
        mask: Intervals,
        block_q: int,
        block_k: int,
        *,
        random_blocks: jax.Array | None = None,
        max_random: int = 0,
        capacity: int | None = None,
        split_full: bool = True,
        global_rows: bool = True,
    ) -> BlockLayout:
        """Classifies blocks from O(n) interval bounds and compacts them into lists.

        Args:
          capacity: static width of the per-query-block lists (default: all key blocks, exact).
          split_full: put full blocks in their own list; if False, `kv_*` lists every non-empty block.
          global_rows: include the blocks that global query rows need (all of them); executors that compute global
            rows in a separate dense pass pass False.
        """
        partial, full = classify_blocks(mask, block_q, block_k, random_blocks, global_rows=global_rows)
        if not split_full:
            partial, full = partial | full, jnp.zeros_like(full)
        nqb, nkb = partial.shape[-2:]
        cap = nkb if capacity is None else min(capacity, nkb)
        kv_count, kv_idx, o1 = compact_flags(partial, cap)
        full_count, full_idx, o2 = compact_flags(full, cap if split_full else 0)
        q_count, q_idx, o3 = compact_flags(jnp.swapaxes(partial, -1, -2), nqb)
        full_q_count, full_q_idx, o4 = compact_flags(jnp.swapaxes(full, -1, -2), nqb if split_full else 0)
        return cls(
            mask=mask,
            random_blocks=random_blocks,
            kv_count=kv_count,
            kv_idx=kv_idx,
            full_count=full_count,
            full_idx=full_idx,
            q_count=q_count,
            q_idx=q_idx,
            full_q_count=full_q_count,
            full_q_idx=full_q_idx,
            overflow=o1 + o2 + o3 + o4,
            block_q=block_q,
            block_k=block_k,
            max_random=max_random,
        )


def compact_flags(flag_BxHxRxM: jax.Array, cap: int) -> tuple[jax.Array, jax.Array, jax.Array]:
    """Indices of True entries, ascending, padded by repeating the last one (so padding re-reads a loaded block)."""
    count = jnp.sum(flag_BxHxRxM, axis=-1, dtype=jnp.int32)
    order = jnp.argsort(~flag_BxHxRxM, axis=-1, stable=True).astype(jnp.int32)[..., :cap]
    last = jnp.take_along_axis(order, jnp.clip(count - 1, 0, max(cap - 1, 0))[..., None], axis=-1) if cap else order
    slot = jnp.arange(cap, dtype=jnp.int32).reshape((1,) * count.ndim + (cap,))
    idx = jnp.where(slot < count[..., None], order, last) if cap else order
    overflow = jnp.sum(jnp.maximum(count - cap, 0))
    return count, idx, overflow


def classify_blocks(
    mask: Intervals,
    block_q: int,
    block_k: int,
    random_blocks: jax.Array | None = None,
    *,
    global_rows: bool = True,
) -> tuple[jax.Array, jax.Array]:
    """(partial, full): bool[B', H', Qb, Kb] from per-block interval bounds, in O(n + Qb*Kb)."""
    n = mask.num_tokens
    nqb, nkb = math.ceil(n / block_q), math.ceil(n / block_k)
    pad = nqb * block_q - n
    vl = jnp.full((1,), n, jnp.int32) if mask.valid_len is None else mask.valid_len.astype(jnp.int32)
    vl_b = vl.reshape(-1, 1, 1, 1)

    row = jnp.arange(nqb * block_q, dtype=jnp.int32).reshape(1, 1, nqb, block_q)
    lo, hi = mask.bounds()  # cut to the declared reach, as the element rule does
    lo = jnp.pad(lo, ((0, 0), (0, 0), (0, pad)), constant_values=1).reshape(lo.shape[:2] + (nqb, block_q))
    hi = jnp.pad(hi, ((0, 0), (0, 0), (0, pad)), constant_values=0).reshape(lo.shape)
    row_valid = row < vl.reshape(-1, 1, 1, 1)  # [B|1, 1, Qb, bq]
    live = (lo <= hi) & row_valid
    min_lo = jnp.min(jnp.where(live, lo, _BIG), axis=-1)[..., None]
    max_hi = jnp.max(jnp.where(live, hi, -1), axis=-1)[..., None]
    max_lo = jnp.max(jnp.where(live, lo, _BIG), axis=-1)[..., None]
    min_hi = jnp.min(jnp.where(live, hi, -1), axis=-1)[..., None]
    all_live = jnp.all(live, axis=-1)[..., None]
    any_valid_row = jnp.any(row_valid, axis=-1)[..., None]  # [B|1, 1, Qb, 1]
    all_valid_row = jnp.all(row_valid, axis=-1)[..., None]

    k0 = (jnp.arange(nkb, dtype=jnp.int32) * block_k).reshape(1, 1, 1, nkb)
    k1 = jnp.minimum(k0 + block_k - 1, n - 1)
    key_any = k0 < vl_b
    key_all = (k0 + block_k - 1 < vl_b) & (k0 + block_k <= n)
    q0 = (jnp.arange(nqb, dtype=jnp.int32) * block_q).reshape(1, 1, nqb, 1)
    q1 = jnp.minimum(q0 + block_q - 1, jnp.minimum(n, vl_b) - 1)

    partial = (k0 <= max_hi) & (k1 >= min_lo)
    full = all_live & (max_lo <= k0) & (min_hi >= k0 + block_k - 1)
    wide = jnp.zeros_like(partial)  # blocks allowed beyond the interval clause
    wide_full = jnp.zeros_like(partial)
    if mask.global_tokens is not None:
        g = jnp.pad(mask.global_tokens, ((0, 0), (0, nkb * block_k - n)))
        gk = jnp.any(g.reshape(-1, 1, 1, nkb, block_k), axis=-1)
        wide = wide | gk
        if global_rows:
            gq = jnp.any(jnp.pad(mask.global_tokens, ((0, 0), (0, pad))).reshape(-1, 1, nqb, block_q), -1)
            wide = wide | gq[..., None]
    if random_blocks is not None:
        wide = wide | random_blocks
        wide_full = wide_full | (random_blocks & all_valid_row & key_all)
    partial = (partial | wide) & key_any & any_valid_row
    full = (full | wide_full) & key_all
    if mask.causal:
        partial = partial & (k0 <= q1)
        full = full & (k0 + block_k - 1 <= q0)
    if mask.label_bits is not None:
        partial = partial & _label_summaries_meet(mask.label_bits, block_q, block_k, n)
        full = jnp.zeros_like(full)
    full = full & partial
    return partial & ~full, full


def _label_summaries_meet(bits_BxHxNxW: jax.Array, block_q: int, block_k: int, n: int) -> jax.Array:
    """bool[B|1, H|1, Qb, Kb]: the OR of a query block's label bits meets the OR of a key block's."""
    nqb, nkb = math.ceil(n / block_q), math.ceil(n / block_k)

    def summary(blk: int, nb: int) -> jax.Array:
        b = jnp.pad(bits_BxHxNxW, ((0, 0), (0, 0), (0, nb * blk - n), (0, 0)))
        b = b.reshape(b.shape[:2] + (nb, blk, b.shape[-1]))
        return jax.lax.reduce(b, jnp.uint32(0), jax.lax.bitwise_or, (3,))

    sq, sk = summary(block_q, nqb), summary(block_k, nkb)
    return jnp.any((sq[:, :, :, None, :] & sk[:, :, None, :, :]) != 0, axis=-1)

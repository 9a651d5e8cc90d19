"""What the block-selecting mechanisms (MoBA, NSA's selection branch) share: attention over a block selection
(`patterns.block_select`) through the entry point, its keys per query and its selected-block statistics."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp

from sparse_attn.attention import attention
from sparse_attn.patterns.block_select import check_blocks, layout_from_selection, num_blocks

# Selected-block histogram: the fraction of kept blocks at each distance (in blocks) from the query's own block.
DISTANCE_BUCKETS = (("0", 0, 0), ("1", 1, 1), ("2-3", 2, 3), ("4-7", 4, 7), ("8+", 8, None))


@dataclasses.dataclass(frozen=True)
class Blocks:
    """A selection's static shape: key blocks of `block_size`, query groups of `query_block`, layout `tile`s,
    `top_k` blocks a group (its own included)."""

    block_size: int
    query_block: int
    tile: int
    top_k: int

    @classmethod
    def of(cls, block_size: int, query_block: int | None, tile: int | None, top_k: int) -> Blocks:
        return cls(*check_blocks(block_size, query_block, tile), top_k)


def _fold_heads(x_BxNxCxD: jax.Array, h: int) -> jax.Array:
    """[B, N, C, D] -> [B * H, N, 1, D], each KV head repeated for the H / C query heads that read it."""
    b, n, c, d = x_BxNxCxD.shape
    x = jnp.repeat(x_BxNxCxD, h // c, axis=2) if c != h else x_BxNxCxD
    return jnp.moveaxis(x, 2, 1).reshape(b * h, n, 1, d)


def selected_attention(
    q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, selected_BxHxQsxKb, blocks: Blocks, *, causal: bool, valid_len=None,
    implementation: str | None = None, **options,
) -> jax.Array:  # fmt: skip
    """out [B, N, H, D]: attention over the layout of `selected` through `attention(..., implementation,
    **options)` (options: the executor's, e.g. a `KernelConfig` as `config` for "pallas").

    Every (batch, query head) runs as its own batch row with one head (K/V repeated per query head, as the
    reference executor does), because the "xla" executor gathers a BlockLayout's random blocks of pattern head 0
    for every head; per-head selections need per-row layouts until it gathers them per head.
    """
    b, n, h, d = q_BxNxHxD.shape
    sel = jnp.broadcast_to(selected_BxHxQsxKb, (b, h) + selected_BxHxQsxKb.shape[2:])
    sel = sel.reshape((b * h, 1) + sel.shape[2:])
    vl = None if valid_len is None else jnp.repeat(jnp.broadcast_to(valid_len, (b,)), h)
    layout = layout_from_selection(
        sel, n, blocks.top_k, blocks.block_size, query_block=blocks.query_block, tile=blocks.tile, causal=causal,
        valid_len=vl,
    )  # fmt: skip
    o = attention(
        _fold_heads(q_BxNxHxD, h), _fold_heads(k_BxNxGxD, h), _fold_heads(v_BxNxGxD, h), layout,
        implementation=implementation, **options,
    )  # fmt: skip
    return jnp.moveaxis(o.reshape(b, h, n, d), 1, 2)


def selected_key_counts(selected_BxHxQsxKb, n: int, blocks: Blocks, *, causal: bool, valid_len=None):
    """int32[B', H', N]: keys each query attends, in O(N * Kb) from the selection (0 at padded queries): its
    own block's keys (causal: up to itself) plus every valid key of its other selected blocks."""
    bs, qb = blocks.block_size, blocks.query_block
    nkb = num_blocks(n, bs)
    vl = jnp.full((1,), n, jnp.int32) if valid_len is None else jnp.asarray(valid_len, jnp.int32)
    k0 = jnp.arange(nkb, dtype=jnp.int32) * bs
    block_keys = jnp.clip(jnp.minimum(vl[:, None], n) - k0[None, :], 0, bs)  # [B|1, Kb]
    i = jnp.arange(n, dtype=jnp.int32)
    own = i // bs
    sel = selected_BxHxQsxKb[..., i // qb, :]  # [B', H', N, Kb]
    not_own_NxKb = own[:, None] != jnp.arange(nkb)[None, :]
    other = jnp.where(sel & not_own_NxKb[None, None], block_keys[:, None, None, :], 0).sum(-1)
    own_keys = (i - own * bs + 1)[None, None] if causal else block_keys[:, None, own]
    live = (i[None, :] < vl[:, None])[:, None]
    return jnp.where(live, own_keys + other, 0).astype(jnp.int32)


def selection_stats(selected_BxHxQsxKb, n: int, blocks: Blocks, valid_len) -> dict:
    """`blocks_per_query` (kept per valid query group, own included) and the selected-block histogram
    `selected_dist_{lo}-{hi}`: the fraction of kept blocks lying that many blocks from the group's own block."""
    bs, qb = blocks.block_size, blocks.query_block
    vl = jnp.asarray(valid_len, jnp.int32).reshape(-1)
    nqs, nkb = selected_BxHxQsxKb.shape[2:]
    q0 = jnp.arange(nqs) * qb
    groups = q0[None, None, :, None] < vl[:, None, None, None]  # [B, 1, Qs, 1]
    kept = selected_BxHxQsxKb & groups
    total = jnp.maximum(jnp.sum(kept, dtype=jnp.float32), 1.0)
    num_groups = jnp.sum(groups) * selected_BxHxQsxKb.shape[1]
    out = {"blocks_per_query": (jnp.sum(kept, dtype=jnp.float32) / jnp.maximum(num_groups, 1)).astype(jnp.float32)}
    dist = jnp.abs((q0 // bs)[:, None] - jnp.arange(nkb)[None, :])  # [Qs, Kb]
    for label, lo, hi in DISTANCE_BUCKETS:
        in_bucket = (dist >= lo) & (dist <= (nkb if hi is None else hi))
        out[f"selected_dist_{label}"] = jnp.sum(kept & in_bucket[None, None], dtype=jnp.float32) / total
    return out

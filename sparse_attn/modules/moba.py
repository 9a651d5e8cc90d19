"""MoBA, Mixture of Block Attention (Lu et al., Moonshot AI, 2025, arXiv 2502.13189): a parameter-free top-k gate
over key blocks (docs/moba.md).

Keys are cut into blocks of `block_size` tokens. The gate scores key block j for a query by its dot product with
the block's mean key, `q · mean(K_j)` (float32, over the block's valid keys; per query head against the mean keys
of its KV head under GQA). Each query group keeps `top_k` blocks: its own block (attended causally when causal),
the first `sink_blocks` blocks, and the best-scored other eligible blocks (earlier ones when causal; ties go to the
lower block index). Selection has no gradient.

A query group is `query_block` consecutive queries (dividing `block_size`) sharing one selection, scored by the
mean of a window of Q queries (by linearity, the mean of their per-token scores): the group itself, or, when
causal, the Q queries ending at the group's first one, so that no output depends on a later token.
`query_block=1` is the paper's per-token rule exactly (its layout has one-token tiles: exact on every executor,
as costly as dense attention); the default, `query_block=block_size`, is the block-granular variant that
block-sparse executors run at `tile`-sized tiles. (The released MoBA kernel routes per token too; it groups, per
key block, the queries that chose it.) The selection becomes a `BlockLayout` (`patterns.block_select`) run by
`attention(..., implementation=config.implementation)`.
"""

from __future__ import annotations

import dataclasses
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_attn.modules.base import AttentionContext, AttentionOutput, Projections, check_floats, keys_per_query
from sparse_attn.modules.selected_blocks import Blocks, selected_attention, selected_key_counts, selection_stats
from sparse_attn.patterns import common
from sparse_attn.patterns.block_select import (
    check_blocks,
    check_top_k,
    layout_from_selection,
    num_blocks,
    select_blocks,
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class MobaAttentionConfig:
    """Attributes:
    block_size: key block size (MoBA's block); top_k: blocks per query group, own block and sinks included.
    query_block: queries that share one selection (divides block_size; None: block_size; 1: per token).
    tile: the layout's (and kernels') tile, dividing query_block (None: `patterns.block_select.check_blocks`);
      "pallas" on a GPU needs a power of two >= 16.
    causal: causal even in a bidirectional model (a causal model's layers always are).
    sink_blocks: the first blocks every query group keeps.
    num_kv_heads: GQA (None: num_heads); implementation: the BlockLayout executor (None: platform default).
    """

    mechanism: ClassVar[str] = "moba"

    block_size: int = 64
    top_k: int = 3
    query_block: int | None = None
    tile: int | None = None
    causal: bool = False
    sink_blocks: int = 0
    num_kv_heads: int | None = None
    implementation: str | None = None
    rope_base: float | None = 10_000.0

    def __post_init__(self):
        check_floats(self)
        check_blocks(self.block_size, self.query_block, self.tile)
        check_top_k(self.top_k, self.sink_blocks)
        common.static_int("num_kv_heads", self.num_kv_heads, low=1, none_ok=True)
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal must be a bool, got {self.causal!r}")

    @property
    def blocks(self) -> tuple[int, int, int]:
        """(block_size, query_block, tile) with the defaults filled in."""
        return check_blocks(self.block_size, self.query_block, self.tile)

    @property
    def selection(self) -> Blocks:
        return Blocks.of(self.block_size, self.query_block, self.tile, self.top_k)

    def make(self, model_dim: int, num_heads: int, *, rngs: nnx.Rngs) -> MobaAttention:
        return MobaAttention(self, model_dim, num_heads, rngs=rngs)


# -- the gate ---------------------------------------------------------------------------------------------------


def moba_scores(
    q_BxNxHxD: jax.Array,
    k_BxNxGxD: jax.Array,
    block_size: int,
    query_block: int,
    *,
    causal: bool,
    valid_len=None,
) -> jax.Array:
    """float32[B, H, Qs, Kb]: the gate, `mean(q over the group's window) · mean(K_j over its valid keys)`.

    The window of query group g (queries g*Q ... g*Q + Q - 1) is the group itself, or, when causal, the Q queries
    ending at its first one (g*Q - Q + 1 ... g*Q), so that no query's selection reads a later query; Q = 1 is the
    paper's per-token gate either way. Only valid positions are pooled (selected, never multiplied: NaN in padding
    reaches no score); an empty window or block scores 0. Query head h reads KV head h // (H / G).
    """
    b, n, h, d = q_BxNxHxD.shape
    g = k_BxNxGxD.shape[2]
    if h % g:
        raise ValueError(f"query heads ({h}) must be a multiple of KV heads ({g}) (num_kv_heads)")
    nqs, nkb = num_blocks(n, query_block), num_blocks(n, block_size)
    vl = jnp.full((b,), n, jnp.int32) if valid_len is None else jnp.broadcast_to(valid_len, (b,))
    vl = vl.astype(jnp.int32)

    live_BxN = jnp.arange(n, dtype=jnp.int32)[None, :] < vl[:, None]
    k = jnp.where(live_BxN[:, :, None, None], k_BxNxGxD.astype(jnp.float32), 0.0)
    k = jnp.pad(k, ((0, 0), (0, nkb * block_size - n), (0, 0), (0, 0))).reshape(b, nkb, block_size, g, d)
    k_cnt = jnp.pad(live_BxN, ((0, 0), (0, nkb * block_size - n))).reshape(b, nkb, block_size).sum(-1)
    kbar_BxKbxGxD = jnp.sum(k, axis=2) / jnp.maximum(k_cnt, 1).astype(jnp.float32)[:, :, None, None]

    start = jnp.arange(nqs, dtype=jnp.int32) * query_block - (query_block - 1 if causal else 0)
    pos_QsxQ = start[:, None] + jnp.arange(query_block, dtype=jnp.int32)[None, :]
    ok_BxQsxQ = (pos_QsxQ >= 0)[None] & (pos_QsxQ[None] < vl[:, None, None])
    q = q_BxNxHxD[:, jnp.clip(pos_QsxQ, 0, n - 1)].astype(jnp.float32)  # [B, Qs, Q, H, D]
    q = jnp.where(ok_BxQsxQ[..., None, None], q, 0.0)
    q_cnt = jnp.maximum(jnp.sum(ok_BxQsxQ, axis=-1), 1).astype(jnp.float32)
    qbar = (jnp.sum(q, axis=2) / q_cnt[:, :, None, None]).reshape(b, nqs, g, h // g, d)
    s = jnp.einsum("bqgrd,bkgd->bgrqk", qbar, kbar_BxKbxGxD, precision=jax.lax.Precision.HIGHEST)
    return jax.lax.stop_gradient(s.reshape(b, h, nqs, nkb))


def moba_selection(q_BxNxHxD, k_BxNxGxD, config: MobaAttentionConfig, *, causal: bool, valid_len=None):
    """bool[B, H, Qs, Kb]: the key blocks each query group of each head keeps (`patterns.block_select`)."""
    bs, qb, _ = config.blocks
    scores = moba_scores(q_BxNxHxD, k_BxNxGxD, bs, qb, causal=causal, valid_len=valid_len)
    n = q_BxNxHxD.shape[1]
    return select_blocks(
        scores, n, config.top_k, bs, query_block=qb, causal=causal, valid_len=valid_len,
        sink_blocks=config.sink_blocks,
    )  # fmt: skip


def moba_layout(selected_BxHxQsxKb, n: int, config: MobaAttentionConfig, *, causal: bool, valid_len=None):
    """The BlockLayout [B|1, H|1] of a selection: what `moba_core` runs (one row per batch and head), with
    `to_dense()` as its oracle."""
    bs, qb, tile = config.blocks
    return layout_from_selection(
        selected_BxHxQsxKb, n, config.top_k, bs, query_block=qb, tile=tile, causal=causal, valid_len=valid_len
    )


# -- the core and its statistics --------------------------------------------------------------------------------


def moba_core(
    q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, selected_BxHxQsxKb, config: MobaAttentionConfig, *, causal: bool, valid_len=None
) -> jax.Array:
    """out [B, N, H, D]: attention over the layout of `selected` (`selected_blocks.selected_attention`)."""
    return selected_attention(
        q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, selected_BxHxQsxKb, config.selection, causal=causal, valid_len=valid_len,
        implementation=config.implementation,
    )  # fmt: skip


def moba_stats(selected_BxHxQsxKb, n: int, config: MobaAttentionConfig, *, causal: bool, valid_len) -> dict:
    """`keys_per_query` (common), `blocks_per_query` and the selected-block histogram (`selection_stats`)."""
    keys = selected_key_counts(selected_BxHxQsxKb, n, config.selection, causal=causal, valid_len=valid_len)
    vl = jnp.asarray(valid_len, jnp.int32).reshape(-1)
    return {"keys_per_query": keys_per_query(keys, vl), **selection_stats(selected_BxHxQsxKb, n, config.selection, vl)}


# -- the layer --------------------------------------------------------------------------------------------------


class MobaAttention(nnx.Module):
    """Projections (GQA, RoPE) -> MoBA gate on the rotated q, k -> block-sparse attention -> output projection."""

    def __init__(self, config: MobaAttentionConfig, model_dim: int, num_heads: int, *, rngs: nnx.Rngs):
        self.config = config
        self.proj = Projections(
            model_dim, num_heads, num_kv_heads=config.num_kv_heads, rope_base=config.rope_base, rngs=rngs
        )

    def __call__(self, x_BxNxD: jax.Array, ctx: AttentionContext) -> AttentionOutput:
        cfg = self.config
        q, k, v = self.proj.qkv(x_BxNxD)
        n = x_BxNxD.shape[1]
        causal = ctx.causal or cfg.causal
        vl = jnp.asarray(ctx.valid_len, jnp.int32)
        sel = moba_selection(q, k, cfg, causal=causal, valid_len=vl)
        o = moba_core(q, k, v, sel, cfg, causal=causal, valid_len=vl)
        stats = jax.lax.stop_gradient(moba_stats(sel, n, cfg, causal=causal, valid_len=vl))
        return AttentionOutput(y=self.proj.out(o), stats=stats)


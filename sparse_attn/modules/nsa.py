"""NSA, Native Sparse Attention (Yuan et al., DeepSeek, 2025, arXiv 2502.11089): three branches per query, mixed by
learned sigmoid gates (docs/nsa.md).

* **Compressed**: keys (and values) of overlapping blocks of `compress_block` tokens every `compress_stride`, each
  block mapped to one token by a learned MLP over its keys plus an intra-block position embedding (the paper's
  phi); a query attends every compressed token whose block has ended by it (`patterns.compressed`). These tokens
  form a prefix of a short stream (M ~ N / stride), so the branch runs as one dense masked softmax over [N, M]
  (an executor's band over sequence positions would read all N keys), whose probabilities also drive selection.
* **Selected**: the compressed probabilities, summed over the query heads of a GQA group (so the group shares its
  blocks) and spread over the selection blocks of `select_block` tokens by overlap (the paper's eq. 9), score the
  key blocks; each query group keeps `top_n` blocks: its own (causally), the first `sink_blocks`, the
  `recent_blocks` before its own and the best-scored others (`patterns.block_select`), run through
  `attention(..., implementation)` (`selected_blocks.selected_attention`). Selection has no gradient.
* **Window**: a causal (or two-sided) window of `window` tokens through `attention`, with the registry's counterpart
  of `implementation` for its `Intervals` (`executors.registry.counterpart`: the same name, which both pattern types
  register for "xla", "pallas" and "reference").

Each branch has its own key and value projections (the paper's guard against one branch's gradients shaping
another's keys); the queries are shared. Query groups are `query_block` consecutive queries sharing a selection,
scored (when causal) by the Q queries ending at the group's first one, as in `modules.moba`. The gates are
`sigmoid(Linear(x))` per head and branch: out = g_cmp o_cmp + g_slc o_slc + g_win o_win.
"""

from __future__ import annotations

import dataclasses
import math
from typing import ClassVar

import jax
import jax.numpy as jnp
from flax import nnx

from sparse_attn.attention import attention
from sparse_attn.executors import registry
from sparse_attn.executors.softmax import masked_softmax_parts
from sparse_attn.modules.base import AttentionContext, AttentionOutput, Projections, check_floats, keys_per_query
from sparse_attn.modules.selected_blocks import Blocks, selected_attention, selected_key_counts, selection_stats
from sparse_attn.patterns import common
from sparse_attn.patterns.baselines import sliding_window
from sparse_attn.patterns.block_select import check_blocks, check_top_k, num_blocks, select_blocks
from sparse_attn.patterns.compressed import (
    block_starts,
    check_compression,
    compressed_counts,
    num_compressed,
    overlap_weights,
)
from sparse_attn.patterns.stats import key_counts
from sparse_attn.rope import apply_rope

BRANCHES = ("cmp", "slc", "win")


@dataclasses.dataclass(frozen=True, kw_only=True)
class NsaAttentionConfig:
    """Attributes (the paper's defaults: l = 32, d = 16, l' = 64, n = 16 with 1 initial and 2 local blocks, w = 512):
    compress_block, compress_stride: l and d of the compressed tokens (1 <= d <= l).
    select_block: l', the selection blocks; top_n: blocks a query group keeps, own + sinks + recent included.
    query_block, tile: as `MobaAttentionConfig` (queries sharing a selection; the layout's tile).
    sink_blocks: the first blocks every group keeps; recent_blocks: the eligible blocks before the own one kept
      (own + recent = the paper's "local blocks").
    window: the sliding window's radius (0: the query alone).
    causal: causal even in a bidirectional model; num_kv_heads: GQA (None: num_heads); implementation: the
    executor of the selected branch's `BlockLayout` (None: the registry's default), whose counterpart runs the
    window's `Intervals` (module docstring).
    """

    mechanism: ClassVar[str] = "nsa"

    compress_block: int = 32
    compress_stride: int = 16
    select_block: int = 64
    top_n: int = 16
    query_block: int | None = None
    tile: int | None = None
    sink_blocks: int = 1
    recent_blocks: int = 1
    window: int = 512
    causal: bool = False
    num_kv_heads: int | None = None
    implementation: str | None = None
    rope_base: float | None = 10_000.0

    def __post_init__(self):
        check_floats(self)
        check_compression(self.compress_block, self.compress_stride)
        check_blocks(self.select_block, self.query_block, self.tile)
        check_top_k(self.top_n, self.sink_blocks, self.recent_blocks, name="top_n")
        common.static_int("window", self.window)
        common.static_int("num_kv_heads", self.num_kv_heads, low=1, none_ok=True)
        if not isinstance(self.causal, bool):
            raise ValueError(f"causal must be a bool, got {self.causal!r}")

    @property
    def selection(self) -> Blocks:
        return Blocks.of(self.select_block, self.query_block, self.tile, self.top_n)

    def make(self, model_dim: int, num_heads: int, *, rngs: nnx.Rngs) -> NsaAttention:
        return NsaAttention(self, model_dim, num_heads, rngs=rngs)


# -- compression ------------------------------------------------------------------------------------------------


class Compressor(nnx.Module):
    """phi: [compress_block keys of one head] + position embedding -> Linear(l*D, D) -> gelu -> Linear(D, D)."""

    def __init__(self, block: int, head_dim: int, *, rngs: nnx.Rngs):
        self.pos_LxD = nnx.Param(0.02 * jax.random.normal(rngs.params(), (block, head_dim)))
        self.w1 = nnx.Linear(block * head_dim, head_dim, rngs=rngs)
        self.w2 = nnx.Linear(head_dim, head_dim, rngs=rngs)

    def __call__(self, x_BxNxGxD: jax.Array, stride: int, valid_len_B: jax.Array) -> jax.Array:
        """[B, M, G, D]: one token per block; a block holding a padded key is computed from zeros (it is never
        attended, and NaN in padding cannot reach it)."""
        b, n, g, d = x_BxNxGxD.shape
        block = self.pos_LxD.shape[0]
        idx_MxL = block_starts(n, block, stride)[:, None] + jnp.arange(block, dtype=jnp.int32)[None, :]
        whole_BxM = idx_MxL[None, :, -1] < valid_len_B[:, None]
        x = x_BxNxGxD[:, idx_MxL] + self.pos_LxD[...][None, None, :, None, :]  # [B, M, L, G, D]
        x = jnp.where(whole_BxM[:, :, None, None, None], x, 0.0)
        x = jnp.moveaxis(x, 3, 2).reshape(b, idx_MxL.shape[0], g, block * d)
        return self.w2(jax.nn.gelu(self.w1(x)))


def compressed_attention(q_BxNxHxD, k_BxMxGxD, v_BxMxGxD, count_BxN, *, scale: float | None = None):
    """(out [B, N, H, D], p float32[B, H, N, M]): query i attends compressed tokens 0 ... count[i] - 1; rows with
    none give 0; p is the branch's attention probabilities (no gradient), what selection reads."""
    b, n, h, d = q_BxNxHxD.shape
    m, g = k_BxMxGxD.shape[1], k_BxMxGxD.shape[2]
    scale = 1.0 / math.sqrt(d) if scale is None else scale
    q = jnp.where((count_BxN > 0)[:, :, None, None], q_BxNxHxD, 0)  # rows that attend nothing (padding) read 0
    q = q.reshape(b, n, g, h // g, d).astype(jnp.float32)
    s = jnp.einsum("bngrd,bmgd->bgrnm", q, k_BxMxGxD.astype(jnp.float32)) * scale
    allowed = (jnp.arange(m)[None, None, :] < count_BxN[:, :, None])[:, None, None]  # [B, 1, 1, N, M]
    e, denom, _ = masked_softmax_parts(s, allowed)
    o = jnp.einsum("bgrnm,bmgd->bngrd", e, v_BxMxGxD.astype(jnp.float32)) / jnp.moveaxis(denom, 3, 1)
    p = jax.lax.stop_gradient((e / denom).reshape(b, h, n, m))
    return o.reshape(b, n, h, d).astype(q_BxNxHxD.dtype), p


# -- selection --------------------------------------------------------------------------------------------------


def nsa_scores(p_BxHxNxM, n: int, config: NsaAttentionConfig, num_kv_heads: int, *, causal: bool, valid_len=None):
    """float32[B, G, Qs, Kb]: selection-block importance, the compressed probabilities summed over the group's
    query heads and the group's query window (as `modules.moba.moba_scores`), spread over blocks by overlap."""
    b, h = p_BxHxNxM.shape[:2]
    bs, qb, _ = check_blocks(config.select_block, config.query_block, config.tile)
    nqs = num_blocks(n, qb)
    vl = jnp.full((b,), n, jnp.int32) if valid_len is None else jnp.broadcast_to(valid_len, (b,)).astype(jnp.int32)
    p = p_BxHxNxM.reshape(b, num_kv_heads, h // num_kv_heads, n, -1).sum(2)  # [B, G, N, M]
    start = jnp.arange(nqs, dtype=jnp.int32) * qb - (qb - 1 if causal else 0)
    pos_QsxQ = start[:, None] + jnp.arange(qb, dtype=jnp.int32)[None, :]
    ok_BxQsxQ = (pos_QsxQ >= 0)[None] & (pos_QsxQ[None] < vl[:, None, None])
    pw = jnp.where(ok_BxQsxQ[:, None, :, :, None], p[:, :, jnp.clip(pos_QsxQ, 0, n - 1)], 0.0).sum(3)
    w_MxKb = overlap_weights(n, config.compress_block, config.compress_stride, bs)
    return jnp.einsum("bgqm,mk->bgqk", pw, w_MxKb, precision=jax.lax.Precision.HIGHEST)


def nsa_selection(p_BxHxNxM, n: int, config: NsaAttentionConfig, num_kv_heads: int, *, causal: bool, valid_len=None):
    """bool[B, H, Qs, Kb]: the key blocks each query group keeps, the same for every head of a GQA group."""
    h = p_BxHxNxM.shape[1]
    scores = nsa_scores(p_BxHxNxM, n, config, num_kv_heads, causal=causal, valid_len=valid_len)
    sel = select_blocks(
        scores, n, config.top_n, config.select_block, query_block=config.selection.query_block, causal=causal,
        valid_len=valid_len, sink_blocks=config.sink_blocks, recent_blocks=config.recent_blocks,
    )  # fmt: skip
    return jnp.repeat(sel, h // num_kv_heads, axis=1)


def nsa_stats(count_BxN, selected_BxHxQsxKb, window_pattern, n: int, config, *, causal: bool, valid_len) -> dict:
    """`keys_per_query` (the three branches' keys added: what the attention FLOPs follow), each branch's share
    (`keys_cmp`, `keys_slc`, `keys_win`), and the selection's `blocks_per_query` and histogram."""
    vl = jnp.asarray(valid_len, jnp.int32).reshape(-1)
    slc = selected_key_counts(selected_BxHxQsxKb, n, config.selection, causal=causal, valid_len=vl)
    win, _ = key_counts(window_pattern)
    parts = {"keys_cmp": keys_per_query(count_BxN[:, None], vl), "keys_slc": keys_per_query(slc, vl),
             "keys_win": keys_per_query(win, vl)}  # fmt: skip
    total = parts["keys_cmp"] + parts["keys_slc"] + parts["keys_win"]
    return {"keys_per_query": total, **parts, **selection_stats(selected_BxHxQsxKb, n, config.selection, vl)}


# -- the layer --------------------------------------------------------------------------------------------------


class NsaAttention(nnx.Module):
    """Shared queries; per branch keys and values; compressed -> selected -> window; gated sum; output."""

    def __init__(self, config: NsaAttentionConfig, model_dim: int, num_heads: int, *, rngs: nnx.Rngs):
        self.config = config
        self.proj = Projections(  # q, o and the selected branch's k, v
            model_dim, num_heads, num_kv_heads=config.num_kv_heads, rope_base=config.rope_base, rngs=rngs
        )
        g, d = self.proj.num_kv_heads, self.proj.head_dim
        init = nnx.initializers.lecun_normal()
        lin = lambda: nnx.Linear(model_dim, g * d, use_bias=False, kernel_init=init, rngs=rngs)  # noqa: E731
        self.wk_cmp, self.wv_cmp, self.wk_win, self.wv_win = lin(), lin(), lin(), lin()
        self.phi_k = Compressor(config.compress_block, d, rngs=rngs)
        self.phi_v = Compressor(config.compress_block, d, rngs=rngs)
        self.gate = nnx.Linear(model_dim, 3 * num_heads, rngs=rngs)

    def _kv(self, wk, wv, x_BxNxD):
        b, n, _ = x_BxNxD.shape
        shape = (b, n, self.proj.num_kv_heads, self.proj.head_dim)
        return wk(x_BxNxD).reshape(shape), wv(x_BxNxD).reshape(shape)

    def _rope(self, x_BxNxGxD, positions_N):
        base = self.config.rope_base
        return x_BxNxGxD if base is None else apply_rope(x_BxNxGxD, positions_N[None], base)

    def __call__(self, x_BxNxD: jax.Array, ctx: AttentionContext) -> AttentionOutput:
        b, n, _ = x_BxNxD.shape
        q, k_slc, v_slc = self.proj.qkv(x_BxNxD)
        k_cmp, v_cmp = self._kv(self.wk_cmp, self.wv_cmp, x_BxNxD)
        k_win, v_win = self._kv(self.wk_win, self.wv_win, x_BxNxD)
        k_win = self._rope(k_win, jnp.arange(n, dtype=jnp.int32))
        gates = jax.nn.sigmoid(self.gate(x_BxNxD).astype(jnp.float32)).reshape(b, n, 3, self.proj.num_heads, 1)
        vl = jnp.broadcast_to(jnp.asarray(ctx.valid_len, jnp.int32), (b,))
        o, stats = self.core(q, (k_cmp, v_cmp), (k_slc, v_slc), (k_win, v_win), gates, vl,
                             causal=ctx.causal or self.config.causal)  # fmt: skip
        return AttentionOutput(y=self.proj.out(o), stats=stats)

    def core(self, q_BxNxHxD, cmp_kv, slc_kv, win_kv, gates_BxNx3xHx1, valid_len_B, *, causal: bool):
        """(o [B, N, H, D], stats): the three branches and their gated sum from the projected queries, each
        branch's (k, v) [B, N, G, D] (compression: raw, unrotated; selection and window: rotated) and the gates."""
        cfg = self.config
        b, n, h, _ = q_BxNxHxD.shape
        g = slc_kv[0].shape[2]
        vl, q, dt = valid_len_B, q_BxNxHxD, q_BxNxHxD.dtype
        blk, d = cfg.compress_block, cfg.compress_stride

        count = jnp.broadcast_to(compressed_counts(n, blk, d, causal=causal, valid_len=vl), (b, n))
        if num_compressed(n, blk, d) > 0:
            kc, vc = self.phi_k(cmp_kv[0], d, vl), self.phi_v(cmp_kv[1], d, vl)
            kc = self._rope(kc, jnp.asarray(block_starts(n, blk, d) + blk - 1))  # a block speaks from its last key
            o_cmp, p = compressed_attention(q, kc.astype(dt), vc.astype(dt), count)
        else:  # shorter than one compressed block: the branch is empty, selection falls back to sinks and recency
            o_cmp, p = jnp.zeros_like(q), jnp.zeros((b, h, n, 1), jnp.float32)
        sel = nsa_selection(p, n, cfg, g, causal=causal, valid_len=vl)
        o_slc = selected_attention(
            q, *slc_kv, sel, cfg.selection, causal=causal, valid_len=vl, implementation=cfg.implementation
        )
        win = sliding_window(n, cfg.window, causal=causal, valid_len=vl)
        win_impl = registry.counterpart(win, cfg.implementation)
        o_win = attention(q, win_kv[0].astype(dt), win_kv[1].astype(dt), win, implementation=win_impl)

        o = sum(gates_BxNx3xHx1[:, :, i] * o_ for i, o_ in enumerate((o_cmp, o_slc, o_win)))
        stats = nsa_stats(count, sel, win, n, cfg, causal=causal, valid_len=vl)
        live = (jnp.arange(n)[None] < vl[:, None])[:, :, None, None]
        for i, name in enumerate(BRANCHES):
            gate = jnp.where(live, gates_BxNx3xHx1[:, :, i], 0.0)
            stats[f"gate_{name}"] = jnp.sum(gate) / jnp.maximum(jnp.sum(vl) * h, 1)
        return o.astype(dt), jax.lax.stop_gradient(stats)

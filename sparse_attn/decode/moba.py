"""Decoder of MoBA (`modules.moba`): the full KV cache, each key block's running key sum, and the current query
group's selection.

A query group selects once, at its first query `q0`: its gate window (the Q queries ending at `q0`, kept in a
ring of the last Q rotated queries) is scored against the mean keys of the earlier blocks, which are complete by
then, so their running sums divided by the block size are the full pass's means; `patterns.block_select.
select_group` keeps the same blocks as the full pass's row. Every query of the group then attends its own block
up to itself and the kept blocks. Memory O(n) (any earlier block may be chosen), plus O(n / block) sums.
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparse_attn.decode.attend import attend, project, write_slot
from sparse_attn.decode.registry import DecodeContext
from sparse_attn.modules.moba import MobaAttention
from sparse_attn.patterns.block_select import num_blocks, select_group


def group_query_mean(ring_BxQxHxD, ring_pos_Q, q0):
    """float32[B, H, D]: the mean of the ring's queries at positions q0 - Q + 1 ... q0 (those that exist)."""
    q_len = ring_pos_Q.shape[0]
    ok = (ring_pos_Q >= 0) & (ring_pos_Q <= q0) & (ring_pos_Q > q0 - q_len)
    total = jnp.sum(jnp.where(ok[None, :, None, None], ring_BxQxHxD.astype(jnp.float32), 0.0), axis=1)
    return total / jnp.maximum(jnp.sum(ok), 1).astype(jnp.float32)


def selected_slots(sel_BxHxKb, pos, num_slots: int, block_size: int):
    """bool[B, H, S]: cache slots (= positions) a query at `pos` attends: its own block up to itself and the
    selected blocks."""
    j = jnp.arange(num_slots, dtype=jnp.int32)
    own = (j // block_size) == pos // block_size
    return (j <= pos)[None, None] & (own[None, None] | jnp.take(sel_BxHxKb, j // block_size, axis=-1))


def init_cache(module: MobaAttention, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    proj = module.proj
    bs, qb, _ = module.config.blocks
    g, h, d = proj.num_kv_heads, proj.num_heads, proj.head_dim
    nkb = num_blocks(max_len, bs)
    return {
        "k": jnp.zeros((batch, max_len, g, d), dtype), "v": jnp.zeros((batch, max_len, g, d), dtype),
        "ksum": jnp.zeros((batch, nkb, g, d), jnp.float32),
        "q": jnp.zeros((batch, qb, h, d), dtype), "qpos": jnp.full((qb,), -1, jnp.int32),
        "sel": jnp.zeros((batch, h, nkb), bool),
    }


def step(module: MobaAttention, x_Bx1xD: jax.Array, cache: dict, ctx: DecodeContext):
    cfg = module.config
    bs, qb, _ = cfg.blocks
    pos = jnp.asarray(ctx.pos, jnp.int32)
    q, k, v = project(module.proj, x_Bx1xD, pos)  # [B, H, D], [B, G, D]
    b, h, d = q.shape
    g = k.shape[1]
    cache = dict(cache, k=write_slot(cache["k"], pos, k), v=write_slot(cache["v"], pos, v),
                 q=write_slot(cache["q"], pos % qb, q), qpos=cache["qpos"].at[pos % qb].set(pos))  # fmt: skip
    cache["ksum"] = cache["ksum"].at[:, pos // bs].add(k.astype(jnp.float32))

    def select(_):
        qbar = group_query_mean(cache["q"], cache["qpos"], pos).reshape(b, g, h // g, d)
        kbar = cache["ksum"] / bs  # the blocks a group may select are complete
        s = jnp.einsum("bgrd,bkgd->bgrk", qbar, kbar, precision=jax.lax.Precision.HIGHEST).reshape(b, h, -1)
        return select_group(s, pos, cfg.top_k, bs, sink_blocks=cfg.sink_blocks)

    cache["sel"] = jax.lax.cond(pos % qb == 0, select, lambda _: cache["sel"], None)
    ok = selected_slots(cache["sel"], pos, cache["k"].shape[1], bs)
    o = attend(q, cache["k"], cache["v"], ok)
    return module.proj.wo(o.reshape(b, 1, -1)), cache

"""Decoders of the structural baselines (`PatternAttention`): dense, local window, Longformer, BigBird.

* dense: the full KV cache, [B, max_len] keys;
* local window: a ring buffer of the last `radius + 1` keys (memory O(window), not O(n));
* Longformer: the ring plus the first `num_global` keys (memory O(window + globals));
* BigBird: the full KV cache. Its random key blocks are drawn once for the whole length `max_len` and reach any
  earlier block, and over a sequence nearly every block is some later block's random choice, so no bounded cache
  holds them; the mask (window ∪ globals ∪ the query block's random blocks) is rebuilt from the pattern at
  `max_len`, so decoding equals the full forward pass at length `max_len` (docs/generation.md).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparse_attn.decode.attend import attend, project, write_slot
from sparse_attn.decode.registry import DecodeContext
from sparse_attn.modules.base import AttentionContext
from sparse_attn.modules.pattern_attention import (
    BigBirdAttention,
    DenseAttention,
    LocalAttention,
    LongformerAttention,
    PatternAttention,
)


def _ring_size(config, max_len: int) -> int:
    if isinstance(config, (DenseAttention, BigBirdAttention)):
        return max_len
    if isinstance(config, (LocalAttention, LongformerAttention)):
        return min(config.radius + 1, max_len)
    raise NotImplementedError(
        f"no incremental decoder for PatternAttention with {type(config).__name__}; decodable: DenseAttention, "
        "LocalAttention, LongformerAttention, BigBirdAttention"
    )


def init_cache(module: PatternAttention, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    cfg, proj = module.config, module.proj
    s = _ring_size(cfg, max_len)
    kv = (batch, s, proj.num_kv_heads, proj.head_dim)
    cache = {"k": jnp.zeros(kv, dtype), "v": jnp.zeros(kv, dtype), "pos": jnp.full((s,), -1, jnp.int32)}
    if isinstance(cfg, LongformerAttention):
        g = min(cfg.num_global, max_len)
        gkv = (batch, g, proj.num_kv_heads, proj.head_dim)
        cache.update(gk=jnp.zeros(gkv, dtype), gv=jnp.zeros(gkv, dtype))
    if isinstance(cfg, BigBirdAttention):
        full = AttentionContext(valid_len=jnp.array([max_len], jnp.int32), causal=True)
        layout = cfg.pattern(max_len, full)
        cache["random_QbxKb"] = layout.random_blocks[0, 0]
    return cache


def step(module: PatternAttention, x_Bx1xD: jax.Array, cache: dict, ctx: DecodeContext):
    cfg = module.config
    pos = jnp.asarray(ctx.pos, jnp.int32)
    q, k, v = project(module.proj, x_Bx1xD, pos)
    s = cache["pos"].shape[0]
    slot = pos % s
    cache = dict(cache, k=write_slot(cache["k"], slot, k), v=write_slot(cache["v"], slot, v),
                 pos=cache["pos"].at[slot].set(pos))
    kpos_S = cache["pos"]
    seen = (kpos_S >= 0) & (kpos_S <= pos)
    if isinstance(cfg, DenseAttention):
        ok = seen
        keys, vals = cache["k"], cache["v"]
    elif isinstance(cfg, LocalAttention):
        ok = seen & (pos - kpos_S <= cfg.radius)
        keys, vals = cache["k"], cache["v"]
    elif isinstance(cfg, LongformerAttention):
        g = cache["gk"].shape[1]
        # Global keys: written while pos < g; a global query (pos < g) reads every earlier key, and all of them
        # are global, so one rule serves both clauses. Keys in the window are read from the ring, not twice.
        in_globals = pos < g
        cache["gk"] = jnp.where(in_globals, write_slot(cache["gk"], jnp.minimum(pos, g - 1), k), cache["gk"])
        cache["gv"] = jnp.where(in_globals, write_slot(cache["gv"], jnp.minimum(pos, g - 1), v), cache["gv"])
        gpos_G = jnp.arange(g, dtype=jnp.int32)
        ok_global = (gpos_G <= pos) & (pos - gpos_G > cfg.radius)
        ok = jnp.concatenate([seen & (pos - kpos_S <= cfg.radius), ok_global])
        keys = jnp.concatenate([cache["k"], cache["gk"]], axis=1)
        vals = jnp.concatenate([cache["v"], cache["gv"]], axis=1)
    else:  # BigBird: full cache, slot j holds position j
        rnd = cache["random_QbxKb"]
        block = min(cfg.block, s)  # the pattern's block at n = max_len (s)
        g = min(cfg.num_global, s)
        j = kpos_S
        window = pos - j <= min(cfg.radius, s)
        global_ = (j < g) | (pos < g)
        random = jnp.take(rnd[pos // block], jnp.clip(j, 0) // block)
        ok = seen & (window | global_ | random)
        keys, vals = cache["k"], cache["v"]
    o = attend(q, keys, vals, ok[None, None])
    return module.proj.wo(o.reshape(o.shape[0], 1, -1)), cache

"""Decoder of NSA (`modules.nsa`): per branch the cache the paper keeps.

* compressed: a ring of the last `compress_block` raw (unrotated) compression keys and values; when a block ends
  (pos = c * stride + block - 1) it is compressed by the layer's MLPs into token c of the compressed store
  (its key rotated at pos, as in the full pass). Memory O(block + n / stride).
* selected: the full KV cache (any earlier block may be chosen) and the current group's selection, made at the
  group's first query from the ring of the last Q queries' compressed probabilities (summed over the GQA group's
  heads), spread over the selection blocks by overlap (`patterns.block_select.select_group`).
* window: a ring of the last `window + 1` keys and values. Memory O(window).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparse_attn.decode.attend import attend, project, write_slot
from sparse_attn.decode.moba import selected_slots
from sparse_attn.decode.registry import DecodeContext
from sparse_attn.modules.nsa import NsaAttention
from sparse_attn.patterns.block_select import num_blocks, select_group
from sparse_attn.patterns.compressed import num_compressed, overlap_weights
from sparse_attn.rope import apply_rope


def init_cache(module: NsaAttention, batch: int, max_len: int, dtype=jnp.float32) -> dict:
    cfg, proj = module.config, module.proj
    g, h, d = proj.num_kv_heads, proj.num_heads, proj.head_dim
    cb, qb = cfg.compress_block, cfg.selection.query_block
    m, w = max(num_compressed(max_len, cb, cfg.compress_stride), 1), min(cfg.window + 1, max_len)
    kv = lambda s: jnp.zeros((batch, s, g, d), dtype)  # noqa: E731
    return {
        "k": kv(max_len), "v": kv(max_len), "sel": jnp.zeros((batch, h, num_blocks(max_len, cfg.select_block)), bool),
        "raw_k": kv(cb), "raw_v": kv(cb), "ck": kv(m), "cv": kv(m),
        "p": jnp.zeros((batch, qb, g, m), jnp.float32), "ppos": jnp.full((qb,), -1, jnp.int32),
        "wk": kv(w), "wv": kv(w), "wpos": jnp.full((w,), -1, jnp.int32),
    }


def _row(linear, x_Bx1xD, g: int, d: int):
    return linear(x_Bx1xD).reshape(x_Bx1xD.shape[0], g, d)


def _compress(module: NsaAttention, cache: dict, pos):
    """The compressed store with token c = (pos + 1 - block) / stride written when a block ends at pos."""
    cfg = module.config
    cb, stride = cfg.compress_block, cfg.compress_stride
    c = (pos + 1 - cb) // stride
    ends = (pos + 1 >= cb) & ((pos + 1 - cb) % stride == 0) & (c < cache["ck"].shape[1])
    order = (pos - cb + 1 + jnp.arange(cb, dtype=jnp.int32)) % cb  # ring slots in position order
    full = jnp.full((cache["raw_k"].shape[0],), cb, jnp.int32)
    kc = module.phi_k(cache["raw_k"][:, order], stride, full)  # [B, 1, G, D]
    vc = module.phi_v(cache["raw_v"][:, order], stride, full)
    if cfg.rope_base is not None:
        kc = apply_rope(kc, jnp.broadcast_to(pos, (kc.shape[0], 1)), cfg.rope_base)
    slot = jnp.clip(c, 0, cache["ck"].shape[1] - 1)
    ck = jnp.where(ends, write_slot(cache["ck"], slot, kc[:, 0]), cache["ck"])
    cv = jnp.where(ends, write_slot(cache["cv"], slot, vc[:, 0]), cache["cv"])
    return ck, cv


def step(module: NsaAttention, x_Bx1xD: jax.Array, cache: dict, ctx: DecodeContext):
    cfg, proj = module.config, module.proj
    bs, qb = cfg.select_block, cfg.selection.query_block
    cb, stride = cfg.compress_block, cfg.compress_stride
    pos = jnp.asarray(ctx.pos, jnp.int32)
    q, k, v = project(proj, x_Bx1xD, pos)
    b, h, d = q.shape
    g = k.shape[1]
    cache = dict(cache, k=write_slot(cache["k"], pos, k), v=write_slot(cache["v"], pos, v))

    # compressed branch: the query reads the tokens whose blocks have ended by pos
    cache["raw_k"] = write_slot(cache["raw_k"], pos % cb, _row(module.wk_cmp, x_Bx1xD, g, d))
    cache["raw_v"] = write_slot(cache["raw_v"], pos % cb, _row(module.wv_cmp, x_Bx1xD, g, d))
    cache["ck"], cache["cv"] = _compress(module, cache, pos)
    m = cache["ck"].shape[1]
    count = jnp.maximum((pos + 1 - cb) // stride + 1, 0)
    ok_c = jnp.arange(m) < count
    s = jnp.einsum("bgrd,bmgd->bgrm", q.astype(jnp.float32).reshape(b, g, h // g, d),
                   cache["ck"].astype(jnp.float32)) / jnp.sqrt(jnp.float32(d))  # fmt: skip
    s = jnp.where(ok_c, s, -jnp.inf)
    p = jnp.where(ok_c, jnp.exp(s - jnp.where(count > 0, jnp.max(s, -1, keepdims=True), 0.0)), 0.0)
    p = p / jnp.maximum(jnp.sum(p, -1, keepdims=True), jnp.finfo(jnp.float32).tiny)
    # one softmax serves the branch's output and the selection's scores
    o_cmp = jnp.einsum("bgrm,bmgd->bgrd", p, cache["cv"].astype(jnp.float32)).reshape(b, h, d).astype(q.dtype)
    cache["p"] = write_slot(cache["p"], pos % qb, p.sum(2))  # summed over the group's heads
    cache["ppos"] = cache["ppos"].at[pos % qb].set(pos)

    # selected branch: a group selects at its first query
    def select(_):
        ppos = cache["ppos"]
        in_window = (ppos >= 0) & (ppos <= pos) & (ppos > pos - qb)
        pw = jnp.sum(jnp.where(in_window[None, :, None, None], cache["p"], 0.0), axis=1)  # [B, G, M]
        n = cache["k"].shape[1]
        w_MxKb = overlap_weights(n, cb, stride, bs)
        w_MxKb = jnp.zeros((m, w_MxKb.shape[1]), jnp.float32).at[: w_MxKb.shape[0]].set(w_MxKb)
        scores = jnp.einsum("bgm,mk->bgk", pw, w_MxKb, precision=jax.lax.Precision.HIGHEST)
        sel = select_group(scores, pos, cfg.top_n, bs, sink_blocks=cfg.sink_blocks, recent_blocks=cfg.recent_blocks)
        return jnp.repeat(sel, h // g, axis=1)

    cache["sel"] = jax.lax.cond(pos % qb == 0, select, lambda _: cache["sel"], None)
    o_slc = attend(q, cache["k"], cache["v"], selected_slots(cache["sel"], pos, cache["k"].shape[1], bs))

    # window branch: a ring of the last window + 1 keys
    kw, vw = _row(module.wk_win, x_Bx1xD, g, d), _row(module.wv_win, x_Bx1xD, g, d)
    if cfg.rope_base is not None:
        kw = apply_rope(kw[:, None], jnp.broadcast_to(pos, (b, 1)), cfg.rope_base)[:, 0]
    ws = cache["wpos"].shape[0]
    cache["wk"], cache["wv"] = write_slot(cache["wk"], pos % ws, kw), write_slot(cache["wv"], pos % ws, vw)
    cache["wpos"] = cache["wpos"].at[pos % ws].set(pos)
    ok_w = (cache["wpos"] >= 0) & (pos - cache["wpos"] <= cfg.window)
    o_win = attend(q, cache["wk"], cache["wv"], ok_w[None, None])

    gates = jax.nn.sigmoid(module.gate(x_Bx1xD).astype(jnp.float32)).reshape(b, 3, h, 1)
    o = sum(gates[:, i] * o_ for i, o_ in enumerate((o_cmp, o_slc, o_win)))
    return proj.wo(o.astype(q.dtype).reshape(b, 1, -1)), cache

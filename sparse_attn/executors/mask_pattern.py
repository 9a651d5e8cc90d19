"""The "xla" executor of `MaskFnPattern`: per query block, its listed key blocks gathered, the predicate applied
element-wise, a masked softmax over the gathered keys; differentiated by autodiff. Queries and keys may differ in
length (cross-attention). "reference" (the dense oracle) runs it too."""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparse_attn.executors import registry
from sparse_attn.executors.softmax import apply_score_fn, masked_softmax_parts, sanitize, zero_empty_rows
from sparse_attn.patterns.mask_pattern import MaskFnPattern, tile_mask


def _blocks(x_BxNxGxD, block: int, count: int):
    """[B, count, block, G, D]: x padded to count * block tokens, split into blocks."""
    b, n, g, d = x_BxNxGxD.shape
    x = jnp.pad(x_BxNxGxD, ((0, 0), (0, count * block - n), (0, 0), (0, 0)))
    return x.reshape(b, count, block, g, d)


def mask_fn_xla_attention(q_BxNxHxD, k_BxMxGxD, v_BxMxGxD, pattern: MaskFnPattern, scale: float, score_fn=None):
    """(out [B, Nq, H, D], lse [B, Nq, H]); memory O(B H Nq C block_k D) for C listed key blocks per query block;
    `score_fn` on the gathered scaled logits (`softmax.apply_score_fn`)."""
    b, nq, h, d = q_BxNxHxD.shape
    g = k_BxMxGxD.shape[2]
    bq, bk = pattern.block_q, pattern.block_k
    nqb, nkb = pattern.block_state.shape[2:]
    q, poison_q = sanitize(q_BxNxHxD)
    k, v, poison_kv = sanitize(k_BxMxGxD, v_BxMxGxD)

    # The key blocks of each (batch, head, query block): partial then full, padded slots marked dead.
    idx = jnp.concatenate([pattern.kv_idx, pattern.full_idx], axis=-1)  # [B', H', Qb, C]
    cp, cf = pattern.kv_idx.shape[-1], pattern.full_idx.shape[-1]
    slot = jnp.arange(cp + cf, dtype=jnp.int32).reshape(1, 1, 1, -1)
    live = jnp.where(slot < cp, slot < pattern.kv_count[..., None], slot - cp < pattern.full_count[..., None])
    overflow = (pattern.kv_count > cp) | (pattern.full_count > cf)  # [B', H', Qb]: a capacity too small
    lead = (b, h)
    idx, live, overflow = (jnp.broadcast_to(x, lead + x.shape[2:]) for x in (idx, live, overflow))
    bsz, hsz = pattern.block_state.shape[:2]

    # Gather key/value blocks per (batch, head): head i reads KV head i // (H / G).
    kvh = jnp.arange(h) // (h // g)
    kb, vb = _blocks(k, bk, nkb), _blocks(v, bk, nkb)  # [B, Kb, bk, G, D]
    pk = _blocks(poison_kv[..., None], bk, nkb)[..., 0]  # [B, Kb, bk, G]
    bi = jnp.arange(b)[:, None, None, None]
    gi = kvh[None, :, None, None]
    kt = kb[bi, idx, :, gi]  # [B, H, Qb, C, bk, D]
    vt = vb[bi, idx, :, gi]
    pkt = pk[bi, idx, :, gi]  # [B, H, Qb, C, bk]

    qt = _blocks(q, bq, nqb).transpose(0, 3, 1, 2, 4)  # [B, H, Qb, bq, D]
    pqt = _blocks(poison_q[..., None], bq, nqb)[..., 0].transpose(0, 3, 1, 2)  # [B, H, Qb, bq]
    s = jnp.einsum("bhqid,bhqcjd->bhqicj", qt, kt, preferred_element_type=jnp.float32) * scale
    q_pos = jnp.arange(nqb)[:, None] * bq + jnp.arange(bq)[None, :]  # [Qb, bq]
    k_pos = idx[..., None] * bk + jnp.arange(bk).reshape(1, 1, 1, 1, -1)  # [B, H, Qb, C, bk]
    s = apply_score_fn(score_fn, s, jnp.arange(b).reshape(-1, 1, 1, 1, 1, 1), jnp.arange(h).reshape(1, -1, 1, 1, 1, 1),
                       q_pos.reshape(1, 1, nqb, bq, 1, 1), k_pos[:, :, :, None], nq, pattern.kv_len)  # fmt: skip
    s = s + pqt[..., None, None] + pkt[:, :, :, None]

    # The predicate on every gathered tile (b, h at 0 where the mask does not depend on them).
    b_ix = jnp.broadcast_to(jnp.arange(b)[:, None] if bsz > 1 else jnp.zeros((b, 1), jnp.int32), lead)
    h_ix = jnp.broadcast_to(jnp.arange(h)[None, :] if hsz > 1 else jnp.zeros((1, h), jnp.int32), lead)

    def tiles(bb, hh, kp_QbxCxbk):
        def one_block(qp_bq, kp_Cxbk):
            f = lambda kp: tile_mask(pattern.predicate, pattern.buffers, bb, hh,  # noqa: E731
                                     jnp.minimum(qp_bq, pattern.q_len - 1), jnp.minimum(kp, pattern.kv_len - 1))
            return jax.vmap(f, out_axes=1)(kp_Cxbk)  # [bq, C, bk]

        return jax.vmap(one_block)(q_pos, kp_QbxCxbk)  # [Qb, bq, C, bk]

    ok = jax.vmap(jax.vmap(tiles))(b_ix, h_ix, k_pos)  # [B, H, Qb, bq, C, bk]
    ok = ok & live[:, :, :, None, :, None] & (k_pos < pattern.kv_len)[:, :, :, None]
    ok = ok & (q_pos < pattern.q_len)[None, None, :, :, None, None]

    flat = s.reshape(b, h, nqb, bq, -1)
    e, denom, lse = masked_softmax_parts(flat, ok.reshape(flat.shape))
    out = jnp.einsum("bhqij,bhqjd->bhqid", e, vt.reshape(b, h, nqb, -1, d).astype(jnp.float32)) / denom
    lse = jnp.where(overflow[..., None], jnp.nan, lse)
    out = jnp.where(overflow[..., None, None], jnp.nan, out)
    out = out.transpose(0, 2, 3, 1, 4).reshape(b, nqb * bq, h, d)[:, :nq]
    lse = lse.transpose(0, 2, 3, 1).reshape(b, nqb * bq, h)[:, :nq]
    return zero_empty_rows(out, lse).astype(q_BxNxHxD.dtype), lse


registry.register_executor(MaskFnPattern, "xla", mask_fn_xla_attention, default_on=("cpu", "gpu", "tpu"), scores=True)

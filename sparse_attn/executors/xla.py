"""XLA executor: gathers key blocks (Intervals, BlockLayout) or key rows (NeighbourList), then batched einsums.

Runs everywhere and is differentiated by autodiff. Static shapes: the per-query-block list width is derived from
the pattern's static bounds (reach, max_global, max_random), so no allowed key is ever dropped.
"""

from __future__ import annotations

import math

import jax
import jax.numpy as jnp

from sparse_attn.executors.softmax import masked_softmax
from sparse_attn.patterns.block_layout import BlockLayout
from sparse_attn.patterns.intervals import Intervals
from sparse_attn.patterns.neighbours import NeighbourList

DEFAULT_BLOCK = 64


def xla_attention(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern, scale: float, *, block: int | None = None):
    """Returns (out[B, N, H, D], lse[B, N, H])."""
    if isinstance(pattern, NeighbourList):
        return _neighbour_attention(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern, scale)
    if isinstance(pattern, Intervals):
        mask, random_blocks, max_random = pattern, None, 0
    else:
        mask, random_blocks, max_random = pattern.mask, pattern.random_blocks, pattern.max_random
    n = q_BxNxHxD.shape[1]
    if random_blocks is not None:
        blk = pattern.block_q  # random blocks are defined at the layout's granularity
    else:
        blk = min(block or DEFAULT_BLOCK, n)
    layout = BlockLayout.from_intervals(
        mask,
        blk,
        blk,
        random_blocks=random_blocks,
        max_random=max_random,
        capacity=list_capacity(mask, blk, max_random),
        split_full=False,
        global_rows=False,
    )
    out, lse = _block_attention(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, layout, scale)
    if mask.global_tokens is not None:
        out, lse = _global_rows(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, layout, scale, out, lse)
    return out, lse


def list_capacity(mask: Intervals, block: int, max_random: int = 0) -> int:
    """A static bound on the key blocks any query block touches (global rows excluded)."""
    nkb = math.ceil(mask.num_tokens / block)
    if mask.reach is None:
        return nkb
    left, right = mask.reach
    span = math.ceil((block + left + right - 1) / block) + 1
    return min(nkb, span + min(mask.max_global, nkb) + max_random)


def _split_heads(x_BpxHpxR, heads: int, groups: int):
    """[B', H', ...] -> [B', G|1, R|1, ...] matching q heads h = g * R + r."""
    if x_BpxHpxR.shape[1] == 1:
        return x_BpxHpxR[:, :, None]
    return x_BpxHpxR.reshape(x_BpxHpxR.shape[:1] + (groups, heads // groups) + x_BpxHpxR.shape[2:])


def _gather_rows(x_BxGxMxE, idx_BxGxRxQxC):
    """x[b, g, idx[b, g, r, q, c]] -> [B, G, R', Q, C, ...]."""
    bsz, groups = x_BxGxMxE.shape[:2]
    bi = jnp.arange(bsz).reshape(-1, 1, 1, 1, 1)
    gi = jnp.arange(groups).reshape(1, -1, 1, 1, 1)
    return x_BxGxMxE[bi, gi, idx_BxGxRxQxC]


def _block_attention(q, k, v, layout: BlockLayout, scale: float):
    b, n, h, d = q.shape
    g = k.shape[2]
    r = h // g
    blk = layout.block_q
    nb = math.ceil(n / blk)
    pad = ((0, 0), (0, nb * blk - n), (0, 0), (0, 0))
    q_ = jnp.pad(q, pad).reshape(b, nb, blk, g, r, d).transpose(0, 3, 4, 1, 2, 5)  # [B, G, R, Qb, bq, D]
    k_ = jnp.pad(k, pad).reshape(b, nb, blk, g, d).transpose(0, 3, 1, 2, 4)  # [B, G, Kb, bk, D]
    v_ = jnp.pad(v, pad).reshape(b, nb, blk, g, d).transpose(0, 3, 1, 2, 4)

    idx = _split_heads(layout.kv_idx, h, g)  # [B', G|1, R|1, Qb, C]
    cap = idx.shape[-1]
    q_pos = jnp.arange(nb * blk, dtype=jnp.int32).reshape(1, 1, nb, blk)
    if cap == nb:
        # Every key block may be needed: attend the contiguous keys instead of copying them per query block.
        kg = k_.reshape(b, g, 1, 1, nb * blk, d)
        vg = v_.reshape(b, g, 1, 1, nb * blk, d)
        k_pos = jnp.broadcast_to(jnp.arange(nb * blk, dtype=jnp.int32), (1, 1, nb, nb * blk))
        slot = True
    else:
        full_idx = jnp.broadcast_to(idx, (b, g) + idx.shape[2:])
        kg = _gather_rows(k_, full_idx).reshape((b, g) + idx.shape[2:4] + (cap * blk, d))  # [B, G, R', Qb, C*bk, D]
        vg = _gather_rows(v_, full_idx).reshape(kg.shape)
        k_pos = (layout.kv_idx[..., None] * blk + jnp.arange(blk, dtype=jnp.int32)).reshape(
            layout.kv_idx.shape[:3] + (cap * blk,)
        )
        slot = jnp.arange(cap, dtype=jnp.int32).reshape(1, 1, 1, cap, 1) < layout.kv_count[..., None, None]
        slot = jnp.broadcast_to(slot, slot.shape[:4] + (blk,)).reshape(slot.shape[:3] + (1, cap * blk))
    s = _scores(q_, kg)
    ok = layout.allowed(q_pos, k_pos)  # [B'', H'', Qb, bq, C*bk]
    ok = ok & slot & (k_pos < n)[..., None, :] & (q_pos < n)[..., None]
    ok = _split_heads(ok, h, g)  # [B'', G|1, R|1, Qb, bq, C*bk]

    p, lse = masked_softmax(s * scale, ok)
    out = _values(p, vg)
    out = out.transpose(0, 3, 4, 1, 2, 5).reshape(b, nb * blk, h, d)[:, :n]
    lse = lse.transpose(0, 3, 4, 1, 2).reshape(b, nb * blk, h)[:, :n]
    return out.astype(q.dtype), lse


def _scores(q_BxGxRxQxIxD, k_BxGxRpxQpxKxD):
    """Logits in float32; R' and Q' may be 1 (shared pattern heads, or keys shared by all query blocks)."""
    k = k_BxGxRpxQpxKxD
    if k.shape[2] == 1 and k.shape[3] == 1:
        return jnp.einsum("bgrqid,bgkd->bgrqik", q_BxGxRxQxIxD, k[:, :, 0, 0], preferred_element_type=jnp.float32)
    if k.shape[2] == 1:
        return jnp.einsum("bgrqid,bgqkd->bgrqik", q_BxGxRxQxIxD, k[:, :, 0], preferred_element_type=jnp.float32)
    return jnp.einsum("bgrqid,bgrqkd->bgrqik", q_BxGxRxQxIxD, k, preferred_element_type=jnp.float32)


def _values(p_BxGxRxQxIxK, v_BxGxRpxQpxKxD):
    v = v_BxGxRpxQpxKxD.astype(jnp.float32)
    if v.shape[2] == 1 and v.shape[3] == 1:
        return jnp.einsum("bgrqik,bgkd->bgrqid", p_BxGxRxQxIxK, v[:, :, 0, 0])
    if v.shape[2] == 1:
        return jnp.einsum("bgrqik,bgqkd->bgrqid", p_BxGxRxQxIxK, v[:, :, 0])
    return jnp.einsum("bgrqik,bgrqkd->bgrqid", p_BxGxRxQxIxK, v)


def _global_rows(q, k, v, layout: BlockLayout, scale: float, out, lse):
    """Global query rows attend every key: a small dense pass over at most `max_global` rows per sequence."""
    b, n, h, d = q.shape
    g = k.shape[2]
    mask = layout.mask
    gmask = jnp.broadcast_to(mask.global_tokens, (b, n))
    rows = jax.vmap(lambda x: jnp.nonzero(x, size=mask.max_global, fill_value=n)[0])(gmask)  # [B, M]
    rows = rows.astype(jnp.int32)
    bi = jnp.arange(b).reshape(-1, 1)
    qg = q[bi, jnp.minimum(rows, n - 1)]  # [B, M, H, D]
    qg = qg.reshape(b, -1, g, h // g, d)
    s = jnp.einsum("bmgrd,bkgd->bgrmk", qg, k, preferred_element_type=jnp.float32) * scale
    q_pos = rows.reshape(b, 1, 1, -1)
    k_pos = jnp.arange(n, dtype=jnp.int32).reshape(1, 1, 1, n)
    ok = mask.allowed(q_pos, k_pos)
    if layout.random_blocks is not None:
        ok = ok | layout.random_allowed(q_pos, k_pos)
    ok = ok[:, :, 0] & (rows < n).reshape(b, 1, -1, 1)  # [B, H'', M, N]
    ok = _split_heads(ok, h, g)
    p, lse_g = masked_softmax(s, ok)
    og = jnp.einsum("bgrmk,bkgd->bmgrd", p, v.astype(jnp.float32)).reshape(b, -1, h, d)
    lse_g = lse_g.transpose(0, 3, 1, 2).reshape(b, -1, h)
    out = out.at[bi, rows].set(og.astype(out.dtype), mode="drop")
    lse = lse.at[bi, rows].set(lse_g, mode="drop")
    return out, lse


def _neighbour_attention(q, k, v, nl: NeighbourList, scale: float):
    b, n, h, d = q.shape
    g = k.shape[2]
    q_ = q.reshape(b, n, g, h // g, d).transpose(0, 2, 3, 1, 4)  # [B, G, R, N, D]
    k_ = k.transpose(0, 2, 1, 3)  # [B, G, N, D]
    v_ = v.transpose(0, 2, 1, 3)
    idx = _split_heads(nl.idx, h, g)  # [B', G|1, R|1, N, K]
    idx = jnp.broadcast_to(idx, (b, g) + idx.shape[2:])
    kg, vg = _gather_rows(k_, idx), _gather_rows(v_, idx)  # [B, G, R', N, K, D]
    if kg.shape[2] == 1:
        s = jnp.einsum("bgrnd,bgnkd->bgrnk", q_, kg[:, :, 0], preferred_element_type=jnp.float32)
    else:
        s = jnp.einsum("bgrnd,bgrnkd->bgrnk", q_, kg, preferred_element_type=jnp.float32)
    s = s * scale
    if nl.bias is not None:
        s = s + _split_heads(nl.bias.astype(jnp.float32), h, g)
    p, lse = masked_softmax(s, _split_heads(nl.valid, h, g))
    if vg.shape[2] == 1:
        out = jnp.einsum("bgrnk,bgnkd->bgrnd", p, vg[:, :, 0].astype(jnp.float32))
    else:
        out = jnp.einsum("bgrnk,bgrnkd->bgrnd", p, vg.astype(jnp.float32))
    out = out.transpose(0, 3, 1, 2, 4).reshape(b, n, h, d)
    return out.astype(q.dtype), lse.transpose(0, 3, 1, 2).reshape(b, n, h)

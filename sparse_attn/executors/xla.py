"""XLA executor: per query block a static band of key blocks (Intervals), plus gathered global keys and random
blocks (BlockLayout), or gathered key rows (NeighbourList); then batched einsums. Differentiated by autodiff.

The band is C shifted static slices of the key blocks, where C follows from the pattern's static `reach`, so no
allowed key is ever dropped, and its gradient is a pad-and-add instead of a scatter (which is slow on CPU).
Global query rows ("attend everything") run as a small dense pass over at most `max_global` rows.
"""

from __future__ import annotations

import dataclasses
import math

import jax
import jax.numpy as jnp

from sparse_attn.executors import registry
from sparse_attn.executors.softmax import apply_score_fn, masked_softmax_parts, sanitize, zero_empty_rows
from sparse_attn.patterns.block_layout import BlockLayout
from sparse_attn.patterns.common import take_tokens
from sparse_attn.patterns.intervals import Intervals
from sparse_attn.patterns.neighbours import NeighbourList

DEFAULT_BLOCK = 64


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class XlaMeta:
    """What `prepare_xla` builds from an Intervals / BlockLayout alone (None where the pattern has no such part).

    global_pos: int32[B|1, M] positions of the global tokens (N past the last; M = `max_global`).
    random_idx, random_count: int32[B', Qb, R], int32[B', Qb] each query block's random key blocks (BigBird).
    """

    global_pos: jax.Array | None
    random_idx: jax.Array | None
    random_count: jax.Array | None


def prepare_xla(pattern, *, head_dim=None, block: int | None = None) -> XlaMeta | None:
    """The XLA executor's per-pattern metadata (`sparse_attn.prepare(..., implementation="xla")`): global token
    positions and random block lists; None for a NeighbourList (its rows are the metadata)."""
    del head_dim, block  # nothing here depends on them
    if isinstance(pattern, NeighbourList):
        return None
    mask = pattern if isinstance(pattern, Intervals) else pattern.mask
    global_pos, random_idx, random_count = global_positions(mask), None, None
    if isinstance(pattern, BlockLayout) and pattern.random_blocks is not None and pattern.max_random:
        if pattern.random_blocks.shape[1] != 1:
            # The gathered random blocks are shared by every head (`_random_lists`); per-head lists would silently
            # attend head 0's blocks in every head, so they are refused.
            raise ValueError(f"implementation='xla' runs random blocks shared by the heads (BlockLayout.random_blocks "
                             f"of shape {tuple(pattern.random_blocks.shape)}, heads axis 1 expected); per-head random "
                             "blocks run on 'pallas' or 'reference'")
        random_idx, random_count = _random_lists(pattern)
    return XlaMeta(global_pos, random_idx, random_count)


def xla_attention(
    q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern, scale: float, *, block: int | None = None, prepared=None,
    score_fn=None,
):
    """Returns (out[B, N, H, D], lse[B, N, H]); `prepared`: `prepare_xla`'s metadata (None: built here); `score_fn`
    on the gathered scaled logits (`softmax.apply_score_fn`).

    Only sanitised q/k/v enter the einsums; per-token poison terms on the logits send a non-finite value to exactly
    the rows that may attend it (`softmax.sanitize`).
    """
    q, poison_q = sanitize(q_BxNxHxD)
    k, v, poison_kv = sanitize(k_BxNxGxD, v_BxNxGxD)
    poisons = (poison_q, poison_kv)
    if isinstance(pattern, NeighbourList):
        out, lse = _neighbour_attention(q, k, v, poisons, pattern, scale, score_fn)
        return zero_empty_rows(out, lse), lse
    meta = prepared if prepared is not None else prepare_xla(pattern)
    layout = pattern if isinstance(pattern, BlockLayout) else None
    mask = pattern if layout is None else pattern.mask
    n = q.shape[1]
    blk = layout.block_q if layout is not None else min(block or DEFAULT_BLOCK, n)
    out, lse = _band_attention(q, k, v, poisons, mask, layout, blk, scale, meta, score_fn)
    if mask.global_tokens is not None:
        out, lse = _global_rows(q, k, v, poisons, pattern, scale, out, lse, meta.global_pos, score_fn)
    return zero_empty_rows(out, lse), lse


def band_shape(mask: Intervals, block: int) -> tuple[int, int]:
    """(first, width): query block qb reads key blocks qb - first ... qb - first + width - 1.

    None of an Intervals row's keys lies outside that band when the pattern honours its `reach`; without a reach
    the band is every key block (first = -1 marks "all blocks, unshifted").
    """
    nkb = math.ceil(mask.num_tokens / block)
    if mask.reach is None:
        return -1, nkb
    left, right = mask.reach
    first = math.ceil(left / block)
    width = first + (block - 1 + right) // block + 1
    if width >= nkb:
        return -1, nkb
    return first, width


def _split_heads(x_BpxHpxR, heads: int, groups: int):
    """[B', H', ...] -> [B', G|1, R|1, ...] matching q heads h = g * R + r."""
    if x_BpxHpxR.shape[1] == 1:
        return x_BpxHpxR[:, :, None]
    return x_BpxHpxR.reshape(x_BpxHpxR.shape[:1] + (groups, heads // groups) + x_BpxHpxR.shape[2:])


def _allowed(mask: Intervals, layout: BlockLayout | None, q_pos, k_pos):
    return mask.allowed(q_pos, k_pos) if layout is None else layout.allowed(q_pos, k_pos)


def _band_attention(q, k, v, poisons, mask: Intervals, layout: BlockLayout | None, blk: int, scale: float, meta,
                    score_fn=None):
    b, n, h, d = q.shape
    g = k.shape[2]
    nb = math.ceil(n / blk)
    pad = ((0, 0), (0, nb * blk - n), (0, 0), (0, 0))
    q_ = jnp.pad(q, pad).reshape(b, nb, blk, g, h // g, d).transpose(0, 3, 4, 1, 2, 5)  # [B, G, R, Qb, bq, D]
    k_ = jnp.pad(k, pad).reshape(b, nb, blk, g, d).transpose(0, 3, 1, 2, 4)  # [B, G, Kb, bk, D]
    v_ = jnp.pad(v, pad).reshape(b, nb, blk, g, d).transpose(0, 3, 1, 2, 4)
    poison_q, poison_kv = poisons  # [B, N, H], [B, N, G]: 0 or NaN
    pq_ = jnp.pad(poison_q, pad[:3]).reshape(b, nb, blk, g, h // g).transpose(0, 3, 4, 1, 2)  # [B, G, R, Qb, bq]
    pk_ = jnp.pad(poison_kv, pad[:3]).reshape(b, nb, blk, g, 1).transpose(0, 3, 1, 2, 4)  # [B, G, Kb, bk, 1]
    q_pos = jnp.arange(nb * blk, dtype=jnp.int32).reshape(1, 1, nb, blk)

    first, width = band_shape(mask, blk)
    if first < 0:  # every key block: attend the contiguous keys, no copies
        kb = k_.reshape(b, g, 1, nb * blk, d)
        vb = v_.reshape(b, g, 1, nb * blk, d)
        pb = pk_.reshape(b, g, 1, nb * blk, 1)
        k_pos = jnp.broadcast_to(jnp.arange(nb * blk, dtype=jnp.int32), (1, 1, nb, nb * blk))
        in_band = None
    else:
        kb, vb, pb = (_band(x, first, width) for x in (k_, v_, pk_))  # [B, G, Qb, C*bk, D|1]
        start = (jnp.arange(nb, dtype=jnp.int32) - first) * blk
        k_pos = (start[:, None] + jnp.arange(width * blk, dtype=jnp.int32)[None]).reshape(1, 1, nb, width * blk)
        in_band = (start, start + width * blk)
    parts_k, parts_v, parts_p, parts_ok, parts_pos = [kb], [vb], [pb], [], [k_pos]
    ok = _allowed(mask, layout, q_pos, k_pos) & ((k_pos >= 0) & (k_pos < n))[..., None, :]
    parts_ok.append(ok)

    if in_band is not None and mask.global_tokens is not None:
        # Global keys outside the band: a few gathered rows shared by every query block.
        gk_pos = jnp.broadcast_to(meta.global_pos, (b, mask.max_global))  # [B, M]
        gk = _take_rows(k, gk_pos).transpose(0, 2, 1, 3)[:, :, None]  # [B, G, 1, M, D]
        gv = _take_rows(v, gk_pos).transpose(0, 2, 1, 3)[:, :, None]
        gp = _take_rows(poison_kv[..., None], gk_pos).transpose(0, 2, 1, 3)[:, :, None]
        pos = jnp.broadcast_to(gk_pos[:, None, None, :], (b, 1, nb, gk_pos.shape[1]))
        ok = _allowed(mask, layout, q_pos, pos) & _outside(pos, in_band)[..., None, :] & (pos < n)[..., None, :]
        parts_k.append(jnp.broadcast_to(gk, (b, g, nb) + gk.shape[3:]))
        parts_v.append(jnp.broadcast_to(gv, (b, g, nb) + gv.shape[3:]))
        parts_p.append(jnp.broadcast_to(gp, (b, g, nb) + gp.shape[3:]))
        parts_ok.append(ok)
        parts_pos.append(pos)
    if in_band is not None and layout is not None and layout.random_blocks is not None and layout.max_random:
        # Random blocks outside the band (BigBird): gathered per query block from the layout's lists.
        ridx, cnt = meta.random_idx, meta.random_count  # [B', Qb, R], [B', Qb]
        rk, rv, rp = (_gather_blocks(x, ridx) for x in (k_, v_, pk_))  # [B, G, Qb, R*bk, D|1]
        pos = (ridx[..., None] * blk + jnp.arange(blk, dtype=jnp.int32).reshape(1, 1, 1, blk)).reshape(ridx.shape[:2] + (-1,))[:, None]
        slot = jnp.repeat(jnp.arange(layout.max_random).reshape(1, 1, -1) < cnt[..., None], blk, axis=-1)[:, None]
        ok = layout.allowed(q_pos, pos) & (_outside(pos, in_band) & slot & (pos < n))[..., None, :]
        if mask.global_tokens is not None:  # counted by the global-key part already
            flat = pos.reshape(pos.shape[:2] + (-1,))
            is_g = take_tokens(mask.global_tokens[:, None, :], flat).reshape(jnp.broadcast_shapes(
                mask.global_tokens.shape[:1] + (1,), pos.shape[:2]) + pos.shape[2:])
            ok = ok & ~(is_g & _outside(pos, in_band))[..., None, :]
        parts_k.append(rk)
        parts_v.append(rv)
        parts_p.append(rp)
        parts_ok.append(ok)
        parts_pos.append(pos)

    s = jnp.concatenate([_scores(q_, x) for x in parts_k], axis=-1) * scale
    if score_fn is not None:  # [B, G, R, Qb, bq, K] logits: head h = g * R + r, key positions per part
        lead = jnp.broadcast_shapes(*(x.shape[:1] for x in parts_pos))
        k_all = jnp.concatenate([jnp.broadcast_to(x, lead + x.shape[1:]) for x in parts_pos], axis=-1)
        s = apply_score_fn(score_fn, s, jnp.arange(b).reshape(-1, 1, 1, 1, 1, 1),
                           jnp.arange(h).reshape(1, g, h // g, 1, 1, 1), q_pos.reshape(1, 1, 1, nb, blk, 1),
                           k_all[:, :, None, :, None, :], n, n)  # fmt: skip
    pk = jnp.concatenate(parts_p, axis=-2)[..., 0]  # [B, G, Qb|1, K]
    s = s + pq_[..., None] + pk[:, :, None, :, None, :]
    lead = jnp.broadcast_shapes(*(o.shape[:2] for o in parts_ok))
    ok = jnp.concatenate([jnp.broadcast_to(o, lead + (nb, blk, o.shape[-1])) for o in parts_ok], axis=-1)
    ok = _split_heads(ok, h, g)
    ok = ok & (q_pos < n).reshape(1, 1, 1, nb, blk, 1)
    e, denom, lse = masked_softmax_parts(s, ok)
    out, off = 0.0, 0
    for x in parts_v:
        width_x = x.shape[-2]
        out = out + _values(e[..., off : off + width_x], x)
        off += width_x
    out = out / denom
    out = out.transpose(0, 3, 4, 1, 2, 5).reshape(b, nb * blk, h, d)[:, :n]
    lse = lse.transpose(0, 3, 4, 1, 2).reshape(b, nb * blk, h)[:, :n]
    return out.astype(q.dtype), lse


def _random_lists(layout: BlockLayout):
    """(idx int32[B', Qb, R], count int32[B', Qb]): each query block's random key blocks (shared by heads)."""
    n = layout.num_tokens
    rl = BlockLayout.from_intervals(
        Intervals(jnp.ones((1, 1, n), jnp.int32), jnp.zeros((1, 1, n), jnp.int32)),
        layout.block_q,
        layout.block_q,
        random_blocks=layout.random_blocks,
        capacity=layout.max_random,
        split_full=False,
    )
    return rl.kv_idx[:, 0], rl.kv_count[:, 0]


def _band(x_BxGxKbxbkxD, first: int, width: int):
    """[B, G, Qb, C*bk, D]: for each query block the C consecutive key blocks starting `first` blocks earlier."""
    nb = x_BxGxKbxbkxD.shape[2]
    xp = jnp.pad(x_BxGxKbxbkxD, ((0, 0), (0, 0), (first, width - 1 - first), (0, 0), (0, 0)))
    bands = jnp.stack([xp[:, :, c : c + nb] for c in range(width)], axis=3)  # [B, G, Qb, C, bk, D]
    return bands.reshape(bands.shape[:3] + (-1, bands.shape[-1]))


def _outside(pos, band):
    start, stop = band
    return (pos < start.reshape(1, 1, -1, 1)) | (pos >= stop.reshape(1, 1, -1, 1))


def global_positions(mask: Intervals) -> jax.Array | None:
    """int32[B|1, M]: the global tokens' positions (N past the last; M = `max_global`), None without any."""
    if mask.global_tokens is None:
        return None
    return _global_positions(mask, mask.global_tokens.shape[0], mask.num_tokens)


def _global_positions(mask: Intervals, b: int, n: int):
    g = jnp.broadcast_to(mask.global_tokens, (b, n))
    return jax.vmap(lambda x: jnp.nonzero(x, size=mask.max_global, fill_value=n)[0])(g).astype(jnp.int32)


def _take_rows(x_BxNxGxD, pos_BxM):
    n = x_BxNxGxD.shape[1]
    return x_BxNxGxD[jnp.arange(x_BxNxGxD.shape[0])[:, None], jnp.minimum(pos_BxM, n - 1)]


def _gather_blocks(x_BxGxKbxbkxD, idx_BpxQbxR):
    b, g = x_BxGxKbxbkxD.shape[:2]
    idx = jnp.broadcast_to(idx_BpxQbxR[:, None], (b, g) + idx_BpxQbxR.shape[1:])
    out = x_BxGxKbxbkxD[jnp.arange(b).reshape(-1, 1, 1, 1), jnp.arange(g).reshape(1, -1, 1, 1), idx]
    return out.reshape(out.shape[:3] + (-1, out.shape[-1]))  # [B, G, Qb, R*bk, D]


def _scores(q_BxGxRxQxIxD, k_BxGxQpxKxD):
    """float32 logits [B, G, R, Qb, bq, K]; keys are shared by the R query heads of a group (GQA)."""
    k = k_BxGxQpxKxD
    if k.shape[2] == 1:
        return jnp.einsum("bgrqid,bgkd->bgrqik", q_BxGxRxQxIxD, k[:, :, 0], preferred_element_type=jnp.float32)
    return jnp.einsum("bgrqid,bgqkd->bgrqik", q_BxGxRxQxIxD, k, preferred_element_type=jnp.float32)


def _values(e_BxGxRxQxIxK, v_BxGxQpxKxD):
    v = v_BxGxQpxKxD.astype(jnp.float32)
    if v.shape[2] == 1:
        return jnp.einsum("bgrqik,bgkd->bgrqid", e_BxGxRxQxIxK, v[:, :, 0])
    return jnp.einsum("bgrqik,bgqkd->bgrqid", e_BxGxRxQxIxK, v)


def global_rows(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern, scale: float, out_BxNxHxD, lse_BxNxH, rows=None,
                score_fn=None):  # fmt: skip
    """Overwrites the global query rows of (out, lse) with a dense pass over every key (at most `max_global` rows
    per sequence); for executors that leave those rows out (the Pallas kernels). Only sanitised values multiply.
    `rows`: `prepare_xla(pattern).global_pos` when already built; `score_fn` as in `xla_attention`."""
    q, poison_q = sanitize(q_BxNxHxD)
    k, v, poison_kv = sanitize(k_BxNxGxD, v_BxNxGxD)
    return _global_rows(q, k, v, (poison_q, poison_kv), pattern, scale, out_BxNxHxD, lse_BxNxH, rows, score_fn)


def _global_rows(q, k, v, poisons, pattern, scale: float, out, lse, rows_BpxM=None, score_fn=None):
    """Global query rows attend every key: a small dense pass over at most `max_global` rows per sequence."""
    b, n, h, d = q.shape
    g = k.shape[2]
    mask = pattern if isinstance(pattern, Intervals) else pattern.mask
    if rows_BpxM is None:
        rows_BpxM = global_positions(mask)
    rows = jnp.broadcast_to(rows_BpxM, (b, mask.max_global))  # [B, M]
    qg = _take_rows(q, rows).reshape(b, -1, g, h // g, d)
    s = jnp.einsum("bmgrd,bkgd->bgrmk", qg, k, preferred_element_type=jnp.float32) * scale
    s = apply_score_fn(score_fn, s, jnp.arange(b).reshape(-1, 1, 1, 1, 1), jnp.arange(h).reshape(1, g, h // g, 1, 1),
                       rows.reshape(b, 1, 1, -1, 1), jnp.arange(n).reshape(1, 1, 1, 1, n), n, n)  # fmt: skip
    poison_q, poison_kv = poisons
    pq = _take_rows(poison_q[..., None], rows)[..., 0].reshape(b, -1, g, h // g).transpose(0, 2, 3, 1)  # [B,G,R,M]
    s = s + pq[..., None] + poison_kv.transpose(0, 2, 1)[:, :, None, None, :]
    q_pos = rows.reshape(b, 1, 1, -1)
    k_pos = jnp.arange(n, dtype=jnp.int32).reshape(1, 1, 1, n)
    ok = pattern.allowed(q_pos, k_pos)[:, :, 0] & (rows < n).reshape(b, 1, -1, 1)  # [B, H'', M, N]
    e, denom, lse_g = masked_softmax_parts(s, _split_heads(ok, h, g))
    og = (jnp.einsum("bgrmk,bkgd->bmgrd", e, v.astype(jnp.float32)) / denom.transpose(0, 3, 1, 2, 4))
    og = og.reshape(b, -1, h, d)
    lse_g = lse_g.transpose(0, 3, 1, 2).reshape(b, -1, h)
    bi = jnp.arange(b).reshape(-1, 1)
    out = out.at[bi, rows].set(og.astype(out.dtype), mode="drop")
    lse = lse.at[bi, rows].set(lse_g, mode="drop")
    return out, lse


def _neighbour_attention(q, k, v, poisons, nl: NeighbourList, scale: float, score_fn=None):
    b, n, h, d = q.shape
    g = k.shape[2]
    q_ = q.reshape(b, n, g, h // g, d).transpose(0, 2, 3, 1, 4)  # [B, G, R, N, D]
    idx = _split_heads(nl.idx, h, g)  # [B', G|1, R|1, N, K]
    idx = jnp.broadcast_to(idx, (b, g) + idx.shape[2:])
    bi = jnp.arange(b).reshape(-1, 1, 1, 1, 1)
    gi = jnp.arange(g).reshape(1, -1, 1, 1, 1)
    kg = k.transpose(0, 2, 1, 3)[bi, gi, idx]  # [B, G, R', N, K, D] (an index outside [0, N) is clamped: invalid)
    vg = v.transpose(0, 2, 1, 3)[bi, gi, idx]
    if kg.shape[2] == 1:
        s = jnp.einsum("bgrnd,bgnkd->bgrnk", q_, kg[:, :, 0], preferred_element_type=jnp.float32)
    else:
        s = jnp.einsum("bgrnd,bgrnkd->bgrnk", q_, kg, preferred_element_type=jnp.float32)
    s = s * scale
    s = apply_score_fn(score_fn, s, jnp.arange(b).reshape(-1, 1, 1, 1, 1), jnp.arange(h).reshape(1, g, h // g, 1, 1),
                       jnp.arange(n).reshape(1, 1, 1, n, 1), idx, n, n)  # fmt: skip
    poison_q, poison_kv = poisons
    s = s + poison_q.reshape(b, n, g, h // g).transpose(0, 2, 3, 1)[..., None]
    s = s + poison_kv.transpose(0, 2, 1)[bi, gi, idx]
    if nl.bias is not None:
        s = s + _split_heads(nl.bias.astype(jnp.float32), h, g)
    e, denom, lse = masked_softmax_parts(s, _split_heads(nl.slot_valid(), h, g))
    if vg.shape[2] == 1:
        out = jnp.einsum("bgrnk,bgnkd->bgrnd", e, vg[:, :, 0].astype(jnp.float32))
    else:
        out = jnp.einsum("bgrnk,bgrnkd->bgrnd", e, vg.astype(jnp.float32))
    out = (out / denom).transpose(0, 3, 1, 2, 4).reshape(b, n, h, d)
    return out.astype(q.dtype), lse.transpose(0, 3, 1, 2).reshape(b, n, h)


registry.register_executor(Intervals, "xla", xla_attention, default_on="cpu", prepare=prepare_xla, scores=True)
registry.register_executor(BlockLayout, "xla", xla_attention, default_on="cpu", prepare=prepare_xla, scores=True)
registry.register_executor(NeighbourList, "xla", xla_attention, default_on=("cpu", "gpu", "tpu"), scores=True)

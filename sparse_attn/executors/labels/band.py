"""The band kernel of the bucketed label executor, in plain JAX: block x of `block` consecutive bucket entries
scores the static band of entries [x block - reach, (x + 1) block + reach) with one einsum, masks the range ends and
the lowest-shared-label dedup, and softmaxes; a custom VJP recomputes the band in the backward pass; `tier` picks one
of a few static reaches at run time (`lax.switch`). Used by `bucketed.py`."""

from __future__ import annotations

import functools
from typing import NamedTuple

import jax
import jax.numpy as jnp

GROUP_ENTRIES = 1024  # entries per scan step: bounds the score-sized temporaries


def band_rows(x_ExF: jax.Array, nb: int, block: int, left: int, width: int) -> jax.Array:
    """[nb, width, ...]: rows b * block - left + t (t < width) of x, zero outside it.

    Built from `ceil` static shifted copies of x cut into chunks of `block` rows — contiguous memory copies, no
    gather, and its transpose is a sum of shifted slices, not a scatter.
    """
    a = -(-left // block)
    off = a * block - left
    nc = (off + width - 1) // block + 1
    rows = nb * block
    xp = jnp.pad(x_ExF, [(a * block, nc * block + rows - x_ExF.shape[0])] + [(0, 0)] * (x_ExF.ndim - 1))
    xc = xp.reshape((-1, block) + x_ExF.shape[1:])
    stacked = jnp.stack([xc[j : j + nb] for j in range(nc)], axis=1)
    return stacked.reshape((nb, nc * block) + x_ExF.shape[1:])[:, off : off + width]


def _unband(dx_xCxF: jax.Array, rows: int, block: int, left: int) -> jax.Array:
    """The transpose of `band_rows`: adds each band slot back onto its row; [rows, ...]."""
    nb, width = dx_xCxF.shape[:2]
    a = -(-left // block)
    off = a * block - left
    nc = (off + width - 1) // block + 1
    tail = [(0, 0)] * (dx_xCxF.ndim - 2)
    full = jnp.pad(dx_xCxF, [(0, 0), (off, nc * block - off - width)] + tail)
    full = full.reshape((nb, nc, block) + dx_xCxF.shape[2:])
    acc = jnp.zeros((nb + nc, block) + dx_xCxF.shape[2:], dx_xCxF.dtype)
    for j in range(nc):
        acc = acc + jnp.pad(full[:, j], [(j, nc - j), (0, 0)] + tail)
    return acc.reshape((-1,) + dx_xCxF.shape[2:])[a * block : a * block + rows]


def _groups(x, group: int, fill=0):
    """[nb, ...] -> [ng, group, ...], padded with `fill`."""
    ng = -(-x.shape[0] // group)
    x = jnp.pad(x, [(0, ng * group - x.shape[0])] + [(0, 0)] * (x.ndim - 1), constant_values=fill)
    return x.reshape((ng, group) + x.shape[1:])


def _local_rows(x_pad, i, group: int, block: int, width: int, shift: int = 0):
    """Rows of the (left-padded) entries that group i's band reads: [group * block + width - block, ...]; `shift`:
    extra left padding of x_pad beyond the band's own."""
    return jax.lax.dynamic_slice_in_dim(x_pad, shift + i * group * block, group * block + width - block)


class Ranges(NamedTuple):
    """What a band mask is built from: the rows' entry ranges and dedup bits, and every entry's labels."""

    lo_xB: jax.Array
    hi_xB: jax.Array
    below_xBxW: jax.Array | None  # None for k = 1: nothing to dedup
    bits_ExW: jax.Array


def _mask(lo_xB, hi_xB, below_xBxW, kbits_xCxW, first_x):
    """bool[x, B, C]: band slot c (entry first_x + c) lies in the row's range, and the row's bucket is the pair's
    lowest shared label."""
    kj = (first_x[:, None] + jnp.arange(kbits_xCxW.shape[1], dtype=jnp.int32)[None, :])[:, None, :]  # [x, 1, C]
    ok_xBxC = (kj >= lo_xB[..., None]) & (kj <= hi_xB[..., None])
    if below_xBxW is not None:
        for w in range(below_xBxW.shape[-1]):
            ok_xBxC = ok_xBxC & ((below_xBxW[:, :, None, w] & kbits_xCxW[:, None, :, w]) == 0)
    return ok_xBxC


def band_mask(ranges: Ranges, block: int, reach: int, width: int) -> jax.Array:
    """bool[x, B, C]: the mask of every block's band [x block - reach, x block - reach + C)."""
    nb = ranges.lo_xB.shape[0]
    kbits = band_rows(ranges.bits_ExW, nb, block, reach, width)  # [nb, C, W]
    return _mask(ranges.lo_xB, ranges.hi_xB, ranges.below_xBxW, kbits, jnp.arange(nb, dtype=jnp.int32) * block - reach)


def _mask_groups(mask, group: int, left: int, rows: int):
    """Per-group scan inputs of a mask: the groups of a precomputed one, or the ranges to build it from."""
    if not isinstance(mask, Ranges):
        return _groups(mask, group), None
    below = None if mask.below_xBxW is None else _groups(mask.below_xBxW, group)
    return (_groups(mask.lo_xB, group, 1), _groups(mask.hi_xB, group, 0), below), _padded(mask.bits_ExW, left, rows)


def _group_mask(mask_g, bits_pad, i, group: int, block: int, left: int, width: int):
    """bool[group, B, C]: group i's mask (built here from its ranges when not precomputed)."""
    if bits_pad is None:
        return mask_g
    lo, hi, below = mask_g
    kbits = band_rows(_local_rows(bits_pad, i, group, block, width), group, block, 0, width)
    first = (i * group + jnp.arange(group, dtype=jnp.int32)) * block - left
    return _mask(lo, hi, below, kbits, first)


def _scores(q_gxBxGxRxD, k_loc, ok_gxBxC, block, scale):
    k_gxCxGxD = band_rows(k_loc, q_gxBxGxRxD.shape[0], block, 0, ok_gxBxC.shape[-1])
    s = jnp.einsum("xbgrd,xcgd->xgrbc", q_gxBxGxRxD, k_gxCxGxD, preferred_element_type=jnp.float32) * scale
    return jnp.where(ok_gxBxC[:, None, None], s, -jnp.inf), k_gxCxGxD


def _padded(x_ExF, left: int, rows: int):
    return jnp.pad(x_ExF, [(left, rows - left - x_ExF.shape[0])] + [(0, 0)] * (x_ExF.ndim - 1))


def _geometry(nb, e, block, left, width, group):
    ng = -(-nb // group)
    rows = max(ng * group * block + width - block, left + e)
    return ng, rows


def _band_fwd(q_xBxGxRxD, k_pad, v_pad, mask, block, left, width, scale, group, shift):
    """(out, lse, keys int32[x, B]: allowed keys per entry) of every block over its band. k_pad, v_pad: the entries
    with `shift + left` rows of zeros before them and enough after (`_shared_pad`). mask: bool[x, B, C]
    precomputed, or `Ranges` to build it from one group at a time."""
    nb = q_xBxGxRxD.shape[0]
    ng, rows = _geometry(nb, nb * block, block, left, width, group)
    mask_xs, bits_pad = _mask_groups(mask, group, left, rows)

    def one(_, xs):
        q, mask_g, i = xs
        ok = _group_mask(mask_g, bits_pad, i, group, block, left, width)
        s, _ = _scores(q, _local_rows(k_pad, i, group, block, width, shift), ok, block, scale)
        m = jnp.max(s, axis=-1)
        m = jnp.where(jnp.isfinite(m), m, 0.0)
        e = jnp.exp(s - m[..., None])  # masked logits are -inf: weight exactly 0
        denom = jnp.sum(e, axis=-1)
        v = band_rows(_local_rows(v_pad, i, group, block, width, shift), group, block, 0, width)
        v = v.astype(jnp.float32)
        o = jnp.einsum("xgrbc,xcgd->xgrbd", e, v)
        alive = denom > 0
        o = jnp.transpose(o / jnp.where(alive, denom, 1.0)[..., None], (0, 3, 1, 2, 4))
        lse = jnp.where(alive, m + jnp.log(jnp.where(alive, denom, 1.0)), -jnp.inf)
        return None, (o, lse, jnp.sum(ok, axis=-1, dtype=jnp.int32))

    xs = (_groups(q_xBxGxRxD, group), mask_xs, jnp.arange(ng, dtype=jnp.int32))
    _, outs = jax.lax.scan(one, None, xs)
    return tuple(x.reshape((-1,) + x.shape[2:])[:nb] for x in outs)


def _band_bwd(block, left, width, scale, group, shift, res, cts):
    """The VJP of `_band_fwd`: (dq [x, B, G, R, D], dk, dv [x block, G, D] float32)."""
    q_all, k_pad, v_pad, mask, o_all, lse_all = res
    do_all, dlse_all = cts[:2]  # the log-sum-exp merge differentiates lse too: d lse / d s = p; keys: integer
    nb = q_all.shape[0]
    e_rows = nb * block
    ng, rows = _geometry(nb, e_rows, block, left, width, group)
    mask_xs, bits_pad = _mask_groups(mask, group, left, rows)
    span = group * block + width - block

    def one(carry, xs):
        dk_pad, dv_pad = carry
        q, mask_g, o, lse, do, dlse, i = xs
        ok = _group_mask(mask_g, bits_pad, i, group, block, left, width)
        s, k = _scores(q, _local_rows(k_pad, i, group, block, width, shift), ok, block, scale)
        live = jnp.isfinite(lse)
        p = jnp.exp(s - jnp.where(live, lse, 0.0)[..., None])  # [g, G, R, B, C]; 0 where masked
        v = band_rows(_local_rows(v_pad, i, group, block, width, shift), group, block, 0, width)
        v = v.astype(jnp.float32)
        do_t = jnp.transpose(do.astype(jnp.float32), (0, 2, 3, 1, 4))  # [g, G, R, B, D]
        dv = jnp.einsum("xgrbc,xgrbd->xcgd", p, do_t)
        dp = jnp.einsum("xgrbd,xcgd->xgrbc", do_t, v)
        delta = jnp.transpose(jnp.sum(do.astype(jnp.float32) * o, axis=-1), (0, 2, 3, 1))
        ds = p * (dp - delta[..., None] + dlse[..., None]) * scale
        dq = jnp.einsum("xgrbc,xcgd->xbgrd", ds, k.astype(jnp.float32)).astype(q.dtype)
        dk = jnp.einsum("xgrbc,xbgrd->xcgd", ds, q.astype(jnp.float32))
        start = i * group * block
        dk_pad = jax.lax.dynamic_update_slice_in_dim(
            dk_pad, jax.lax.dynamic_slice_in_dim(dk_pad, start, span) + _unband(dk, span, block, 0), start, 0
        )
        dv_pad = jax.lax.dynamic_update_slice_in_dim(
            dv_pad, jax.lax.dynamic_slice_in_dim(dv_pad, start, span) + _unband(dv, span, block, 0), start, 0
        )
        return (dk_pad, dv_pad), dq

    zeros = jnp.zeros((rows,) + k_pad.shape[1:], jnp.float32)
    xs = tuple(_groups(x, group) for x in (q_all, o_all, lse_all, do_all, dlse_all))
    xs = (xs[0], mask_xs) + xs[1:] + (jnp.arange(ng, dtype=jnp.int32),)
    (dk_pad, dv_pad), dq = jax.lax.scan(one, (zeros, zeros), xs)
    dq = dq.reshape((-1,) + dq.shape[2:])[:nb]
    return dq, dk_pad[left : left + e_rows], dv_pad[left : left + e_rows]


def _switch(tier, reaches, branch):
    """branch(t) for the tier in use: one static band per tier, chosen at run time (no switch for one tier)."""
    if len(reaches) == 1:
        return branch(0)
    return jax.lax.switch(tier, [functools.partial(branch, t) for t in range(len(reaches))])


def band_width(block: int, reach: int, causal: bool) -> int:
    return block + reach + (0 if causal else reach)


@functools.partial(jax.custom_vjp, nondiff_argnums=(6, 7, 8, 9, 10))
def band_attention(q_xBxGxRxD, k_ExGxD, v_ExGxD, ok_xBxC, ranges: Ranges, tier, block: int, reaches: tuple,
                   scale: float, group: int, causal: bool):  # fmt: skip
    """Softmax attention of each entry of query block x over its bucket range, read from a static band.

    Tier t reads the entries [x block - reaches[t], (x + 1) block + reaches[t]) (causal: up to the block's end);
    `tier` (int32, unbatched) picks the narrowest tier that holds every range, so the result is exact for any
    labels. Tier 0's mask `ok_xBxC` comes precomputed; wider tiers build theirs from `ranges` one scan step at a
    time. Returns (out [x, B, G, R, D] float32, lse [x, G, R, B], -inf on empty rows, keys int32[x, B]: allowed
    keys per entry, counted from the forward's own masks, no gradient). Blocks run a group at a
    time in a scan, so score-sized temporaries stay small; a flash-style custom VJP keeps only the inputs, out and
    lse and recomputes the scores in the backward pass.
    """
    return _tiered_fwd(q_xBxGxRxD, k_ExGxD, v_ExGxD, ok_xBxC, ranges, tier, block, reaches, scale, group, causal)[0]


def _tiers(reaches, causal: bool, block: int, group: int):
    """(reach, width, blocks per scan step) per tier: wider bands run fewer blocks a step (same temporaries)."""
    w0 = band_width(block, reaches[0], causal)
    return [(r, band_width(block, r, causal), max(1, group * w0 // band_width(block, r, causal))) for r in reaches]


def _shared_pad(k_ExGxD, v_ExGxD, nb, block, tiers):
    """k and v padded once for every tier (tier t reads them shifted by reaches[-1] - reaches[t]): padding inside
    each branch of the switch would make XLA materialise the gathered k and v as the switch's operands."""
    left = tiers[-1][0]
    rows = max(left - r + _geometry(nb, nb * block, block, r, w, g)[1] for r, w, g in tiers)
    return _padded(k_ExGxD, left, rows), _padded(v_ExGxD, left, rows)


def _tiered_fwd(q, k, v, ok, ranges, tier, block, reaches, scale, group, causal):
    tiers = _tiers(reaches, causal, block, group)
    k_pad, v_pad = _shared_pad(k, v, q.shape[0], block, tiers)

    def run(t):
        reach, width, grp = tiers[t]
        mask = ok if t == 0 else ranges
        return _band_fwd(q, k_pad, v_pad, mask, block, reach, width, scale, grp, reaches[-1] - reach)

    o, lse, keys = _switch(tier, reaches, run)
    return (o, lse, keys), (q, k_pad, v_pad, ok, ranges, tier, o, lse)


def _tiered_bwd(block, reaches, scale, group, causal, res, cts):
    q, k_pad, v_pad, ok, ranges, tier, o, lse = res
    tiers = _tiers(reaches, causal, block, group)

    def run(t):
        reach, width, grp = tiers[t]
        res_t = (q, k_pad, v_pad, ok if t == 0 else ranges, o, lse)
        return _band_bwd(block, reach, width, scale, grp, reaches[-1] - reach, res_t, cts)

    dq, dk, dv = _switch(tier, reaches, run)
    return dq, dk.astype(k_pad.dtype), dv.astype(v_pad.dtype), None, None, None


band_attention.defvjp(_tiered_fwd, _tiered_bwd)

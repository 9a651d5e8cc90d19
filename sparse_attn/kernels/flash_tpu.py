"""Mosaic (TPU) Pallas kernels: forward, dQ and dK/dV with the tile list as a scalar-prefetched grid axis.

TPU kernels cannot loop over HBM with dynamic loads cheaply, so (like splash attention) the list slot is the
innermost "arbitrary" grid axis: index maps read the prefetched list and the pipeline DMAs the next K/V (or Q) tile
while the current one computes. Partial and full tiles share one merged list (`metadata.merged`) of static width
`cap` with a per-slot masked flag; slots past the count re-read the last tile (no DMA) and skip compute. Layouts
are head-major ([B, H, Np, D]); per-token metadata comes as (tile, 1) columns or (1, tile) rows. Stored element
masks (`ElementMasks`) come as one int8 tile per slot, its row prefetched; a score function's arrays sit in SMEM
and are read at scalar positions only (`kernels.scores`).
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import tpu as pltpu

from sparse_attn.kernels import metadata, scores, tiles
from sparse_attn.kernels.element_masks import ElementMasks, kernel_flags
from sparse_attn.kernels.metadata import TileLists


def _div(a, b):
    return jax.lax.div(a, jnp.int32(b))  # truncating: indices are non-negative, and floor division needs `sign`


def _rem(a, b):
    return jax.lax.rem(a, jnp.int32(b))


def _heads(x_BxNxHxD):
    return jnp.swapaxes(x_BxNxHxD, 1, 2)


def _prefetch(count, idx, masked, rand, mslot):
    flat = [count.reshape(-1), idx.reshape(-1), masked.reshape(-1)]
    return flat + [x.reshape(-1) for x in (rand, mslot) if x is not None]


def _merged(lists_p, lists_f, cap, slots):
    """`metadata.merged` plus, for stored element masks (`slots`: their rows per partial slot), the row of each
    merged slot (a full tile repeats the last partial row: no new DMA)."""
    count, idx, masked, rand = metadata.merged(*lists_p, *lists_f, cap)
    if slots is None:
        return count, idx, masked, rand, None
    t = jnp.arange(cap, dtype=jnp.int32).reshape((1,) * lists_p[0].ndim + (cap,))
    last = jnp.clip(jnp.minimum(t, lists_p[0][..., None] - 1), 0, slots.shape[-1] - 1)
    return count, idx, masked, rand, jnp.take_along_axis(slots, last, axis=-1)


def _buffer_specs(score):
    """A score function's buffers: whole arrays in SMEM (the kernels read them at scalar positions)."""
    if score is None:
        return []
    if score.gathers:
        raise NotImplementedError("score_fn gathers from a closed-over array with index tiles, which the TPU "
                                  "(Mosaic) kernels cannot do: use implementation='xla' for it on TPU")  # fmt: skip
    return [pl.BlockSpec(memory_space=pltpu.SMEM)] * score.num_buffers


def _meta_views(meta, transposed: bool):
    """Arrays and block shapes for the query side (columns; rows when transposed) and the key side (the other)."""
    if isinstance(meta, ElementMasks):
        return [meta.tiles]
    bmax, hmax, n_pad = meta.lo.shape
    col = lambda x: x.reshape(x.shape + (1,))  # noqa: E731
    row = lambda x: x.reshape(x.shape[:-1] + (1, x.shape[-1]))  # noqa: E731
    qv, kv = (row, col) if transposed else (col, row)
    arrays = [qv(meta.lo), qv(meta.hi), qv(meta.tok), kv(meta.tok)]
    if meta.labels is not None:
        lab_rows = meta.labels  # [Bm, Hm, W, Np]
        lab_cols = jnp.swapaxes(meta.labels, -1, -2)
        arrays += [lab_rows, lab_cols] if transposed else [lab_cols, lab_rows]
    return arrays


def _meta_specs(meta, bq, bk, transposed, q_tile, k_tile, bm_hm, mslot):
    """BlockSpecs matching `_meta_views`; q_tile/k_tile/bm_hm/mslot map grid indices (+ prefetch refs) to block
    indices (mslot: the stored mask tile's row)."""
    if isinstance(meta, ElementMasks):
        return [pl.BlockSpec((None, bq, bk), lambda *a: (mslot(*a), 0, 0))]
    w = None if meta.labels is None else meta.labels.shape[2]
    if transposed:  # queries along lanes, keys along sublanes
        qs, ks = (lambda t: (1, t)), (lambda t: (t, 1))
        qi, ki = (lambda x: (0, x)), (lambda x: (x, 0))
    else:
        qs, ks = (lambda t: (t, 1)), (lambda t: (1, t))
        qi, ki = (lambda x: (x, 0)), (lambda x: (0, x))

    def spec(shape2, lead, tile2):
        return pl.BlockSpec((None,) * lead + shape2, lambda *a: _lead(bm_hm(*a), lead) + tile2(*a))

    def _lead(bh, lead):
        return bh[:lead]

    specs = [
        spec(qs(bq), 2, lambda *a: qi(q_tile(*a))),
        spec(qs(bq), 2, lambda *a: qi(q_tile(*a))),
        spec(qs(bq), 1, lambda *a: qi(q_tile(*a))),
        spec(ks(bk), 1, lambda *a: ki(k_tile(*a))),
    ]
    if w is not None:
        if transposed:
            specs += [spec((w, bq), 2, lambda *a: (0, q_tile(*a))), spec((bk, w), 2, lambda *a: (k_tile(*a), 0))]
        else:
            specs += [spec((bq, w), 2, lambda *a: (q_tile(*a), 0)), spec((w, bk), 2, lambda *a: (0, k_tile(*a)))]
    return specs


def _mask(meta_refs, labels, q0, k0, shape, rand, causal, transposed, exclude, stored):
    if stored:
        return tiles.stored_mask(meta_refs[0][...], transposed=transposed)
    lo, hi, q_tok, k_tok = (r[...] for r in meta_refs[:4])
    q_lab, k_lab = [], []
    if labels:
        lq, lk = meta_refs[4], meta_refs[5]
        w = lq.shape[0] if transposed else lq.shape[1]
        for x in range(w):
            q_lab.append(lq[x : x + 1, :] if transposed else lq[:, x : x + 1])
            k_lab.append(lk[:, x : x + 1] if transposed else lk[x : x + 1, :])
    return tiles.tile_mask(
        q0, k0, shape, lo, hi, q_tok, k_tok, q_lab, k_lab, rand, causal=causal, transposed=transposed,
        exclude=exclude,
    )


def _num_meta(labels, stored, score):
    return (1 if stored else 4 + 2 * labels), (0 if score is None else score.num_buffers)


def _q_kernel(*refs, scale, bq, bk, rp, hb, hmax, bmax, qb, cap, causal, labels, exclude, rand, do_bwd, stored,
              score):  # fmt: skip
    """Forward (online softmax) or dQ over one query tile's merged list; slot t is grid axis 2."""
    count_ref, idx_ref, masked_ref = refs[:3]
    rand_ref = refs[3] if rand else None
    refs = refs[3 + rand + stored :]
    nm, nb = _num_meta(labels, stored, score)
    n_in = 6 if do_bwd else 3
    meta_refs, buf_refs = refs[n_in : n_in + nm], refs[n_in + nm : n_in + nm + nb]
    if do_bwd:
        q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = refs[:6]
        dq_ref, acc_scr = refs[n_in + nm + nb :]
    else:
        q_ref, k_ref, v_ref = refs[:3]
        o_ref, lse_ref, m_scr, l_scr, acc_scr = refs[n_in + nm + nb :]
    p, i, t = pl.program_id(0), pl.program_id(1), pl.program_id(2)
    row = _row(p, i, hb, hmax, bmax, qb)
    pos = row * cap + t

    @pl.when(t == 0)
    def _init():
        acc_scr[...] = jnp.zeros_like(acc_scr)
        if not do_bwd:
            m_scr[...] = jnp.full_like(m_scr, -jnp.inf)
            l_scr[...] = jnp.zeros_like(l_scr)

    # With a score function the softmax runs on its (natural-unit) scores; without, on raw logits times c.
    c = tiles.LOG2E if score is not None else scale * tiles.LOG2E

    def body(masked):
        k, v = k_ref[...], v_ref[...]
        ok = None
        k_mm = k  # dQ's matmul operand
        k0 = idx_ref[pos] * bk
        if masked:
            flag = rand_ref[pos] if rand else None
            ok = _mask(meta_refs, labels, i * bq, k0, (bq, bk), flag, causal, False, exclude, stored)
            if do_bwd:
                k_mm = tiles.finite_or_zero(k)
            else:
                k, v = tiles.poison_keys(k, v)
        for r in range(rp):
            s = tiles.dot(q_ref[r], k, tiles.NT)  # raw logits
            ds_factor = 1.0
            if score is not None:
                q_col = i * bq + jax.lax.broadcasted_iota(jnp.int32, (bq, 1), 0)
                k_row = k0 + jax.lax.broadcasted_iota(jnp.int32, (1, bk), 1)
                got = scores.apply(score, buf_refs, s * scale, _div(p, hb), _rem(p, hb) * rp + r, q_col, k_row,
                                   transposed=False, derivative=do_bwd)  # fmt: skip
                s, ds_factor = got if do_bwd else (got, 1.0)
            if do_bwd:
                pr = jnp.exp2(s * c - tiles.lse2(lse_ref[r]))
                ds = tiles.select(ok, pr * (tiles.dot(do_ref[r], v, tiles.NT) - delta_ref[r]) * ds_factor)
                acc_scr[r] = acc_scr[r] + tiles.dot(ds.astype(k.dtype), k_mm)
            else:
                s = tiles.masked_logits(s, ok)
                masks_rows = masked or score is not None  # a score of -inf can empty a row of a full tile
                m, row_sum, acc = tiles.online_update(m_scr[r], l_scr[r], acc_scr[r], s, v, c=c, masked=masks_rows)
                m_scr[r], l_scr[r], acc_scr[r] = m, row_sum, acc

    run = t < count_ref[row]
    pl.when(run & (masked_ref[pos] != 0))(lambda: body(True))
    pl.when(run & (masked_ref[pos] == 0))(lambda: body(False))

    @pl.when(t == cap - 1)
    def _done():
        for r in range(rp):
            if do_bwd:
                dq_ref[r] = (acc_scr[r] * scale).astype(dq_ref.dtype)
            else:
                out, lse = tiles.finalize(m_scr[r], l_scr[r], acc_scr[r], c)
                o_ref[r] = out.astype(o_ref.dtype)
                lse_ref[r] = lse


def _row(p, i, hb, hmax, bmax, qb):
    b, hg = _div(p, hb), _rem(p, hb)
    return ((b * (bmax > 1)) * hmax + hg * (hmax > 1)) * qb + i


def _q_call(q, k, v, extra, meta, lists: TileLists, scale, cap, interpret, do_bwd, score, buffers):
    """Shared launcher of the forward and dQ kernels; q/k/v head-major [B, H|G, N, D]."""
    b, h, n_pad, d = q.shape
    g = k.shape[1]
    bmax, hmax = meta.lead
    bq, bk = lists.block_q, lists.block_k
    qb = lists.kv_count.shape[-1]
    r = h // g
    rp = r if hmax == 1 else 1
    hb = h // rp
    slots = meta.fwd_slot if isinstance(meta, ElementMasks) else None
    pref = _prefetch(*_merged((lists.kv_count, lists.kv_idx, lists.kv_rand), (lists.full_count, lists.full_idx), cap,
                              slots))  # fmt: skip
    rand = lists.kv_rand
    kidx = lambda p, i, t, c, ix, *_: ix[_row(p, i, hb, hmax, bmax, qb) * cap + t]  # noqa: E731
    q_spec = pl.BlockSpec((None, rp, bq, d), lambda p, i, t, *_: (_div(p, hb), _rem(p, hb), i, 0))
    kv_head = lambda p: _div(_rem(p, hb) * rp, r)  # noqa: E731
    kv_spec = pl.BlockSpec((None, None, bk, d), lambda p, i, t, *a: (_div(p, hb), kv_head(p), kidx(p, i, t, *a), 0))
    col_spec = pl.BlockSpec((None, rp, bq, 1), lambda p, i, t, *_: (_div(p, hb), _rem(p, hb), i, 0))
    bm_hm = lambda p, i, t, *_: (_div(p, hb) * (bmax > 1), _rem(p, hb) * (hmax > 1))  # noqa: E731
    mrow = lambda p, i, t, *a: a[-1][_row(p, i, hb, hmax, bmax, qb) * cap + t]  # noqa: E731
    mspecs = _meta_specs(meta, bq, bk, False, lambda p, i, t, *_: i, kidx, bm_hm, mrow) + _buffer_specs(score)
    if do_bwd:
        in_specs = [q_spec, kv_spec, kv_spec, q_spec, col_spec, col_spec] + mspecs
        out_specs = q_spec
        out_shape = jax.ShapeDtypeStruct(q.shape, q.dtype)
        scratch = [pltpu.VMEM((rp, bq, d), jnp.float32)]
    else:
        in_specs = [q_spec, kv_spec, kv_spec] + mspecs
        out_specs = [q_spec, col_spec]
        out_shape = [jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, n_pad, 1), jnp.float32)]
        scratch = [pltpu.VMEM((rp, bq, 1), jnp.float32)] * 2 + [pltpu.VMEM((rp, bq, d), jnp.float32)]
    kernel = functools.partial(
        _q_kernel, scale=scale, bq=bq, bk=bk, rp=rp, hb=hb, hmax=hmax, bmax=bmax, qb=qb, cap=cap,
        rand=rand is not None, do_bwd=do_bwd, **kernel_flags(meta, score),
    )  # fmt: skip
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(pref), grid=(b * hb, qb, cap), in_specs=in_specs, out_specs=out_specs,
            scratch_shapes=scratch,
        ),  # fmt: skip
        out_shape=out_shape,
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary")),
        interpret=interpret,
        name="sparse_flash_dq_tpu" if do_bwd else "sparse_flash_fwd_tpu",
    )(*pref, q, k, v, *extra, *_meta_views(meta, False), *buffers)


def forward(q, k, v, meta, lists: TileLists, scale, caps, *, interpret, score=None, buffers=()):
    """q [B, Nq, H, D], k/v [B, Nk, G, D] -> (out [B, Nq, H, D], lse [B, H, Nq] float32); `meta`: `TokenMeta` or
    `ElementMasks`; `score`, `buffers`: `scores.prepare`'s."""
    out, lse = _q_call(_heads(q), _heads(k), _heads(v), [], meta, lists, scale, caps[0], interpret, False, score,
                       buffers)  # fmt: skip
    return _heads(out), lse[..., 0]


def _kv_kernel(*refs, scale, bq, bk, r, g, hmax, bmax, kb, cap, causal, labels, exclude, rand, stored, score):
    """dK/dV of one key tile of one KV head; grid axes 2 and 3 walk its query heads and their transposed lists."""
    count_ref, idx_ref, masked_ref = refs[:3]
    rand_ref = refs[3] if rand else None
    refs = refs[3 + rand + stored :]
    nm, nb = _num_meta(labels, stored, score)
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref = refs[:6]
    meta_refs, buf_refs = refs[6 : 6 + nm], refs[6 + nm : 6 + nm + nb]
    dk_ref, dv_ref, dk_scr, dv_scr = refs[6 + nm + nb :]
    p, j, rr, t = (pl.program_id(a) for a in range(4))
    row = _kv_row(p, j, rr, r, g, hmax, bmax, kb)
    pos = row * cap + t

    @pl.when((rr == 0) & (t == 0))
    def _init():
        dk_scr[...] = jnp.zeros_like(dk_scr)
        dv_scr[...] = jnp.zeros_like(dv_scr)

    def body(masked):
        q, k, v, do = q_ref[...], k_ref[...], v_ref[...], do_ref[...]
        st = tiles.dot(k, q, tiles.NT)  # [bk, bq]: keys down
        s2t, ds_factor = st * (scale * tiles.LOG2E), 1.0
        q0 = idx_ref[pos] * bq
        if score is not None:
            q_row = q0 + jax.lax.broadcasted_iota(jnp.int32, (1, bq), 1)
            k_col = j * bk + jax.lax.broadcasted_iota(jnp.int32, (bk, 1), 0)
            st, ds_factor = scores.apply(score, buf_refs, st * scale, _div(p, g), _rem(p, g) * r + rr, q_row, k_col,
                                         transposed=True, derivative=True)  # fmt: skip
            s2t = st * tiles.LOG2E
        ok = None
        q_mm = q  # dK's matmul operand
        if masked:
            flag = rand_ref[pos] if rand else None
            ok = _mask(meta_refs, labels, q0, j * bk, (bk, bq), flag, causal, True, exclude, stored)
            q_mm = tiles.finite_or_zero(q)
        pt = tiles.select(ok, jnp.exp2(s2t - tiles.lse2(lse_ref[...])))
        dst = tiles.select(ok, pt * (tiles.dot(v, do, tiles.NT) - delta_ref[...]) * ds_factor)
        dk_scr[...] = dk_scr[...] + tiles.dot(dst.astype(q.dtype), q_mm)
        dv_scr[...] = dv_scr[...] + tiles.dot(pt.astype(do.dtype), do)

    run = t < count_ref[row]
    pl.when(run & (masked_ref[pos] != 0))(lambda: body(True))
    pl.when(run & (masked_ref[pos] == 0))(lambda: body(False))

    @pl.when((rr == r - 1) & (t == cap - 1))
    def _done():
        dk_ref[...] = (dk_scr[...] * scale).astype(dk_ref.dtype)
        dv_ref[...] = dv_scr[...].astype(dv_ref.dtype)


def _kv_row(p, j, rr, r, g, hmax, bmax, kb):
    b, h = _div(p, g), _rem(p, g) * r + rr
    return ((b * (bmax > 1)) * hmax + h * (hmax > 1)) * kb + j


def _kv_call(q, k, v, do, lse_row, delta_row, meta, lists: TileLists, scale, cap, interpret, score, buffers):
    b, h, n_pad, d = q.shape
    g = k.shape[1]
    r = h // g
    bmax, hmax = meta.lead
    bq, bk = lists.block_q, lists.block_k
    kb = lists.q_count.shape[-1]
    slots = meta.bwd_slot if isinstance(meta, ElementMasks) else None
    pref = _prefetch(*_merged((lists.q_count, lists.q_idx, lists.q_rand), (lists.full_q_count, lists.full_q_idx),
                              cap, slots))  # fmt: skip
    rand = lists.q_rand
    qidx = lambda p, j, rr, t, c, ix, *_: ix[_kv_row(p, j, rr, r, g, hmax, bmax, kb) * cap + t]  # noqa: E731
    head = lambda p, rr: _rem(p, g) * r + rr  # noqa: E731
    q_spec = pl.BlockSpec(
        (None, None, bq, d), lambda p, j, rr, t, *a: (_div(p, g), head(p, rr), qidx(p, j, rr, t, *a), 0)
    )
    row_spec = pl.BlockSpec(
        (None, None, 1, bq), lambda p, j, rr, t, *a: (_div(p, g), head(p, rr), 0, qidx(p, j, rr, t, *a))
    )
    kv_spec = pl.BlockSpec((None, None, bk, d), lambda p, j, rr, t, *_: (_div(p, g), _rem(p, g), j, 0))
    bm_hm = lambda p, j, rr, t, *_: (_div(p, g) * (bmax > 1), head(p, rr) * (hmax > 1))  # noqa: E731
    mrow = lambda p, j, rr, t, *a: a[-1][_kv_row(p, j, rr, r, g, hmax, bmax, kb) * cap + t]  # noqa: E731
    mspecs = _meta_specs(meta, bq, bk, True, qidx, lambda p, j, rr, t, *_: j, bm_hm, mrow) + _buffer_specs(score)
    kernel = functools.partial(
        _kv_kernel, scale=scale, bq=bq, bk=bk, r=r, g=g, hmax=hmax, bmax=bmax, kb=kb, cap=cap,
        rand=rand is not None, **kernel_flags(meta, score),
    )  # fmt: skip
    return pl.pallas_call(
        kernel,
        grid_spec=pltpu.PrefetchScalarGridSpec(
            num_scalar_prefetch=len(pref), grid=(b * g, kb, r, cap),
            in_specs=[q_spec, kv_spec, kv_spec, q_spec, row_spec, row_spec] + mspecs,
            out_specs=[kv_spec, kv_spec],
            scratch_shapes=[pltpu.VMEM((bk, d), jnp.float32)] * 2,
        ),  # fmt: skip
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=pltpu.CompilerParams(dimension_semantics=("parallel", "parallel", "arbitrary", "arbitrary")),
        interpret=interpret,
        name="sparse_flash_dkdv_tpu",
    )(*pref, q, k, v, do, lse_row, delta_row, *_meta_views(meta, True), *buffers)


def backward(q, k, v, do, lse, delta, meta, lists: TileLists, scale, caps, *, interpret, score=None, buffers=()):
    """(dq, dk, dv) in the [B, N, heads, D] layout; lse, delta: [B, H, Nq] float32; caps: (dq width, dkdv width)."""
    qh, kh, vh, doh = (_heads(x) for x in (q, k, v, do))
    col, row = (lambda x: x[..., None]), (lambda x: x[..., None, :])
    dq = _q_call(qh, kh, vh, [doh, col(lse), col(delta)], meta, lists, scale, caps[0], interpret, True, score,
                 buffers)  # fmt: skip
    dk, dv = _kv_call(qh, kh, vh, doh, row(lse), row(delta), meta, lists, scale, caps[1], interpret, score, buffers)
    return _heads(dq), _heads(dk), _heads(dv)

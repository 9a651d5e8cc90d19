"""Triton-lowerable Pallas kernels: forward, dQ and dK/dV over data-dependent tile lists.

Forward and dQ: grid (batch * head-groups, query tiles). A program owns `rp` query heads that share a KV head and a
tile list (rp | H/G within an accumulator budget when the pattern is shared over heads, else 1), loads each K/V tile
once for all of them, and
walks `fori_loop(0, count)` over the partial list (masked) then the full list (no mask). dK/dV: grid
(batch * KV heads, key tiles); the program sums over the H/G query heads of its KV head, each walking the
transposed lists of its pattern head. Metadata refs are whole arrays indexed by (b', h', tile, slot).

A partial tile is masked by the per-token rule (`TokenMeta`, `tiles.tile_mask`) or by its stored element mask
(`ElementMasks`: mask-function patterns). A score function (`kernels.scores`) turns the scaled logits into the
scores the online softmax runs on, and its derivative scales dS in the backward.
"""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
from jax.experimental import pallas as pl
from jax.experimental.pallas import triton as plgpu

from sparse_attn.kernels import scores, smem, tiles
from sparse_attn.kernels.element_masks import ElementMasks, kernel_flags
from sparse_attn.kernels.metadata import TileLists, TokenMeta

_WHOLE = pl.no_block_spec


def _meta_refs(meta: TokenMeta | ElementMasks, buffers, transposed: bool):
    """Whole-array refs of what masks a partial tile (per-token arrays, or stored tiles and their slots) and of a
    score function's buffers."""
    if isinstance(meta, ElementMasks):
        arrays = [meta.tiles, meta.bwd_slot if transposed else meta.fwd_slot]
    else:
        arrays = [meta.lo, meta.hi, meta.tok] + ([] if meta.labels is None else [meta.labels])
    arrays = arrays + list(buffers)
    return arrays, [_WHOLE] * len(arrays)


def _unpack_meta(refs, labels, stored, score):
    """(mask refs, buffer refs, rest): mask refs are (tiles, slots) when stored, else (lo, hi, tok, labels|None)."""
    if stored:
        mask, refs = tuple(refs[:2]), refs[2:]
    else:
        lo, hi, tok, lab, refs = _unpack(refs, labels)
        mask = (lo, hi, tok, lab)
    nbuf = 0 if score is None else score.num_buffers
    return mask, refs[:nbuf], refs[nbuf:]


def _unpack(refs, has_labels):
    lo, hi, tok = refs[:3]
    return lo, hi, tok, (refs[3] if has_labels else None), refs[3 + has_labels :]


def _q_side(lo_ref, hi_ref, tok_ref, lab_ref, bm, hm, q0, bq, axis):
    """Query-side metadata of one tile as columns (axis=1) or rows (axis=0)."""
    sl = pl.ds(q0, bq)
    e = lambda x: jnp.expand_dims(x, axis)  # noqa: E731
    labels = [] if lab_ref is None else [e(lab_ref[bm, hm, w, sl]) for w in range(lab_ref.shape[2])]
    return e(lo_ref[bm, hm, sl]), e(hi_ref[bm, hm, sl]), e(tok_ref[bm, sl]), labels


def _k_side(tok_ref, lab_ref, bm, hm, k0, bk, axis):
    sl = pl.ds(k0, bk)
    e = lambda x: jnp.expand_dims(x, axis)  # noqa: E731
    labels = [] if lab_ref is None else [e(lab_ref[bm, hm, w, sl]) for w in range(lab_ref.shape[2])]
    return e(tok_ref[bm, sl]), labels


def _grid_heads(h: int, g: int, hm: int, bq: int, d: int, itemsize: int) -> int:
    """Query heads per forward/dQ program: a power of two dividing the group when the group shares one tile list,
    capped so their query tiles stay within `smem.GROUP_TILE_BYTES` (more heads per program share K/V loads but
    spill registers and, for fp32, overflow shared memory)."""
    r = h // g
    if hm != 1:
        return 1
    cap = smem.max_group_heads(bq, d, itemsize)
    rp = 1
    while r % (2 * rp) == 0 and 2 * rp <= cap:
        rp *= 2
    return rp


def _fwd_kernel(*refs, scale, bq, bk, rp, hb, bmax, hmax, causal, labels, exclude, rand, do_bwd, stored, score):
    """Forward (do_bwd=False) or dQ (do_bwd=True) program for one query tile and rp query heads."""
    kv_count, kv_idx = refs[0], refs[1]
    kv_rand = refs[2] if rand else None
    full_count, full_idx = refs[2 + rand], refs[3 + rand]
    mask_refs, buf_refs, rest = _unpack_meta(refs[4 + rand :], labels, stored, score)
    p, i = pl.program_id(0), pl.program_id(1)
    b, hg = p // hb, p % hb
    bm = b if bmax > 1 else 0
    hm = hg if hmax > 1 else 0
    q0 = i * bq
    if not stored:
        lo_ref, hi_ref, tok_ref, lab_ref = mask_refs
        lo, hi, q_tok, q_lab = _q_side(lo_ref, hi_ref, tok_ref, lab_ref, bm, hm, q0, bq, 1)
    d = rest[0].shape[-1]
    if do_bwd:
        q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dq_ref = rest
        dos = [do_ref[:, r, :] for r in range(rp)]
        lse2 = [tiles.lse2(lse_ref[r, :])[:, None] for r in range(rp)]
        delta = [delta_ref[r, :][:, None] for r in range(rp)]
    else:
        q_ref, k_ref, v_ref, o_ref, lse_ref = rest
    qs = [q_ref[:, r, :] for r in range(rp)]
    # With a score function the softmax runs on its (natural-unit) scores; without, on raw logits times c.
    c = tiles.LOG2E if score is not None else scale * tiles.LOG2E
    q_col = q0 + jax.lax.broadcasted_iota(jnp.int32, (bq, 1), 0)

    def step(t, carry, idx_ref, masked):
        kb = idx_ref[bm, hm, i, t]
        k0 = pl.multiple_of(kb * bk, bk)
        k = k_ref[pl.ds(k0, bk), :]
        v = v_ref[pl.ds(k0, bk), :]
        ok = None
        k_mm = k  # dQ's matmul operand
        if masked and stored:
            ok = tiles.stored_mask(mask_refs[0][mask_refs[1][bm, hm, i, t]], transposed=False)
        elif masked:
            k_tok, k_lab = _k_side(tok_ref, lab_ref, bm, hm, k0, bk, 0)
            flag = kv_rand[bm, hm, i, t] if rand else None
            ok = tiles.tile_mask(
                q0, k0, (bq, bk), lo, hi, q_tok, k_tok, q_lab, k_lab, flag, causal=causal, transposed=False,
                exclude=exclude,
            )
        if masked:
            if do_bwd:
                k_mm = tiles.finite_or_zero(k)
            else:
                k, v = tiles.poison_keys(k, v)
        out = []
        k_row = k0 + jax.lax.broadcasted_iota(jnp.int32, (1, bk), 1)
        for r in range(rp):
            s = tiles.dot(qs[r], k, tiles.NT)  # raw logits
            ds_factor = 1.0
            if score is not None:
                got = scores.apply(score, buf_refs, s * scale, b, hg * rp + r, q_col, k_row, transposed=False,
                                   derivative=do_bwd)  # fmt: skip
                s, ds_factor = got if do_bwd else (got, 1.0)
            if do_bwd:
                pr = jnp.exp2(s * c - lse2[r])
                ds = tiles.select(ok, pr * (tiles.dot(dos[r], v, tiles.NT) - delta[r]) * ds_factor)
                out.append(carry[r] + tiles.dot(ds.astype(k.dtype), k_mm))
            else:
                masks_rows = masked or score is not None  # a score of -inf can empty a row of a full tile
                out.append(tiles.online_update(*carry[r], tiles.masked_logits(s, ok), v, c=c, masked=masks_rows))
        return tuple(out)

    if do_bwd:
        init = tuple(jnp.zeros((bq, d), jnp.float32) for _ in range(rp))
    else:
        init = tuple(
            (jnp.full((bq, 1), -jnp.inf, jnp.float32), jnp.zeros((bq, 1), jnp.float32), jnp.zeros((bq, d), jnp.float32))
            for _ in range(rp)
        )
    carry = jax.lax.fori_loop(0, kv_count[bm, hm, i], functools.partial(step, idx_ref=kv_idx, masked=True), init)
    carry = jax.lax.fori_loop(0, full_count[bm, hm, i], functools.partial(step, idx_ref=full_idx, masked=False), carry)
    for r in range(rp):
        if do_bwd:
            dq_ref[:, r, :] = (carry[r] * scale).astype(dq_ref.dtype)
        else:
            out, lse = tiles.finalize(*carry[r], c)
            o_ref[:, r, :] = out.astype(o_ref.dtype)
            lse_ref[r, :] = lse[:, 0]


def _common(q, k, meta, lists):
    b, n_pad, h, d = q.shape
    g = k.shape[2]
    bmax, hmax = meta.lead
    rp = _grid_heads(h, g, hmax, lists.block_q, d, q.dtype.itemsize)
    return b, n_pad, h, d, g, bmax, hmax, rp


def _list_refs(count, idx, rand, full_count, full_idx):
    arrays = [count, idx] + ([] if rand is None else [rand]) + [full_count, full_idx]
    return arrays, [_WHOLE] * len(arrays)


def forward(q, k, v, meta, lists: TileLists, scale: float, *, num_warps, num_stages, interpret, score=None,
            buffers=()):  # fmt: skip
    """q [B, Nq, H, D], k/v [B, Nk, G, D] (padded to whole tiles) -> (out [B, Nq, H, D], lse [B, H, Nq] float32);
    `meta`: `TokenMeta` or `ElementMasks`; `score`, `buffers`: `scores.prepare`'s."""
    b, n_pad, h, d, g, bmax, hmax, rp = _common(q, k, meta, lists)
    bq, bk = lists.block_q, lists.block_k
    hb, r = h // rp, h // g
    la, ls = _list_refs(lists.kv_count, lists.kv_idx, lists.kv_rand, lists.full_count, lists.full_idx)
    ma, ms = _meta_refs(meta, buffers, False)
    kv_map = lambda p, i: (p // hb, 0, (p % hb) * rp // r, 0)  # noqa: E731
    kernel = functools.partial(
        _fwd_kernel, scale=scale, bq=bq, bk=bk, rp=rp, hb=hb, bmax=bmax, hmax=hmax, rand=lists.kv_rand is not None,
        do_bwd=False, **kernel_flags(meta, score),
    )  # fmt: skip
    return pl.pallas_call(
        kernel,
        grid=(b * hb, lists.kv_count.shape[2]),
        in_specs=ls + ms + [
            pl.BlockSpec((None, bq, rp, d), lambda p, i: (p // hb, i, p % hb, 0)),
            pl.BlockSpec((None, k.shape[1], None, d), kv_map),
            pl.BlockSpec((None, k.shape[1], None, d), kv_map),
        ],  # fmt: skip
        out_specs=[
            pl.BlockSpec((None, bq, rp, d), lambda p, i: (p // hb, i, p % hb, 0)),
            pl.BlockSpec((None, rp, bq), lambda p, i: (p // hb, p % hb, i)),
        ],
        out_shape=[jax.ShapeDtypeStruct(q.shape, q.dtype), jax.ShapeDtypeStruct((b, h, n_pad), jnp.float32)],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="sparse_flash_fwd",
    )(*la, *ma, q, k, v)


def backward_dq(q, k, v, do, lse, delta, meta, lists, scale, *, num_warps, num_stages, interpret, score=None,
                buffers=()):  # fmt: skip
    """dQ [B, Nq, H, D] over the forward lists; lse, delta: [B, H, Nq] float32."""
    b, n_pad, h, d, g, bmax, hmax, rp = _common(q, k, meta, lists)
    bq, bk = lists.block_q, lists.block_k
    hb, r = h // rp, h // g
    la, ls = _list_refs(lists.kv_count, lists.kv_idx, lists.kv_rand, lists.full_count, lists.full_idx)
    ma, ms = _meta_refs(meta, buffers, False)
    kv_map = lambda p, i: (p // hb, 0, (p % hb) * rp // r, 0)  # noqa: E731
    q_spec = pl.BlockSpec((None, bq, rp, d), lambda p, i: (p // hb, i, p % hb, 0))
    row_spec = pl.BlockSpec((None, rp, bq), lambda p, i: (p // hb, p % hb, i))
    kernel = functools.partial(
        _fwd_kernel, scale=scale, bq=bq, bk=bk, rp=rp, hb=hb, bmax=bmax, hmax=hmax, rand=lists.kv_rand is not None,
        do_bwd=True, **kernel_flags(meta, score),
    )  # fmt: skip
    return pl.pallas_call(
        kernel,
        grid=(b * hb, lists.kv_count.shape[2]),
        in_specs=ls + ms + [
            q_spec,
            pl.BlockSpec((None, k.shape[1], None, d), kv_map),
            pl.BlockSpec((None, k.shape[1], None, d), kv_map),
            q_spec, row_spec, row_spec,
        ],  # fmt: skip
        out_specs=q_spec,
        out_shape=jax.ShapeDtypeStruct(q.shape, q.dtype),
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="sparse_flash_dq",
    )(*la, *ma, q, k, v, do, lse, delta)


def _dkdv_kernel(*refs, scale, bq, bk, r, g, bmax, hmax, causal, labels, exclude, rand, stored, score):
    """dK/dV program for one key tile of one KV head: sums over the r query heads that share it."""
    q_count, q_idx = refs[0], refs[1]
    q_rand = refs[2] if rand else None
    full_count, full_idx = refs[2 + rand], refs[3 + rand]
    mask_refs, buf_refs, rest = _unpack_meta(refs[4 + rand :], labels, stored, score)
    lo_ref, hi_ref, tok_ref, lab_ref = (None,) * 4 if stored else mask_refs
    q_ref, k_ref, v_ref, do_ref, lse_ref, delta_ref, dk_ref, dv_ref = rest
    p, j = pl.program_id(0), pl.program_id(1)
    b, kvh = p // g, p % g
    bm = b if bmax > 1 else 0
    k0 = j * bk
    k = k_ref[...]
    v = v_ref[...]
    d = k.shape[-1]
    k_tok, k_lab = _k_side(tok_ref, lab_ref, bm, 0, k0, bk, 1) if lab_ref is None and not stored else (None, None)
    k_col = k0 + jax.lax.broadcasted_iota(jnp.int32, (bk, 1), 0)
    carry = (jnp.zeros((bk, d), jnp.float32), jnp.zeros((bk, d), jnp.float32))
    for rr in range(r):
        h = kvh * r + rr
        hm = h if hmax > 1 else 0
        if lab_ref is not None:  # per-head labels: key-side words depend on the pattern head
            k_tok, k_lab = _k_side(tok_ref, lab_ref, bm, hm, k0, bk, 1)

        def step(t, carry, idx_ref, masked, hm=hm, h=h, k_tok=k_tok, k_lab=k_lab):
            dk, dv = carry
            qb = idx_ref[bm, hm, j, t]
            q0 = pl.multiple_of(qb * bq, bq)
            sl = pl.ds(q0, bq)
            q = q_ref[sl, h, :]
            do = do_ref[sl, h, :]
            st = tiles.dot(k, q, tiles.NT)  # [bk, bq]: keys down
            s2t, ds_factor = st * (scale * tiles.LOG2E), 1.0
            if score is not None:
                q_row = q0 + jax.lax.broadcasted_iota(jnp.int32, (1, bq), 1)
                st, ds_factor = scores.apply(score, buf_refs, st * scale, b, h, q_row, k_col, transposed=True,
                                             derivative=True)  # fmt: skip
                s2t = st * tiles.LOG2E
            ok = None
            q_mm = q  # dK's matmul operand
            if masked and stored:
                ok = tiles.stored_mask(mask_refs[0][mask_refs[1][bm, hm, j, t]], transposed=True)
            elif masked:
                lo, hi, q_tok, q_lab = _q_side(lo_ref, hi_ref, tok_ref, lab_ref, bm, hm, q0, bq, 0)
                flag = q_rand[bm, hm, j, t] if rand else None
                ok = tiles.tile_mask(
                    q0, k0, (bk, bq), lo, hi, q_tok, k_tok, q_lab, k_lab, flag, causal=causal, transposed=True,
                    exclude=exclude,
                )
            if masked:
                q_mm = tiles.finite_or_zero(q)
            pt = tiles.select(ok, jnp.exp2(s2t - tiles.lse2(lse_ref[h, sl])[None, :]))
            dpt = tiles.dot(v, do, tiles.NT)
            dst = tiles.select(ok, pt * (dpt - delta_ref[h, sl][None, :]) * ds_factor)
            return dk + tiles.dot(dst.astype(q.dtype), q_mm), dv + tiles.dot(pt.astype(do.dtype), do)

        carry = jax.lax.fori_loop(0, q_count[bm, hm, j], functools.partial(step, idx_ref=q_idx, masked=True), carry)
        carry = jax.lax.fori_loop(
            0, full_count[bm, hm, j], functools.partial(step, idx_ref=full_idx, masked=False), carry
        )
    dk_ref[...] = (carry[0] * scale).astype(dk_ref.dtype)
    dv_ref[...] = carry[1].astype(dv_ref.dtype)


def backward_dkdv(q, k, v, do, lse, delta, meta, lists, scale, *, num_warps, num_stages, interpret, score=None,
                  buffers=()):  # fmt: skip
    """(dK, dV) [B, Nk, G, D] over the transposed lists."""
    b, n_pad, h, d = q.shape
    g = k.shape[2]
    bmax, hmax = meta.lead
    bq, bk = lists.block_q, lists.block_k
    la, ls = _list_refs(lists.q_count, lists.q_idx, lists.q_rand, lists.full_q_count, lists.full_q_idx)
    ma, ms = _meta_refs(meta, buffers, True)
    kv_spec = pl.BlockSpec((None, bk, None, d), lambda p, j: (p // g, j, p % g, 0))
    whole_b = lambda shape: pl.BlockSpec((None,) + shape, lambda p, j: (p // g,) + (0,) * len(shape))  # noqa: E731
    kernel = functools.partial(
        _dkdv_kernel, scale=scale, bq=bq, bk=bk, r=h // g, g=g, bmax=bmax, hmax=hmax, rand=lists.q_rand is not None,
        **kernel_flags(meta, score),
    )  # fmt: skip
    return pl.pallas_call(
        kernel,
        grid=(b * g, lists.q_count.shape[2]),
        in_specs=ls + ms + [
            whole_b((n_pad, h, d)), kv_spec, kv_spec, whole_b((n_pad, h, d)), whole_b((h, n_pad)), whole_b((h, n_pad)),
        ],  # fmt: skip
        out_specs=[kv_spec, kv_spec],
        out_shape=[jax.ShapeDtypeStruct(k.shape, k.dtype), jax.ShapeDtypeStruct(v.shape, v.dtype)],
        compiler_params=plgpu.CompilerParams(num_warps=num_warps, num_stages=num_stages),
        interpret=interpret,
        name="sparse_flash_dkdv",
    )(*la, *ma, q, k, v, do, lse, delta)

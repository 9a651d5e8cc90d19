"""The "pallas" executor: metadata, padding, `jax.custom_vjp` around the kernels, global rows.

Global query rows (Longformer/BigBird "attend everything" rows) are not computed in the kernels: the tile lists are
built with `global_rows=False` and a dense XLA pass over at most `max_global` rows per sequence overwrites them
afterwards, as the XLA executor does (autodiff handles that pass; overwritten rows send zero cotangent into the
kernels). It is re-stated here (`global_rows`) rather than imported, so the kernels do not depend on the XLA
executor's private helpers.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from sparse_attn.executors.softmax import masked_softmax, sanitize, zero_empty_rows
from sparse_attn.kernels import backward as bwd_lib
from sparse_attn.kernels import flash_gpu, flash_tpu, metadata
from sparse_attn.kernels.config import KernelConfig
from sparse_attn.patterns.intervals import Intervals


@dataclasses.dataclass(frozen=True)
class _Static:
    """Hashable, non-differentiable arguments of the custom VJP."""

    n: int
    scale: float
    cfg: KernelConfig
    caps: tuple[int, ...] | None  # Mosaic list widths: (fwd, fwd transposed, bwd, bwd transposed)


def pallas_attention(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern, scale: float, *, config: KernelConfig | None = None):
    """Executor `fn(q, k, v, pattern, scale, config=...) -> (out [B, N, H, D], lse [B, N, H] float32)` for
    `Intervals` and `BlockLayout` (neighbour lists have no kernel: docs/kernels.md, "Decisions")."""
    b, n, h, d = q_BxNxHxD.shape
    cfg = (config or KernelConfig()).resolve(d)
    mask, random_blocks, max_random, pinned = metadata.split_pattern(pattern)
    sizes = cfg.block_sizes
    fwd_blocks = pinned or (sizes.block_q, sizes.block_k)
    bwd_blocks = pinned or sizes.bwd
    n_pad = _round_up(n, max(fwd_blocks + bwd_blocks))
    lead = metadata.lead_shape(mask, random_blocks)
    meta = metadata.token_meta(mask, lead, n_pad)
    lists_f = metadata.tile_lists(mask, random_blocks, max_random, lead, *fwd_blocks)
    lists_b = lists_f
    if bwd_blocks != fwd_blocks:
        lists_b = metadata.tile_lists(mask, random_blocks, max_random, lead, *bwd_blocks)
    caps = None
    if cfg.backend == "mosaic":
        caps = tuple(
            metadata.capacity(mask, random_blocks is not None, max_random, bq, bk, t)
            for (bq, bk) in (fwd_blocks, bwd_blocks)
            for t in (False, True)
        )
    # Triton tiles need power-of-two extents: zero columns change no logit (scale is explicit) and are sliced off.
    d_pad = max(16, 1 << (d - 1).bit_length()) if cfg.backend == "triton" else d
    pad = ((0, 0), (0, n_pad - n), (0, 0), (0, d_pad - d))
    # The kernels take c = scale * log2(e) > 0 (their running max is in raw logit units): a sign goes into q.
    q_in, kernel_scale = q_BxNxHxD, float(scale)
    if kernel_scale < 0:
        q_in, kernel_scale = -q_in, -kernel_scale
    elif kernel_scale == 0:
        q_in, kernel_scale = jnp.zeros_like(q_in), 1.0
    q, k, v = (jnp.pad(x, pad) for x in (q_in, k_BxNxGxD, v_BxNxGxD))
    parts = pattern if cfg.backward == "xla" else None
    static = _Static(n, kernel_scale, cfg, caps)
    out, lse = _flash(static, q, k, v, meta, lists_f, lists_b, parts)
    out, lse = out[:, :n, :, :d], jnp.swapaxes(lse, 1, 2)[:, :n]
    if mask.global_tokens is not None:
        out, lse = global_rows(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern, scale, out, lse)
    return zero_empty_rows(out, lse), lse


def global_rows(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern, scale, out_BxNxHxD, lse_BxNxH):
    """Overwrites the global query rows with a dense pass over every key (at most `max_global` rows)."""
    b, n, h, d = q_BxNxHxD.shape
    g = k_BxNxGxD.shape[2]
    q_BxNxHxD, poison_q_BxNxH = sanitize(q_BxNxHxD)  # as in the XLA executor: only sanitised values multiply
    k_BxNxGxD, v_BxNxGxD, poison_kv_BxNxG = sanitize(k_BxNxGxD, v_BxNxGxD)
    mask = pattern if isinstance(pattern, Intervals) else pattern.mask
    gmask = jnp.broadcast_to(mask.global_tokens, (b, n))
    rows_BxM = jax.vmap(lambda x: jnp.nonzero(x, size=mask.max_global, fill_value=n)[0])(gmask).astype(jnp.int32)
    bi = jnp.arange(b).reshape(-1, 1)
    q_BxMxGxRxD = q_BxNxHxD[bi, jnp.minimum(rows_BxM, n - 1)].reshape(b, -1, g, h // g, d)
    s = jnp.einsum("bmgrd,bkgd->bgrmk", q_BxMxGxRxD, k_BxNxGxD, preferred_element_type=jnp.float32) * scale
    poison_q = poison_q_BxNxH[bi, jnp.minimum(rows_BxM, n - 1)].reshape(b, -1, g, h // g).transpose(0, 2, 3, 1)
    s = s + poison_q[..., None] + poison_kv_BxNxG.transpose(0, 2, 1)[:, :, None, None, :]
    k_pos = jnp.arange(n, dtype=jnp.int32).reshape(1, 1, 1, n)
    ok = pattern.allowed(rows_BxM.reshape(b, 1, 1, -1), k_pos)[:, :, 0] & (rows_BxM < n).reshape(b, 1, -1, 1)
    ok = ok[:, :, None] if ok.shape[1] == 1 else ok.reshape((ok.shape[0], g, h // g) + ok.shape[2:])  # [B,G|1,R|1,M,N]
    p, lse_g = masked_softmax(s, ok)
    og = jnp.einsum("bgrmk,bkgd->bmgrd", p, v_BxNxGxD.astype(jnp.float32)).reshape(b, -1, h, d)
    lse_g = lse_g.transpose(0, 3, 1, 2).reshape(b, -1, h)
    out = out_BxNxHxD.at[bi, rows_BxM].set(og.astype(out_BxNxHxD.dtype), mode="drop")
    return out, lse_BxNxH.at[bi, rows_BxM].set(lse_g, mode="drop")


def _round_up(x: int, m: int) -> int:
    return math.ceil(x / m) * m


def _forward(static: _Static, q, k, v, meta, lists):
    cfg = static.cfg
    if cfg.backend == "triton":
        sizes = cfg.block_sizes
        warps = sizes.num_warps or (4 if q.shape[-1] <= 64 else 8)
        return flash_gpu.forward(
            q, k, v, meta, lists, static.n, static.scale,
            num_warps=warps, num_stages=sizes.num_stages, interpret=cfg.interpret,
        )  # fmt: skip
    return flash_tpu.forward(q, k, v, meta, lists, static.n, static.scale, static.caps[:2], interpret=cfg.interpret)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(static, q, k, v, meta, lists_f, lists_b, parts):
    return _forward(static, q, k, v, meta, lists_f)


def _flash_fwd(static, q, k, v, meta, lists_f, lists_b, parts):
    out, lse = _forward(static, q, k, v, meta, lists_f)
    return (out, lse), (q, k, v, out, lse, meta, lists_b, parts)


def _flash_bwd(static, res, cotangents):
    q, k, v, out, lse, meta, lists_b, parts = res
    do, dlse = cotangents
    if static.cfg.backward == "xla":
        dq, dk, dv = bwd_lib.xla_backward(q, k, v, do, dlse, parts, static.n, static.scale)
    else:
        bwd_caps = None if static.caps is None else static.caps[2:]
        dq, dk, dv = bwd_lib.pallas_backward(
            q, k, v, out, lse, do, dlse, meta, lists_b, static.n, static.scale, static.cfg, bwd_caps
        )
    return dq, dk, dv, None, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)

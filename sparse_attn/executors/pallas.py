"""The "pallas" executor of `Intervals`, `BlockLayout` and `MaskFnPattern`: the Pallas block-sparse flash kernels
(`sparse_attn.kernels`: Triton for GPU, Mosaic for TPU, interpret mode on CPU) wrapped as an executor. Metadata
(built here, or once by `prepare_pallas` through `sparse_attn.prepare`), padding, `jax.custom_vjp` around the
kernels, global rows; the default on GPU/TPU (XLA stays the CPU default). `implementation="pallas"` on CPU runs the
Triton kernels with `interpret=True` (see `KernelConfig`). Neighbour lists have no kernel (docs/kernels.md,
"Decisions"). `executors/labels/pallas.py` runs label attention's `LabelPattern` through the same kernels
("bucketed_pallas").

Global query rows (Longformer/BigBird "attend everything" rows) are not computed in the kernels: the tile lists are
built with `global_rows=False` and the XLA executor's dense pass over at most `max_global` rows per sequence
(`executors.xla.global_rows`) overwrites them afterwards (autodiff handles that pass; overwritten rows send zero
cotangent into the kernels). `KernelConfig(backward="xla")` differentiates the XLA executor instead of running the
backward kernels (`xla_backward`, the reference backward).

A `MaskFnPattern` runs with its blocks as the tiles and its partial tiles' element masks stored
(`kernels.element_masks`); queries and keys may differ in length. A score function runs inside the kernels
(`kernels.scores`), forward and backward; when the arrays it closes over are differentiated, the backward is
`xla_backward` with the function rebuilt on them (the kernels compute no gradients for a score function's arrays).
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Callable

import jax
import jax.numpy as jnp

from sparse_attn.executors import registry
from sparse_attn.executors.softmax import zero_empty_rows
from sparse_attn.executors.mask_pattern import mask_fn_xla_attention
from sparse_attn.executors.xla import global_positions, global_rows, xla_attention
from sparse_attn.kernels import backward as bwd_lib
from sparse_attn.kernels import element_masks, flash_gpu, flash_tpu, metadata, scores
from sparse_attn.kernels.config import KernelConfig
from sparse_attn.patterns.block_layout import BlockLayout
from sparse_attn.patterns.intervals import Intervals
from sparse_attn.patterns.mask_pattern import MaskFnPattern


@dataclasses.dataclass(frozen=True)
class _Static:
    """Hashable, non-differentiable arguments of the custom VJP."""

    n: tuple[int, int]  # unpadded (query, key) lengths
    scale: float
    cfg: KernelConfig
    caps: tuple[int, ...] | None  # Mosaic list widths: (fwd, fwd transposed, bwd, bwd transposed)
    score: scores.KernelScore | None
    xla_fn: Callable  # the XLA executor the reference backward differentiates


@jax.tree_util.register_dataclass
@dataclasses.dataclass(frozen=True)
class KernelMeta:
    """What `prepare_pallas` builds from the pattern alone: per-token arrays, the forward / backward tile lists
    (the same object when the tiles agree) and the global rows' positions (None without global tokens)."""

    meta: metadata.TokenMeta
    lists_f: metadata.TileLists
    lists_b: metadata.TileLists
    global_pos: jax.Array | None


def _plan(pattern, config: KernelConfig | None, head_dim: int, dtype=None):
    """(resolved config, forward tiles, backward tiles, padded length): static, from the pattern's shapes; the
    inputs' dtype sets only the Triton pipeline stages (the tiles, hence prepared metadata, do not depend on it)."""
    cfg = (config or KernelConfig()).resolve(head_dim, dtype=dtype)
    _, _, _, pinned = metadata.split_pattern(pattern)
    sizes = cfg.block_sizes
    fwd_blocks = pinned or (sizes.block_q, sizes.block_k)
    bwd_blocks = pinned or sizes.bwd
    return cfg, fwd_blocks, bwd_blocks, _round_up(pattern.num_tokens, max(fwd_blocks + bwd_blocks))


def prepare_pallas(pattern, *, head_dim: int | None = None, config: KernelConfig | None = None) -> KernelMeta:
    """The kernels' token metadata and tile lists for `pattern` (`sparse_attn.prepare(..., implementation="pallas",
    head_dim=D)`): the default tile sizes depend on the head size D."""
    if head_dim is None:
        raise ValueError('prepare(..., implementation="pallas") needs head_dim=D: the kernels\' tiles depend on it')
    _, fwd_blocks, bwd_blocks, n_pad = _plan(pattern, config, head_dim)
    mask, random_blocks, max_random, _ = metadata.split_pattern(pattern)
    lead = metadata.lead_shape(mask, random_blocks)
    lists_f = metadata.tile_lists(mask, random_blocks, max_random, lead, *fwd_blocks)
    lists_b = lists_f
    if bwd_blocks != fwd_blocks:
        lists_b = metadata.tile_lists(mask, random_blocks, max_random, lead, *bwd_blocks)
    return KernelMeta(metadata.token_meta(mask, lead, n_pad), lists_f, lists_b, global_positions(mask))


def pallas_attention(
    q_BxNxHxD,
    k_BxNxGxD,
    v_BxNxGxD,
    pattern,
    scale: float,
    *,
    config: KernelConfig | None = None,
    prepared: KernelMeta | None = None,
    score_fn=None,
):
    """Executor `fn(q, k, v, pattern, scale, config=..., prepared=..., score_fn=...) -> (out [B, N, H, D], lse
    [B, N, H] float32)` for `Intervals` and `BlockLayout` (neighbour lists have no kernel: docs/kernels.md,
    "Decisions"); `prepared`: `prepare_pallas`'s metadata for this pattern and config (None: built here)."""
    b, n, h, d = q_BxNxHxD.shape
    cfg, fwd_blocks, bwd_blocks, n_pad = _plan(pattern, config, d, q_BxNxHxD.dtype)
    mask, random_blocks, max_random, _ = metadata.split_pattern(pattern)
    km = prepared if prepared is not None else prepare_pallas(pattern, head_dim=d, config=config)
    caps = None
    if cfg.backend == "mosaic":
        caps = tuple(
            metadata.capacity(mask, random_blocks is not None, max_random, bq, bk, t)
            for (bq, bk) in (fwd_blocks, bwd_blocks)
            for t in (False, True)
        )
    run = _Run(cfg, (n, n), (n_pad, n_pad), scale, score_fn, fwd_blocks, xla_attention)
    out, lse = run(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, km.meta, km.lists_f, km.lists_b, pattern, caps)
    if mask.global_tokens is not None:
        out, lse = global_rows(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern, scale, out, lse, km.global_pos, score_fn)
    return zero_empty_rows(out, lse), lse


def mask_fn_pallas_attention(q_BxNxHxD, k_BxMxGxD, v_BxMxGxD, pattern: MaskFnPattern, scale: float, *,
                             config: KernelConfig | None = None, score_fn=None):  # fmt: skip
    """The kernels on a `MaskFnPattern`: its block lists as tile lists (tiles = the pattern's blocks: powers of two
    >= 16 for Triton, multiples of 128 for Mosaic) and its partial tiles' element masks stored
    (`kernels.element_masks`); query and key lengths may differ. Rows of a query block whose lists overflowed their
    capacity are NaN, as in the XLA executor."""
    b, nq, h, d = q_BxNxHxD.shape
    nk = k_BxMxGxD.shape[1]
    cfg = (config or KernelConfig()).resolve(d, dtype=q_BxNxHxD.dtype)
    bq, bk = pattern.block_q, pattern.block_k
    ok = (lambda x: x >= 16 and x & (x - 1) == 0) if cfg.backend == "triton" else (lambda x: x % 128 == 0)
    if not (ok(bq) and ok(bk)):
        need = "powers of two >= 16 (Triton)" if cfg.backend == "triton" else "multiples of 128 (Mosaic)"
        raise ValueError(f"the pallas executor runs a MaskFnPattern's blocks as its tiles, which must be {need}: got "
                         f"block_size ({bq}, {bk}) (from_mask_fn(..., block_size=...))")  # fmt: skip
    lists, masks, overflow = element_masks.lists_and_masks(pattern, pattern.block_state.shape[:2])
    nqb, nkb = pattern.block_state.shape[2:]
    caps = None
    if cfg.backend == "mosaic":  # merged list widths: (forward, transposed) for the forward and the backward
        widths = (lists.kv_idx, lists.full_idx), (lists.q_idx, lists.full_q_idx)
        caps = tuple(a.shape[-1] + b.shape[-1] for a, b in widths) * 2
    run = _Run(cfg, (nq, nk), (nqb * bq, nkb * bk), scale, score_fn, (bq, bk), mask_fn_xla_attention)
    out, lse = run(q_BxNxHxD, k_BxMxGxD, v_BxMxGxD, masks, lists, lists, pattern, caps)
    rows = jnp.repeat(jnp.broadcast_to(overflow, (b, h, nqb)), bq, axis=-1)[..., :nq].transpose(0, 2, 1)
    out = jnp.where(rows[..., None], jnp.nan, out)
    lse = jnp.where(rows, jnp.nan, lse)
    return zero_empty_rows(out, lse), lse


@dataclasses.dataclass(frozen=True)
class _Run:
    """Padding, the scale's sign, the score function's buffers and the custom VJP around the kernels."""

    cfg: KernelConfig
    n: tuple[int, int]
    n_pad: tuple[int, int]
    scale: float
    score_fn: Callable | None
    tile: tuple[int, int]
    xla_fn: Callable

    def __call__(self, q_BxNxHxD, k_BxMxGxD, v_BxMxGxD, meta, lists_f, lists_b, pattern, caps):
        (nq, nk), (nq_pad, nk_pad), d = self.n, self.n_pad, q_BxNxHxD.shape[-1]
        # Triton tiles need power-of-two extents: zero columns change no logit (scale is explicit) and are sliced off.
        d_pad = max(16, 1 << (d - 1).bit_length()) if self.cfg.backend == "triton" else d
        pad = lambda x, m: jnp.pad(x, ((0, 0), (0, m - x.shape[1]), (0, 0), (0, d_pad - d)))  # noqa: E731
        # The kernels take c = scale * log2(e) > 0 (their running max is in raw logit units): a sign goes into q.
        q_in, kernel_scale = q_BxNxHxD, float(self.scale)
        if kernel_scale < 0:
            q_in, kernel_scale = -q_in, -kernel_scale
        elif kernel_scale == 0:
            q_in, kernel_scale = jnp.zeros_like(q_in), 1.0
        score, buffers = None, ()
        if self.score_fn is not None:
            score, buffers = scores.prepare(self.score_fn, nq, nk, self.tile)
        static = _Static((nq, nk), kernel_scale, self.cfg, caps, score, self.xla_fn)
        out, lse = _flash(static, pad(q_in, nq_pad), pad(k_BxMxGxD, nk_pad), pad(v_BxMxGxD, nk_pad), meta, lists_f,
                          lists_b, pattern, buffers)  # fmt: skip
        return out[:, :nq, :, :d], jnp.swapaxes(lse, 1, 2)[:, :nq]


def _round_up(x: int, m: int) -> int:
    return math.ceil(x / m) * m


def _forward(static: _Static, q, k, v, meta, lists, buffers):
    cfg = static.cfg
    kw = dict(interpret=cfg.interpret, score=static.score, buffers=buffers)
    if cfg.backend == "triton":
        sizes = cfg.block_sizes
        warps = sizes.num_warps or (4 if q.shape[-1] <= 64 else 8)
        return flash_gpu.forward(q, k, v, meta, lists, static.scale, num_warps=warps, num_stages=sizes.num_stages,
                                 **kw)  # fmt: skip
    return flash_tpu.forward(q, k, v, meta, lists, static.scale, static.caps[:2], **kw)


@functools.partial(jax.custom_vjp, nondiff_argnums=(0,))
def _flash(static, q, k, v, meta, lists_f, lists_b, pattern, buffers):
    return _forward(static, q, k, v, meta, lists_f, buffers)


def _flash_fwd(static, q, k, v, meta, lists_f, lists_b, pattern, buffers):
    q, k, v, meta, lists_f, lists_b, pattern = (jax.tree.map(lambda x: x.value, a)
                                                for a in (q, k, v, meta, lists_f, lists_b, pattern))  # fmt: skip
    # Gradients into a score function's buffers come from the XLA backward (kernels do not scatter-add into them).
    via_xla = static.cfg.backward == "xla" or any(x.perturbed for x in buffers)
    buffers = tuple(x.value for x in buffers)
    out, lse = _forward(static, q, k, v, meta, lists_f, buffers)
    return (out, lse), (q, k, v, out, lse, meta, lists_b, pattern if via_xla else None, buffers)


def _flash_bwd(static, res, cotangents):
    q, k, v, out, lse, meta, lists_b, pattern, buffers = res
    do, dlse = (jnp.zeros(c.aval.shape, c.aval.dtype) if isinstance(c, jax.custom_derivatives.SymbolicZero) else c
                for c in cotangents)  # fmt: skip
    dbuf = (None,) * len(buffers)
    if pattern is not None:
        dq, dk, dv, dbuf = xla_backward(q, k, v, do, dlse, pattern, static, buffers)
    else:
        bwd_caps = None if static.caps is None else static.caps[2:]
        dq, dk, dv = bwd_lib.pallas_backward(q, k, v, out, lse, do, dlse, meta, lists_b, static.scale, static.cfg,
                                             bwd_caps, static.score, buffers)  # fmt: skip
    return dq, dk, dv, None, None, None, None, dbuf


_flash.defvjp(_flash_fwd, _flash_bwd, symbolic_zeros=True)


def xla_backward(q, k, v, do, dlse, pattern, static: _Static, buffers):
    """(dq, dk, dv, dbuffers): autodiff of the XLA executor (the reference backward), with the score function
    rebuilt on `buffers` so that they receive gradients.

    Its rule differs from the kernels' only on global query rows, whose cotangent is zero here (the global-row pass
    overwrites them after the kernels), so it is the exact gradient of the kernels' forward.
    """
    nq, nk = static.n

    def f(q_, k_, v_, bufs):
        kw = {}
        if static.score is not None:
            kw["score_fn"] = scores.on_buffers(static.score, bufs)
        return static.xla_fn(q_, k_, v_, pattern, static.scale, **kw)

    _, vjp = jax.vjp(f, q[:, :nq], k[:, :nk], v[:, :nk], buffers)
    dq, dk, dv, dbuf = vjp((do[:, :nq], jnp.swapaxes(dlse, 1, 2)[:, :nq]))
    pad = lambda x, m: jnp.pad(x, ((0, 0), (0, m - x.shape[1]), (0, 0), (0, 0)))  # noqa: E731
    return pad(dq, q.shape[1]), pad(dk, k.shape[1]), pad(dv, v.shape[1]), dbuf


registry.register_executor(Intervals, "pallas", pallas_attention, default_on=("gpu", "tpu"), prepare=prepare_pallas,
                           scores=True)  # fmt: skip
registry.register_executor(BlockLayout, "pallas", pallas_attention, default_on=("gpu", "tpu"), prepare=prepare_pallas,
                           scores=True)  # fmt: skip
registry.register_executor(MaskFnPattern, "pallas", mask_fn_pallas_attention, scores=True)

"""The "pallas" executor of `Intervals` and `BlockLayout`: the Pallas block-sparse flash kernels (`sparse_attn.kernels`:
Triton for GPU, Mosaic for TPU, interpret mode on CPU) wrapped as an executor. Metadata (built here, or once by
`prepare_pallas` through `sparse_attn.prepare`), padding, `jax.custom_vjp` around the kernels, global rows; the
default on GPU/TPU (XLA stays the CPU default). `implementation="pallas"` on CPU runs the Triton kernels with
`interpret=True` (see `KernelConfig`). Neighbour lists have no kernel (docs/kernels.md, "Decisions").
`executors/labels/pallas.py` runs label attention's `LabelPattern` through the same kernels ("bucketed_pallas").

Global query rows (Longformer/BigBird "attend everything" rows) are not computed in the kernels: the tile lists are
built with `global_rows=False` and the XLA executor's dense pass over at most `max_global` rows per sequence
(`executors.xla.global_rows`) overwrites them afterwards (autodiff handles that pass; overwritten rows send zero
cotangent into the kernels). `KernelConfig(backward="xla")` differentiates the XLA executor instead of running the
backward kernels (`xla_backward`, the reference backward).
"""

from __future__ import annotations

import dataclasses
import functools
import math

import jax
import jax.numpy as jnp

from sparse_attn.executors import registry
from sparse_attn.executors.softmax import zero_empty_rows
from sparse_attn.executors.xla import global_positions, global_rows, xla_attention
from sparse_attn.kernels import backward as bwd_lib
from sparse_attn.kernels import flash_gpu, flash_tpu, metadata
from sparse_attn.kernels.config import KernelConfig
from sparse_attn.patterns.block_layout import BlockLayout
from sparse_attn.patterns.intervals import Intervals


@dataclasses.dataclass(frozen=True)
class _Static:
    """Hashable, non-differentiable arguments of the custom VJP."""

    n: int
    scale: float
    cfg: KernelConfig
    caps: tuple[int, ...] | None  # Mosaic list widths: (fwd, fwd transposed, bwd, bwd transposed)


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
):
    """Executor `fn(q, k, v, pattern, scale, config=..., prepared=...) -> (out [B, N, H, D], lse [B, N, H] float32)`
    for `Intervals` and `BlockLayout` (neighbour lists have no kernel: docs/kernels.md, "Decisions"); `prepared`:
    `prepare_pallas`'s metadata for this pattern and config (None: built here)."""
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
    out, lse = _flash(static, q, k, v, km.meta, km.lists_f, km.lists_b, parts)
    out, lse = out[:, :n, :, :d], jnp.swapaxes(lse, 1, 2)[:, :n]
    if mask.global_tokens is not None:
        out, lse = global_rows(q_BxNxHxD, k_BxNxGxD, v_BxNxGxD, pattern, scale, out, lse, km.global_pos)
    return zero_empty_rows(out, lse), lse


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
        dq, dk, dv = xla_backward(q, k, v, do, dlse, parts, static.n, static.scale)
    else:
        bwd_caps = None if static.caps is None else static.caps[2:]
        dq, dk, dv = bwd_lib.pallas_backward(
            q, k, v, out, lse, do, dlse, meta, lists_b, static.n, static.scale, static.cfg, bwd_caps
        )
    return dq, dk, dv, None, None, None, None


_flash.defvjp(_flash_fwd, _flash_bwd)


def xla_backward(q, k, v, do, dlse, pattern, n, scale):
    """Autodiff of the XLA executor (the reference backward).

    Its rule differs from the kernels' only on global query rows, whose cotangent is zero here (the global-row pass
    overwrites them after the kernels), so it is the exact gradient of the kernels' forward.
    """
    cut = lambda x: x[:, :n]  # noqa: E731
    f = lambda q_, k_, v_: xla_attention(q_, k_, v_, pattern, scale)  # noqa: E731
    _, vjp = jax.vjp(f, cut(q), cut(k), cut(v))
    grads = vjp((cut(do), jnp.swapaxes(dlse, 1, 2)[:, :n]))
    pad = ((0, 0), (0, q.shape[1] - n), (0, 0), (0, 0))
    return tuple(jnp.pad(x, pad) for x in grads)


registry.register_executor(Intervals, "pallas", pallas_attention, default_on=("gpu", "tpu"), prepare=prepare_pallas)
registry.register_executor(BlockLayout, "pallas", pallas_attention, default_on=("gpu", "tpu"), prepare=prepare_pallas)

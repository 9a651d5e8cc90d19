"""Backward pass: dQ over the forward tile lists, dK/dV over the transposed lists; or an XLA reference.

Both Pallas backends recompute p = exp2(s2 - lse2) tile by tile (no N x N residual). The gradient of the returned
lse is folded into delta: ds = p * (dp - (rowsum(dO * O) - dlse)).
"""

from __future__ import annotations

import jax
import jax.numpy as jnp

from sparse_attn.executors.xla import xla_attention
from sparse_attn.kernels import flash_gpu, flash_tpu
from sparse_attn.kernels.config import KernelConfig
from sparse_attn.kernels.metadata import TileLists, TokenMeta


def delta_BxHxN(out_BxNxHxD, do_BxNxHxD, dlse_BxHxN):
    """rowsum(dO * O) - dlse in float32, [B, H, Np]."""
    rs = jnp.einsum("bnhd,bnhd->bhn", out_BxNxHxD.astype(jnp.float32), do_BxNxHxD.astype(jnp.float32))
    return rs - dlse_BxHxN


def pallas_backward(q, k, v, out, lse, do, dlse, meta: TokenMeta, lists: TileLists, n, scale, cfg: KernelConfig, caps):
    """(dq, dk, dv) on padded inputs; lse, dlse: [B, H, Np] float32."""
    delta = delta_BxHxN(out, do, dlse)
    sizes = cfg.block_sizes
    if cfg.backend == "triton":
        kw = dict(num_warps=sizes.num_warps or (4 if q.shape[-1] <= 64 else 8), num_stages=sizes.num_stages)
        kw["interpret"] = cfg.interpret
        dq = flash_gpu.backward_dq(q, k, v, do, lse, delta, meta, lists, n, scale, **kw)
        dk, dv = flash_gpu.backward_dkdv(q, k, v, do, lse, delta, meta, lists, n, scale, **kw)
        return dq, dk, dv
    return flash_tpu.backward(q, k, v, do, lse, delta, meta, lists, n, scale, caps, interpret=cfg.interpret)


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

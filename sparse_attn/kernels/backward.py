"""Backward pass: dQ over the forward tile lists, dK/dV over the transposed lists (the XLA reference backward,
`KernelConfig(backward="xla")`, is the executor's: `executors.pallas.xla_backward`).

Both Pallas backends recompute p = exp2(s2 - lse2) tile by tile (no N x N residual). The gradient of the returned
lse is folded into delta: ds = p * (dp - (rowsum(dO * O) - dlse)).
"""

from __future__ import annotations

import jax.numpy as jnp

from sparse_attn.kernels import flash_gpu, flash_tpu
from sparse_attn.kernels.config import KernelConfig
from sparse_attn.kernels.metadata import TileLists


def delta_BxHxN(out_BxNxHxD, do_BxNxHxD, dlse_BxHxN):
    """rowsum(dO * O) - dlse in float32, [B, H, Np]."""
    rs = jnp.einsum("bnhd,bnhd->bhn", out_BxNxHxD.astype(jnp.float32), do_BxNxHxD.astype(jnp.float32))
    return rs - dlse_BxHxN


def pallas_backward(q, k, v, out, lse, do, dlse, meta, lists: TileLists, scale, cfg: KernelConfig, caps, score=None,
                    buffers=()):  # fmt: skip
    """(dq, dk, dv) on padded inputs; lse, dlse: [B, H, Nq] float32; `meta`: `TokenMeta` or `ElementMasks`."""
    delta = delta_BxHxN(out, do, dlse)
    sizes = cfg.block_sizes
    kw = dict(interpret=cfg.interpret, score=score, buffers=buffers)
    if cfg.backend == "triton":
        kw.update(num_warps=sizes.num_warps or (4 if q.shape[-1] <= 64 else 8), num_stages=sizes.num_stages)
        dq = flash_gpu.backward_dq(q, k, v, do, lse, delta, meta, lists, scale, **kw)
        dk, dv = flash_gpu.backward_dkdv(q, k, v, do, lse, delta, meta, lists, scale, **kw)
        return dq, dk, dv
    return flash_tpu.backward(q, k, v, do, lse, delta, meta, lists, scale, caps, **kw)

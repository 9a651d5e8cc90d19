"""The shared-memory model of the Triton launches, the per-dtype defaults it picks, and true-fp32 tile matmuls."""

from __future__ import annotations

import jax
import jax.extend
import jax.numpy as jnp
import pytest

from sparse_attn.executors.pallas import pallas_attention
from sparse_attn.kernels import BlockSizes, KernelConfig, flash_gpu, smem
from tests.kernels import cases

DTYPES = (jnp.bfloat16, jnp.float16, jnp.float32)


def test_the_measured_fp32_failure_is_reproduced_and_does_not_fit():
    """H200: fp32, D=64, 128x128 tiles, 3 stages, two query heads per program asked 263,680 B of 232,448."""
    asked = smem.forward_bytes(128, 128, 64, 4, 3, heads=2)
    assert asked == 263_680
    assert asked > smem.HOPPER_LIMIT
    old_default = BlockSizes(block_q=128, block_k=128, block_q_bwd=64, block_k_bwd=64, num_warps=4, num_stages=3)
    assert not smem.fits(old_default, 64, 4)
    assert smem.fits(old_default, 64, 2)  # the same tiles in bf16 compiled there


@pytest.mark.parametrize("dtype", DTYPES, ids=lambda d: jnp.dtype(d).name)
@pytest.mark.parametrize("d", [32, 64, 128, 256])
def test_every_default_fits_hopper_shared_memory_with_margin(dtype, d):
    blocks = KernelConfig().resolve(d, platform="gpu", dtype=dtype).block_sizes
    used = smem.launch_bytes(blocks, d, jnp.dtype(dtype).itemsize)
    cap = smem.HOPPER_LIMIT * (1 - smem.MARGIN)
    assert used.forward <= cap and used.dq <= cap and used.dkdv <= cap, used
    # Tiles depend on D only: metadata prepared without a dtype serves every dtype.
    bf16 = BlockSizes.default("triton", d)
    assert (blocks.block_q, blocks.block_k, blocks.bwd) == (bf16.block_q, bf16.block_k, bf16.bwd)


def test_bf16_defaults_are_unchanged_and_fp32_drops_stages():
    assert BlockSizes.default("triton", 64, jnp.bfloat16) == BlockSizes(
        block_q=128, block_k=128, block_q_bwd=64, block_k_bwd=64, num_warps=4, num_stages=3
    )
    assert BlockSizes.default("triton", 128, jnp.bfloat16) == BlockSizes(
        block_q=128, block_k=64, block_q_bwd=64, block_k_bwd=64, num_warps=8, num_stages=2
    )
    assert BlockSizes.default("triton", 64, jnp.float32).num_stages == 2
    assert BlockSizes.default("triton", 128, jnp.float32).num_stages == 1


def test_fp32_programs_hold_half_the_query_heads():
    assert flash_gpu._grid_heads(8, 1, 1, 128, 64, 2) == 2
    assert flash_gpu._grid_heads(8, 1, 1, 128, 64, 4) == 1
    assert flash_gpu._grid_heads(8, 1, 1, 64, 32, 4) == 4
    assert flash_gpu._grid_heads(8, 1, 4, 64, 32, 2) == 1  # per-head lists: one head per program


def _dots(jaxpr):
    """Every dot_general inside pallas_call kernels of a (closed) jaxpr, recursively."""
    out = []

    def walk(jx, in_kernel):
        for eqn in jx.eqns:
            inner = in_kernel or eqn.primitive.name == "pallas_call"
            if eqn.primitive.name == "dot_general" and in_kernel:
                out.append(eqn)
            for p in eqn.params.values():
                for sub in p if isinstance(p, (tuple, list)) else (p,):
                    if isinstance(sub, jax.extend.core.ClosedJaxpr):
                        walk(sub.jaxpr, inner)
                    elif isinstance(sub, jax.extend.core.Jaxpr):
                        walk(sub, inner)

    walk(jaxpr.jaxpr, False)
    return out


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["float32", "bfloat16"])
def test_fp32_tile_matmuls_ask_for_full_precision(dtype):
    """fp32 dots in the Triton kernels must not run as TF32: Pallas lowers precision HIGHEST to Triton's "ieee"
    input precision (docs/kernels.md, "Shared memory and fp32"). Checked on the traced kernels, fwd and bwd."""
    n, d = 128, 32
    pattern = cases.make("window_causal", n)
    config = KernelConfig(backend="triton", interpret=False)

    def loss(q, k, v):
        return jnp.sum(pallas_attention(q, k, v, pattern, d**-0.5, config=config)[0].astype(jnp.float32))

    sds = jax.ShapeDtypeStruct
    args = (sds((1, n, 2, d), dtype), sds((1, n, 1, d), dtype), sds((1, n, 1, d), dtype))
    dots = _dots(jax.make_jaxpr(jax.grad(loss, argnums=(0, 1, 2)))(*args))
    assert len(dots) >= 7  # forward 2, dQ 3, dK/dV 4 (each loop body counted once)
    for eqn in dots:
        f32 = all(v.aval.dtype == jnp.float32 for v in eqn.invars)
        highest = eqn.params["precision"] == (jax.lax.Precision.HIGHEST, jax.lax.Precision.HIGHEST)
        assert highest == f32, (eqn.params["precision"], [v.aval.dtype for v in eqn.invars])
    assert any(all(v.aval.dtype == jnp.float32 for v in e.invars) for e in dots) == (dtype == jnp.float32)


def test_fp32_kernels_lower_for_cuda():
    """fp32 inputs with their defaults (2 stages, one query head per program) lower to three Triton calls."""
    n, d = 256, 64
    pattern = cases.make("window_causal", n)
    config = KernelConfig(backend="triton", interpret=False)

    def grads(q, k, v):
        loss = lambda *a: jnp.sum(pallas_attention(*a, pattern, d**-0.5, config=config)[0])  # noqa: E731
        return jax.grad(loss, argnums=(0, 1, 2))(q, k, v)

    args = [jax.ShapeDtypeStruct((1, n, g, d), jnp.float32) for g in (2, 1, 1)]
    call = "__gpu$xla.gpu.triton"
    exported = jax.export.export(
        jax.jit(grads), platforms=["cuda"], disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(call)]
    )(*args)
    assert exported.mlir_module().count(call) == 3

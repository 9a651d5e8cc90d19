"""Pallas kernels (interpret mode) against the dense reference: outputs, lse and gradients for every pattern kind."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparse_attn.executors.pallas import pallas_attention
from sparse_attn.executors.reference import reference_attention
from sparse_attn.kernels import BlockSizes, KernelConfig
from tests.kernels import cases

TOL = {jnp.float32: 5e-5, jnp.bfloat16: 3e-2}  # absolute, on O(1) values; fixed per dtype
TRITON = KernelConfig(backend="triton", interpret=True, block_sizes=BlockSizes(block_q=64, block_k=64))
# Non-square and different forward/backward tiles exercise the second layout and the merged Mosaic lists.
MOSAIC = KernelConfig(
    backend="mosaic", interpret=True,
    block_sizes=BlockSizes(block_q=64, block_k=128, block_q_bwd=128, block_k_bwd=64),
)  # fmt: skip


def _inputs(n, dtype, seed=0):
    ks = jax.random.split(jax.random.key(seed), 5)
    q = jax.random.normal(ks[0], (cases.B, n, cases.H, cases.D), jnp.float32).astype(dtype)
    k = jax.random.normal(ks[1], (cases.B, n, cases.G, cases.D), jnp.float32).astype(dtype)
    v = jax.random.normal(ks[2], (cases.B, n, cases.G, cases.D), jnp.float32).astype(dtype)
    ct = jax.random.normal(ks[3], (cases.B, n, cases.H, cases.D), jnp.float32).astype(dtype)
    ct_lse = jax.random.normal(ks[4], (cases.B, n, cases.H), jnp.float32)
    return q, k, v, ct, ct_lse


# Interpret-mode programs are large and run in milliseconds: spend less time optimising them.
@functools.partial(jax.jit, static_argnames=("impl",), compiler_options={"xla_backend_optimization_level": 0})
def _run(q, k, v, ct, ct_lse, pattern, impl):
    """(out, lse, dq, dk, dv) for the loss <out, ct> + <lse, ct_lse> (lse term on rows that have a key)."""
    if impl == "reference":
        fn = functools.partial(reference_attention, pattern=pattern, scale=cases.D**-0.5)
    else:
        fn = functools.partial(pallas_attention, pattern=pattern, scale=cases.D**-0.5, config=impl)

    def loss(q, k, v):
        out, lse = fn(q, k, v)
        live = jnp.isfinite(lse)
        return jnp.sum(out.astype(jnp.float32) * ct.astype(jnp.float32)) + jnp.sum(jnp.where(live, lse * ct_lse, 0.0))

    out, lse = fn(q, k, v)
    return (out, lse) + jax.grad(loss, argnums=(0, 1, 2))(q, k, v)


def _check(kind, config, dtype, n=256):
    pattern = cases.make(kind, n)
    q, k, v, ct, ct_lse = _inputs(n, dtype)
    got = _run(q, k, v, ct, ct_lse, pattern, config)
    # The oracle sees the same (rounded) inputs in float32.
    want = _run(*(x.astype(jnp.float32) for x in (q, k, v, ct)), ct_lse, pattern, "reference")
    tol = TOL[dtype]
    for name, g, w in zip(("out", "lse", "dq", "dk", "dv"), got, want, strict=True):
        assert g.dtype == (jnp.float32 if name == "lse" else dtype), name
        g, w = np.asarray(g.astype(jnp.float32)), np.asarray(w)
        assert not np.isnan(g).any(), f"{name} has NaN"
        np.testing.assert_array_equal(np.isneginf(g), np.isneginf(w), err_msg=name)
        fin = np.isfinite(w)
        np.testing.assert_allclose(g[fin], w[fin], atol=tol, rtol=tol, err_msg=f"{kind} {name}")

    # Rows with no allowed key: output 0, lse -inf, no gradient into their query.
    dense = np.asarray(pattern.to_dense())  # [B|1, H|1, N, N]
    empty = np.broadcast_to(~dense.any(-1), (cases.B, cases.H, n)).transpose(0, 2, 1)
    out, lse, dq = (np.asarray(x.astype(jnp.float32)) for x in got[:3])
    assert (out[empty] == 0).all() and np.isneginf(lse[empty]).all() and (dq[empty] == 0).all()
    return pattern, (q, k, v), dense


def _masked_keys_get_zero_gradient(pattern, qkv, dense, config, n):
    """Cotangent on one query row only: every key that row may not attend gets exactly zero dK and dV."""
    q, k, v = qkv
    for row in (n // 2 + 3, n - 1):
        ct = jnp.zeros(q.shape, q.dtype).at[:, row].set(1)
        _, _, _, dk, dv = _run(q, k, v, ct, jnp.zeros(q.shape[:3]), pattern, config)
        allowed = np.broadcast_to(dense[:, :, row], (cases.B, cases.H, n))
        allowed = allowed.reshape(cases.B, cases.G, cases.H // cases.G, n).any(2).transpose(0, 2, 1)  # [B, N, G]
        for grad in (dk, dv):
            grad = np.asarray(grad.astype(jnp.float32))
            assert (grad[~allowed] == 0).all()
        assert np.abs(np.asarray(dv.astype(jnp.float32))[allowed]).sum() > 0 or not allowed.any()


@pytest.mark.parametrize("kind", cases.KINDS)
def test_triton_fp32(kind):
    pattern, qkv, dense = _check(kind, TRITON, jnp.float32)
    _masked_keys_get_zero_gradient(pattern, qkv, dense, TRITON, 256)


@pytest.mark.parametrize("kind", ("longformer", "labels", "random_layout"))
def test_triton_bf16(kind):
    _check(kind, TRITON, jnp.bfloat16)


@pytest.mark.parametrize("kind", ("longformer", "labels", "random_layout"))
def test_mosaic_fp32(kind):
    pattern, qkv, dense = _check(kind, MOSAIC, jnp.float32)
    _masked_keys_get_zero_gradient(pattern, qkv, dense, MOSAIC, 256)


def test_mosaic_bf16():
    _check("document", MOSAIC, jnp.bfloat16)


def test_ragged_length_pads_and_slices():
    """n not a multiple of the tiles: padded keys never count, outputs come back at length n."""
    _check("window", TRITON, jnp.float32, n=200)


def test_xla_reference_backward_matches_kernels():
    config = KernelConfig(backend="triton", interpret=True, block_sizes=TRITON.block_sizes, backward="xla")
    pattern = cases.make("longformer")
    inputs = _inputs(256, jnp.float32)
    got = _run(*inputs, pattern, config)
    want = _run(*inputs, pattern, TRITON)
    for g, w in zip(got[2:], want[2:], strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=TOL[jnp.float32], rtol=TOL[jnp.float32])

"""LabelPattern through the kernels in bucket-entry space ("bucketed_pallas", interpret mode) against the dense
reference: outputs, lse, gradients, allowed-key counts, padding rows and keys, non-finite inputs, prepared metadata;
and the entry-space kernels lower for cuda and tpu."""

from __future__ import annotations

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sparse_attn
from sparse_attn.kernels import BlockSizes, KernelConfig
from sparse_attn.patterns.labels import bits as B
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.pattern import LabelPattern

TOL = dict(atol=2e-5, rtol=2e-5)
TRITON = KernelConfig(backend="triton", interpret=True, block_sizes=BlockSizes(block_q=32, block_k=32))
MOSAIC = KernelConfig(backend="mosaic", interpret=True,
                      block_sizes=BlockSizes(block_q=32, block_k=64, block_q_bwd=64, block_k_bwd=32))  # fmt: skip


@functools.partial(jax.jit, static_argnames=("impl", "config"),
                   compiler_options={"xla_backend_optimization_level": 0})  # fmt: skip
def _run(q, k, v, ct, pattern, impl, config=None):
    opts = {} if config is None else {"config": config}

    def loss(q, k, v):
        out, lse, aux = sparse_attn.attention(q, k, v, pattern, implementation=impl, return_lse=True, return_aux=True,
                                              **opts)  # fmt: skip
        return jnp.sum(out * ct) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)), (out, lse, aux)

    return jax.value_and_grad(loss, (0, 1, 2), has_aux=True)(q, k, v)


def _case(label_heads, landmarks, causal, top_k, d=8, n=48):
    b, h, g, dh = 2, 4, 2, 8
    ks = jax.random.split(jax.random.PRNGKey(label_heads + top_k), 5)
    q = jax.random.normal(ks[0], (b, n, h, dh))
    k, v = (jax.random.normal(x, (b, n, g, dh)) for x in ks[1:3])
    ct = jax.random.normal(ks[3], q.shape)
    labels = B.top_k_labels(jax.random.normal(ks[4], (b, label_heads, n, d)), top_k)
    base = BaseGraph(radius=7, landmark_every=landmarks, causal=causal)
    return (q, k, v, ct), LabelPattern.from_labels(labels, d, base=base, valid_len=jnp.asarray([n, 37]))


# d = 8 labels, k = 2 or 3: many pairs share two labels, so a missing dedup would count them twice.
@pytest.mark.parametrize(
    "label_heads,landmarks,causal,top_k,config",
    [(1, 11, False, 2, TRITON), (4, 0, True, 3, TRITON), (1, 0, True, 2, MOSAIC)],
)
def test_bucketed_pallas_matches_the_reference(label_heads, landmarks, causal, top_k, config):
    (q, k, v, ct), pattern = _case(label_heads, landmarks, causal, top_k)
    (_, (out, lse, aux)), grads = _run(q, k, v, ct, pattern, "bucketed_pallas", config)
    (_, (out_r, lse_r, _)), grads_r = _run(q, k, v, ct, pattern, "reference")
    np.testing.assert_allclose(out, out_r, **TOL)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(lse_r))
    np.testing.assert_allclose(np.where(np.isinf(lse_r), 0, lse), np.where(np.isinf(lse_r), 0, lse_r), **TOL)
    for got, want in zip(grads, grads_r, strict=True):
        np.testing.assert_allclose(got, want, **TOL)
    # Padding (batch 1 from 37 on): rows output exactly 0, lse -inf; keys there get exactly zero gradient.
    assert np.all(np.asarray(out)[1, 37:] == 0) and np.all(np.isneginf(np.asarray(lse)[1, 37:]))
    for dx in grads[1:]:
        assert np.all(np.asarray(dx)[1, 37:] == 0)
    np.testing.assert_array_equal(np.asarray(aux["keys"]), np.asarray(pattern.to_dense()).sum(-1) * np.ones((2, 1, 1)))


def test_prepared_metadata_and_nonfinite_inputs_follow_bucketed():
    """A prepared pattern gives the unprepared results bit for bit; a NaN key at a valid position makes exactly the
    rows that read it NaN, as the "bucketed" executor does, and leaves every other row and gradient finite."""
    (q, k, v, ct), pattern = _case(1, 11, False, 2)
    prepared = sparse_attn.prepare(pattern, implementation="bucketed_pallas", head_dim=q.shape[-1], config=TRITON)
    (_, (out, lse, _)), grads = _run(q, k, v, ct, pattern, "bucketed_pallas", TRITON)
    (_, (out_p, lse_p, _)), grads_p = _run(q, k, v, ct, prepared, "bucketed_pallas", TRITON)
    for a, c in zip((out, lse) + tuple(grads), (out_p, lse_p) + tuple(grads_p), strict=True):
        np.testing.assert_array_equal(a, c)
    k_bad = k.at[0, 20, 1].set(jnp.nan)
    got = sparse_attn.attention(q, k_bad, v, pattern, implementation="bucketed_pallas", config=TRITON)
    want = sparse_attn.attention(q, k_bad, v, pattern, implementation="bucketed")
    np.testing.assert_array_equal(np.isnan(got), np.isnan(want))
    assert 0 < np.isnan(np.asarray(got)).sum() < got.size
    np.testing.assert_allclose(np.nan_to_num(got), np.nan_to_num(want), **TOL)


def test_refusals_name_the_problem():
    (q, k, v, _), pattern = _case(1, 0, False, 2)
    with pytest.raises(ValueError, match="backward='pallas'"):
        sparse_attn.attention(q, k, v, pattern, implementation="bucketed_pallas",
                              config=KernelConfig(interpret=True, backward="xla"))  # fmt: skip
    bits_only = LabelPattern(pattern.bits, pattern.valid_len, pattern.base)
    with pytest.raises(ValueError, match="'bucketed_pallas' needs the labels"):
        sparse_attn.attention(q, k, v, bits_only, implementation="bucketed_pallas")


_TRITON_CALL = "__gpu$xla.gpu.triton"


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_entry_space_kernels_lower(platform):
    b, n, h, g, d, dh = 1, 512, 4, 2, 16, 64
    labels = B.top_k_labels(jax.random.normal(jax.random.PRNGKey(0), (b, 1, n, d)), 2)
    pattern = LabelPattern.from_labels(labels, d, base=BaseGraph(radius=128, landmark_every=128, causal=True))
    backend = "triton" if platform == "cuda" else "mosaic"
    config = KernelConfig(backend=backend, interpret=False, block_sizes=BlockSizes.default(backend, dh))

    def loss(q, k, v):
        out = sparse_attn.attention(q, k, v, pattern, implementation="bucketed_pallas", config=config)
        return jnp.sum(out.astype(jnp.float32))

    sds = jax.ShapeDtypeStruct
    args = (sds((b, n, h, dh), jnp.bfloat16), sds((b, n, g, dh), jnp.bfloat16), sds((b, n, g, dh), jnp.bfloat16))
    exported = jax.export.export(
        jax.jit(jax.grad(loss, argnums=(0, 1, 2))), platforms=[platform],
        disabled_checks=[jax.export.DisabledSafetyCheck.custom_call(_TRITON_CALL)],
    )(*args)  # fmt: skip
    module = exported.mlir_module()
    assert module.count(_TRITON_CALL if platform == "cuda" else "tpu_custom_call") == 3  # forward, dQ, dK/dV

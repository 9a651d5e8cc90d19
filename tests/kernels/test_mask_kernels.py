"""The Pallas kernels on mask-function patterns (stored partial-tile masks) against the float64 oracle: every
ready-made predicate, a random predicate over closed-over arrays with Nq != Nk and GQA in fp32 and bf16, the Mosaic
kernels with a score function; capacity overflow and refusals. Interpret mode on CPU."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sparse_attn as sa
from experiments.gpu.measure import reference64
from sparse_attn import score_fns as S
from sparse_attn.kernels import KernelConfig
from sparse_attn.patterns import from_mask_fn
from sparse_attn.patterns import mask_fns as M
from tests.foundation.test_from_mask_fn import (G, H, NK, NQ, READY, N, numpy_mask, random_fn, random_rule)

TRITON = KernelConfig(backend="triton", interpret=True)
MOSAIC = KernelConfig(backend="mosaic", interpret=True)


def _inputs(key, b, nq, nk, h, g, d, dtype="float32"):
    ks = jax.random.split(jax.random.key(key), 4)
    q = jax.random.normal(ks[0], (b, nq, h, d), dtype)
    k, v = (jax.random.normal(x, (b, nk, g, d), dtype) for x in ks[1:3])
    return q, k, v, jax.random.normal(ks[3], (b, nq, h, d), dtype)


def _run(q, k, v, do, pattern, config, score_fn=None):
    f = lambda q, k, v: sa.attention(q, k, v, pattern, implementation="pallas", config=config,  # noqa: E731
                                     score_fn=score_fn)  # fmt: skip
    out, vjp = jax.vjp(f, q, k, v)
    return (out, *vjp(do))


def _check(got, want, tol):
    for name, g, w in zip(("out", "dq", "dk", "dv"), got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), w, atol=tol, rtol=tol, err_msg=name)


def test_every_ready_made_predicate_on_the_triton_kernels():
    q, k, v, do = _inputs(0, 2, N, N, 2, 1, 8)
    for name, (fn, batch, rule) in READY.items():
        pattern = from_mask_fn(fn, N, N, batch=batch, block_size=16)
        got = _run(q, k, v, do, pattern, TRITON)
        mask = numpy_mask(rule, 2, 1, N, N)
        for what, g, w in zip(("out", "dq", "dk", "dv"), got, reference64(q, k, v, do, mask, 8**-0.5), strict=True):
            np.testing.assert_allclose(np.asarray(g, np.float64), w, atol=1e-5, rtol=1e-5, err_msg=f"{name} {what}")


@pytest.mark.parametrize("dtype", ["float32", "bfloat16"])
def test_a_random_predicate_cross_attention_and_gqa_match_the_float64_oracle(dtype):
    pattern = from_mask_fn(random_fn, NQ, NK, batch=2, heads=H, block_size=16)
    q, k, v, do = _inputs(1, 2, NQ, NK, H, G, 8, dtype)
    got = _run(q, k, v, do, pattern, TRITON)
    _check(got, reference64(q, k, v, do, numpy_mask(random_rule, 2, H, NQ, NK), 8**-0.5),
           1e-5 if dtype == "float32" else 4e-2)  # fmt: skip
    assert np.all(np.asarray(got[0][1, 4]) == 0)  # no allowed key: 0, never NaN
    assert np.all(np.asarray(got[2][:, 7]) == 0) and np.all(np.asarray(got[3][:, 7]) == 0)  # masked key


def test_the_mosaic_kernels_with_a_mask_and_a_score_function_match_the_reference():
    """TPU tiles are 128 wide: a prefill chunk of 136 queries against 260 keys, per-head slopes read from SMEM."""
    nq, nk, heads = 136, 260, 2
    ids = jnp.asarray(np.sort(np.random.default_rng(3).integers(0, 3, (1, nk)), axis=1), jnp.int32)

    def fn(b, h, q, k):  # the queries are the last nq positions of the key cache
        return (k <= q + (nk - nq)) & (ids[b, k] == ids[b, q + (nk - nq)]) | (k == 0)

    pattern = from_mask_fn(fn, nq, nk, batch=1, block_size=128)
    score_fn = S.compose(S.alibi(S.alibi_slopes(heads)), S.softcap(5.0))
    q, k, v, do = _inputs(2, 1, nq, nk, heads, 1, 8)
    got = _run(q, k, v, do, pattern, MOSAIC, score_fn)
    f = lambda q, k, v: sa.attention(q, k, v, pattern, implementation="reference", score_fn=score_fn)  # noqa: E731
    out, vjp = jax.vjp(f, q, k, v)
    _check(got, [np.asarray(x, np.float64) for x in (out, *vjp(do))], 2e-5)


def test_a_capacity_too_small_poisons_its_rows_and_bad_tiles_are_refused():
    fn = M.and_masks(M.causal_mask, M.sliding_window_mask(20))
    x = jnp.ones((1, 64, 1, 8))
    out = jax.jit(lambda q: sa.attention(q, q, q, from_mask_fn(fn, 64, 64, block_size=16, capacity=1),
                                         implementation="pallas", config=TRITON))(x)  # fmt: skip
    assert np.isnan(np.asarray(out[0, 32:])).all() and np.isfinite(np.asarray(out[0, :16])).all()
    with pytest.raises(ValueError, match="powers of two >= 16"):
        sa.attention(x, x, x, from_mask_fn(fn, 64, 64, block_size=8), implementation="pallas", config=TRITON)
    with pytest.raises(ValueError, match="multiples of 128"):
        sa.attention(x, x, x, from_mask_fn(fn, 64, 64, block_size=16), implementation="pallas", config=MOSAIC)
    x = jnp.ones((1, 128, 2, 8))
    bias = S.relative_position_bias(jnp.zeros((2, 32)))
    with pytest.raises(NotImplementedError, match="TPU"):
        sa.attention(x, x, x, from_mask_fn(fn, 128, 128, block_size=128), implementation="pallas", config=MOSAIC,
                     score_fn=bias)  # fmt: skip

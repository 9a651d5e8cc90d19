"""`sa.make_attention_fn` as `flax.nnx.MultiHeadAttention`'s `attention_fn`: equal to flax's default attention
(outputs and parameter gradients) on every executor, with and without masks, with a sparse pattern against its
dense mask; fully masked rows give 0; bias, GQA, leading batch dims, dtype; the refusals."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import sparse_attn as sa
from sparse_attn import patterns as P
from sparse_attn.patterns import mask_fns
from sparse_attn.kernels import BlockSizes, KernelConfig

B, N, F, H = 2, 16, 32, 4  # head size D = F / H = 8
VL = np.array([N, 11])
OPTS = {  # "pallas" on CPU: the Triton kernels in interpret mode, small tiles
    "reference": {},
    "xla": {},
    "pallas": dict(config=KernelConfig(backend="triton", interpret=True, block_sizes=BlockSizes(block_q=8, block_k=8))),
}


def mha(attention_fn=nnx.dot_product_attention, **kw):
    """Same seed, same parameters: only the attention function differs."""
    return nnx.MultiHeadAttention(
        num_heads=H, in_features=F, qkv_features=F, decode=False, rngs=nnx.Rngs(0), attention_fn=attention_fn, **kw
    )


def inputs(seed=0):
    kx, kc = jax.random.split(jax.random.key(seed))
    return jax.random.normal(kx, (B, N, F)), jax.random.normal(kc, (B, N, F))


def masks(name):
    valid = np.arange(N)[None] < VL[:, None]
    return {
        "none": None,
        "causal": nnx.make_causal_mask(jnp.ones((B, N))),
        # key padding only: every query keeps some key (no fully masked row)
        "padding": nnx.make_attention_mask(jnp.ones((B, N)), jnp.asarray(valid)),
        # query and key padding: rows past VL[1] of sequence 1 are fully masked
        "padding_qk": nnx.make_attention_mask(jnp.asarray(valid), jnp.asarray(valid)),
    }[name]


@nnx.jit
def value_and_grads(model, x, ct, mask, row_weight):
    """(out, d loss / d params) for loss = sum(out * ct * row_weight)."""

    def loss(model):
        out = model(x, mask=mask)
        return jnp.sum(out * ct * row_weight), out

    (_, out), grads = nnx.value_and_grad(loss, has_aux=True)(model)
    return out, grads


def assert_same(got, want, rows=None, tol=2e-5):
    """Outputs equal on `rows` (bool[B, N]; None: all), parameter gradients equal and finite everywhere."""
    (out, grads), (out_w, grads_w) = got, want
    rows = np.ones((B, N), bool) if rows is None else rows
    np.testing.assert_allclose(np.asarray(out)[rows], np.asarray(out_w)[rows], atol=tol, rtol=tol)
    flat, flat_w = jax.tree.leaves(nnx.to_pure_dict(grads)), jax.tree.leaves(nnx.to_pure_dict(grads_w))
    assert len(flat) == len(flat_w) == 8  # query, key, value, out: kernel and bias
    for g, w in zip(flat, flat_w, strict=True):
        assert np.isfinite(np.asarray(g)).all()
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=tol, rtol=tol)


@pytest.mark.parametrize("mask", ["none", "causal", "padding"])
@pytest.mark.parametrize("impl", sorted(OPTS))
def test_multihead_attention_matches_flax_default(impl, mask):
    """Without a mask `impl` runs; with one the dense route ("reference") runs whatever `impl` says."""
    x, ct = inputs()
    m, one = masks(mask), jnp.ones((B, N, 1))
    ours = mha(sa.make_attention_fn(implementation=impl, **OPTS[impl]))
    assert_same(value_and_grads(ours, x, ct, m, one), value_and_grads(mha(), x, ct, m, one))


@pytest.mark.parametrize("impl", sorted(OPTS))
def test_sliding_window_pattern_matches_its_dense_mask(impl):
    """A callable n -> pattern against flax's default given the same window as a numpy mask."""
    x, ct = inputs(1)
    fn = sa.make_attention_fn(lambda n: P.sliding_window(n, 3, causal=True), implementation=impl, **OPTS[impl])
    i, j = np.arange(N)[:, None], np.arange(N)[None]
    window = jnp.asarray(np.broadcast_to((j <= i) & (j >= i - 3), (B, 1, N, N)))
    one = jnp.ones((B, N, 1))
    assert_same(value_and_grads(mha(fn), x, ct, None, one), value_and_grads(mha(), x, ct, window, one))


@pytest.mark.parametrize("impl", ["reference", "xla"])
def test_mask_function_matches_its_dense_mask(impl):
    """A mask function (a causal window) against flax's default given the same window as a numpy mask."""
    x, ct = inputs(1)
    window = mask_fns.and_masks(mask_fns.causal_mask, mask_fns.sliding_window_mask(3))
    fn = sa.make_attention_fn(window, implementation=impl, block_size=4)
    i, j = np.arange(N)[:, None], np.arange(N)[None]
    dense = jnp.asarray(np.broadcast_to((j <= i) & (j >= i - 3), (B, 1, N, N)))
    one = jnp.ones((B, N, 1))
    assert_same(value_and_grads(mha(fn), x, ct, None, one), value_and_grads(mha(), x, ct, dense, one))


def test_cross_attention_matches_flax():
    """Queries of 16 tokens over 8 context tokens: dense (None), and a per-row key padding as a mask function
    (it reads b: built for the flattened batch) against flax's default with the same dense mask."""
    x, ctx = inputs(5)
    ctx = ctx[:, :8]
    lengths = jnp.asarray([8, 5])

    @nnx.jit
    def run(model, mask):
        return model(x, ctx, mask=mask)

    np.testing.assert_allclose(np.asarray(run(mha(sa.make_attention_fn()), None)), np.asarray(run(mha(), None)),
                               atol=2e-5, rtol=2e-5)  # fmt: skip
    keys = lambda b, h, q_idx, kv_idx: kv_idx < lengths[b]  # noqa: E731
    dense = jnp.asarray(np.arange(8)[None, None, None] < np.asarray(lengths)[:, None, None, None])
    np.testing.assert_allclose(np.asarray(run(mha(sa.make_attention_fn(keys, block_size=4)), None)),
                               np.asarray(run(mha(), jnp.broadcast_to(dense, (B, 1, N, 8)))), atol=2e-5, rtol=2e-5)


def test_fully_masked_rows_give_zero_and_the_other_rows_match():
    """Flax's default gives a fully masked row the mean of V; ours 0 (zero gradients). The rows with a key, and the
    parameter gradients of a loss over them, equal flax's."""
    ks = jax.random.split(jax.random.key(2), 3)
    q, k, v = (jax.random.normal(kk, (B, N, H, 8)) for kk in ks)
    m = masks("padding_qk")
    empty = np.zeros((B, N), bool)
    empty[1, VL[1] :] = True
    out = sa.make_attention_fn()(q, k, v, mask=m)
    flax_out = nnx.dot_product_attention(q, k, v, mask=m)
    np.testing.assert_array_equal(np.asarray(out)[empty], 0.0)
    np.testing.assert_allclose(np.asarray(flax_out)[1, VL[1] :], np.broadcast_to(v[1].mean(0), (N - VL[1], H, 8)),
                               atol=1e-6)  # fmt: skip
    np.testing.assert_allclose(np.asarray(out)[~empty], np.asarray(flax_out)[~empty], atol=2e-5, rtol=2e-5)

    x, ct = inputs(3)
    weight = jnp.asarray(~empty, jnp.float32)[..., None]
    got = value_and_grads(mha(sa.make_attention_fn(implementation="xla")), x, ct, m, weight)
    want = value_and_grads(mha(), x, ct, m, weight)
    assert_same(got, want, rows=~empty)
    out_proj_bias = np.asarray(mha().out.bias[...])
    np.testing.assert_allclose(np.asarray(got[0])[empty], np.broadcast_to(out_proj_bias, (empty.sum(), F)), atol=1e-6)


def test_bias_mask_gqa_batch_dims_and_causal_flag_match_flax():
    """Direct calls: an additive bias (exact, differentiable) with a mask, 2 leading batch dims, GQA (G = 2 < H),
    `is_causal` on a non-causal window pattern and on a BlockLayout (the dense route's causal cut)."""
    ks = jax.random.split(jax.random.key(4), 5)
    lead = (2, 3)
    q = jax.random.normal(ks[0], (*lead, N, H, 8))
    k, v = (jax.random.normal(kk, (*lead, N, 2, 8)) for kk in ks[1:3])
    bias = jax.random.normal(ks[3], (*lead, H, N, N))
    m = jax.random.bernoulli(ks[4], 0.7, (*lead, 1, N, N)) | jnp.eye(N, dtype=bool)[None, None, None]
    fn = sa.make_attention_fn()

    def loss(f, bias):
        return jnp.sum(jnp.sin(f(q, k, v, bias=bias, mask=m)))

    got, want = jax.value_and_grad(lambda b: loss(fn, b))(bias), jax.value_and_grad(
        lambda b: loss(nnx.dot_product_attention, b))(bias)  # fmt: skip
    assert got[1].shape == bias.shape
    for g, w in zip(got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g), np.asarray(w), atol=2e-5, rtol=2e-5)

    i, j = np.arange(N)[:, None], np.arange(N)[None]
    causal_window = jnp.asarray(np.abs(i - j) <= 2) & jnp.asarray(j <= i)
    want = nnx.dot_product_attention(q, k, v, mask=causal_window)
    for pattern in (P.sliding_window(N, 2), P.BlockLayout.from_intervals(P.sliding_window(N, 2), 4, 4)):
        for impl in ("reference", "xla"):
            out = sa.make_attention_fn(pattern, implementation=impl)(q, k, v, is_causal=True)
            np.testing.assert_allclose(np.asarray(out), np.asarray(want), atol=2e-5, rtol=2e-5)


def test_dtype_is_cast_as_flax_does():
    q = k = v = jnp.ones((1, N, H, 8), jnp.float32)
    out = sa.make_attention_fn()(q, k, v, dtype=jnp.bfloat16)
    assert out.dtype == nnx.dot_product_attention(q, k, v, dtype=jnp.bfloat16).dtype == jnp.bfloat16
    model = mha(sa.make_attention_fn(), dtype=jnp.bfloat16)
    assert model(jnp.ones((1, N, F))).dtype == jnp.bfloat16


def test_refusals_name_the_argument():
    x = jnp.ones((1, N, F))
    fn = sa.make_attention_fn()
    dropout = mha(fn, dropout_rate=0.1)
    with pytest.raises(ValueError, match=r"dropout_rate=0.1 with deterministic=False"):
        dropout(x, deterministic=False, rngs=nnx.Rngs(dropout=1))
    assert dropout(x, deterministic=True).shape == x.shape  # no dropout to apply: runs
    with pytest.raises(ValueError, match=r"module is not None .*sow_weights"):
        mha(fn)(x, sow_weights=True)
    with pytest.raises(ValueError, match=r"pattern covers 8 queries and 8 keys but the call has 16 and 16"):
        mha(sa.make_attention_fn(P.causal(8)))(x)
    with pytest.raises(ValueError, match=r"covers 16 queries and 16 keys but the call has 16 and 8"):
        mha(sa.make_attention_fn(lambda n: P.causal(n)))(x, x[:, :8])
    with pytest.raises(ValueError, match=r"is_causal with query length 16 != key length 8"):
        fn(jnp.ones((1, N, H, 8)), jnp.ones((1, 8, H, 8)), jnp.ones((1, 8, H, 8)), is_causal=True)
    with pytest.raises(ValueError, match=r"implementation must be None or one of"):
        mha(sa.make_attention_fn(implementation="nope"))(x, mask=masks("causal")[:1])
    with pytest.raises(ValueError, match=r"mask must broadcast to \[batch..., heads, q_len, kv_len\]"):
        mha(fn)(x, mask=jnp.ones((1, 1, N, N - 1), bool))

"""The XLA executor against the dense reference: outputs, lse and gradients for every baseline and edge case."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sparse_attn as sa
from sparse_attn import patterns as P
from sparse_attn.executors import registry, xla_attention

B, N, H, G, D = 2, 48, 4, 2, 16
TOL = {jnp.float32: dict(out=1e-5, grad=5e-5), jnp.bfloat16: dict(out=2e-2, grad=5e-2)}
VL = jnp.array([N, 30])


def qkv(dtype=jnp.float32, g=G, h=H, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(ks[0], (B, N, h, D)).astype(dtype)
    k = jax.random.normal(ks[1], (B, N, g, D)).astype(dtype)
    v = jax.random.normal(ks[2], (B, N, g, D)).astype(dtype)
    ct = jax.random.normal(ks[3], (B, N, h, D))
    return q, k, v, ct


def neighbours():
    rng = np.random.default_rng(0)
    idx = np.stack([np.arange(N), rng.integers(0, N, N), rng.integers(0, N, N)], -1)[None, None]
    valid = np.ones_like(idx, bool)
    valid[..., 1] &= idx[..., 1] != idx[..., 0]
    valid[..., 2] &= (idx[..., 2] != idx[..., 0]) & (idx[..., 2] != idx[..., 1])
    valid[..., 5, :] = False  # a row with no key at all
    bias = rng.normal(size=idx.shape).astype(np.float32)
    return P.NeighbourList(jnp.asarray(idx, jnp.int32), jnp.asarray(valid), jnp.asarray(bias))


PATTERNS = {
    "dense": lambda: P.dense(N, valid_len=VL),
    "causal": lambda: P.causal(N),
    "window": lambda: P.sliding_window(N, 5, valid_len=VL),
    "causal_window": lambda: P.sliding_window(N, 5, causal=True),
    "longformer": lambda: P.longformer(N, 3, 2, valid_len=VL),
    "causal_longformer": lambda: P.longformer(N, 3, 2, causal=True),
    "bigbird": lambda: P.bigbird(N, 3, 1, 1, 8, jax.random.PRNGKey(1), valid_len=VL, batch=B),
    "documents": lambda: P.document_mask(jnp.asarray([[0] * 20 + [1] * 28, [0] * 7 + [1] * 41]), radius=6),
    "neighbours": neighbours,
}


def run(impl, pattern, q, k, v, ct, **opts):
    """(out, lse, (dq, dk, dv)) for loss = sum(out * ct) + sum of finite lse."""

    def loss(q, k, v):
        out, lse = sa.attention(q, k, v, pattern, implementation=impl, return_lse=True, **opts)
        finite = jnp.where(jnp.isfinite(lse), lse, 0.0)
        return jnp.sum(out.astype(jnp.float32) * ct) + jnp.sum(finite), (out, lse)

    (_, (out, lse)), grads = jax.jit(jax.value_and_grad(loss, argnums=(0, 1, 2), has_aux=True))(q, k, v)
    return out, lse, grads


@pytest.mark.parametrize("dtype", [jnp.float32, jnp.bfloat16], ids=["fp32", "bf16"])
@pytest.mark.parametrize("name", sorted(PATTERNS))
def test_xla_matches_reference(name, dtype):
    q, k, v, ct = qkv(dtype)
    pattern = PATTERNS[name]()
    ref = run("reference", pattern, q.astype(jnp.float32), k.astype(jnp.float32), v.astype(jnp.float32), ct)
    got = run("xla", pattern, q, k, v, ct, block=16)
    tol = TOL[dtype]
    assert got[0].dtype == dtype and got[1].dtype == jnp.float32
    np.testing.assert_allclose(np.asarray(got[0], np.float32), ref[0], atol=tol["out"], rtol=tol["out"])
    np.testing.assert_array_equal(np.isfinite(got[1]), np.isfinite(ref[1]))
    np.testing.assert_allclose(np.where(np.isfinite(ref[1]), got[1], 0), np.where(np.isfinite(ref[1]), ref[1], 0),
                               atol=tol["out"] * 10, rtol=tol["out"])
    for g_got, g_ref in zip(got[2], ref[2], strict=True):
        assert np.isfinite(np.asarray(g_got, np.float32)).all()
        np.testing.assert_allclose(np.asarray(g_got, np.float32), g_ref, atol=tol["grad"], rtol=tol["grad"])


@pytest.mark.parametrize("impl", ["reference", "xla"])
def test_rows_with_no_key_give_zero_output_lse_minus_inf_and_zero_grad(impl):
    q, k, v, ct = qkv()
    lo = jnp.asarray(np.where(np.arange(N) % 3 == 0, 1, np.maximum(np.arange(N) - 2, 0)), jnp.int32)[None, None]
    hi = jnp.asarray(np.where(np.arange(N) % 3 == 0, 0, np.arange(N)), jnp.int32)[None, None]
    pattern = P.Intervals(lo, hi, valid_len=jnp.array([N, 0]), reach=(2, 0))
    out, lse, (dq, dk, dv) = run(impl, pattern, q, k, v, ct)
    empty = np.zeros((B, N), bool)
    empty[0, ::3] = True
    empty[1] = True
    assert (np.asarray(out)[empty] == 0).all()
    assert np.isneginf(np.asarray(lse)[empty]).all() and np.isfinite(np.asarray(lse)[~empty]).all()
    assert (np.asarray(dq)[empty] == 0).all()
    assert (np.asarray(dk)[1] == 0).all() and (np.asarray(dv)[1] == 0).all()
    for g in (dq, dk, dv):
        assert np.isfinite(np.asarray(g)).all()


@pytest.mark.parametrize("impl", ["reference", "xla"])
@pytest.mark.parametrize("name", ["window", "longformer", "bigbird", "neighbours"])
def test_masked_keys_get_exactly_zero_gradient(impl, name):
    q, k, v, _ = qkv()
    pattern = PATTERNS[name]()
    allowed = np.asarray(jnp.broadcast_to(pattern.to_dense(), (B, H, N, N)))
    i = 17

    def row_out(k, v):
        return jnp.sum(sa.attention(q, k, v, pattern, implementation=impl)[:, i] ** 2)

    dk, dv = jax.jit(jax.grad(row_out, argnums=(0, 1)))(k, v)
    # key j of KV head g is reachable from query i iff some query head of group g allows it
    reach = allowed[:, :, i, :].reshape(B, G, H // G, N).any(2)  # [B, G, N]
    for g in (dk, dv):
        g = np.asarray(g).transpose(0, 2, 1, 3)  # [B, G, N, D]
        assert (g[~reach] == 0).all()
        assert np.abs(g[reach]).sum() > 0


def test_gqa_mqa_and_per_head_patterns():
    q, k, v, ct = qkv(g=1)
    lo = jnp.stack([P.sliding_window(N, r).lo[:, 0] for r in (1, 2, 4, 8)], axis=1)
    hi = jnp.stack([P.sliding_window(N, r).hi[:, 0] for r in (1, 2, 4, 8)], axis=1)
    per_head = P.Intervals(lo, hi, reach=(8, 8))
    nl = neighbours()
    nl_heads = P.NeighbourList(*(jnp.concatenate([x, jnp.roll(x, 1, axis=2)] * 2, axis=1) for x in (nl.idx, nl.valid, nl.bias)))
    for pattern in (per_head, nl_heads):
        ref = run("reference", pattern, q, k, v, ct)
        got = run("xla", pattern, q, k, v, ct, block=16)
        np.testing.assert_allclose(got[0], ref[0], atol=1e-5, rtol=1e-5)
        for a, b in zip(got[2], ref[2], strict=True):
            np.testing.assert_allclose(a, b, atol=5e-5, rtol=5e-5)


def test_reference_matches_jax_dense_attention():
    q, k, v, _ = qkv(g=H)
    want = jax.nn.dot_product_attention(q, k, v, is_causal=True)
    got = sa.attention(q, k, v, P.causal(N), implementation="reference")
    np.testing.assert_allclose(got, want, atol=1e-5, rtol=1e-5)


def test_dispatch_and_input_errors():
    q, k, v, _ = qkv()
    assert sa.default_implementation("cpu") == "xla"
    out = sa.attention(q, k, v, P.causal(N))
    want = sa.resolve_implementation(P.causal(N))
    np.testing.assert_allclose(out, sa.attention(q, k, v, P.causal(N), implementation=want), atol=0)
    with pytest.raises(ValueError, match="not an implementation of Intervals patterns"):
        sa.attention(q, k, v, P.causal(N), implementation="cuda-magic")
    with pytest.raises(ValueError, match="multiple of KV heads"):
        sa.attention(q, k[:, :, :1].repeat(3, 2), v[:, :, :1].repeat(3, 2), P.causal(N))
    with pytest.raises(ValueError, match="pattern covers"):
        sa.attention(q, k, v, P.causal(N + 1))
    with pytest.raises(ValueError, match=r"\[B, N, heads, D\]"):
        sa.attention(q[0], k, v, P.causal(N))
    with pytest.raises(ValueError, match="floating"):
        sa.attention(q.astype(jnp.int32), k, v, P.causal(N))
    with pytest.raises(ValueError, match="batch axis"):
        sa.attention(q, k, v, P.causal(N, valid_len=jnp.array([1, 2, 3])))


def test_cpu_default_depends_on_the_pattern():
    """The registry alone maps None to an executor: on CPU a dense Intervals (reach spanning the sequence) runs
    "reference" (measured: sparse_attn/executors/reference.py), any other Intervals "xla"; accelerators "pallas"."""
    dense, causal, window = P.dense(N), P.causal(N), P.sliding_window(N, 4, causal=True)
    assert sa.default_implementation("cpu", pattern=dense) == "reference"
    assert sa.default_implementation("cpu", pattern=causal) == "reference"
    assert sa.default_implementation("cpu", pattern=window) == "xla"
    assert sa.default_implementation("cpu", pattern=P.sliding_window(N, N - 1)) == "reference"  # spans: dense
    assert sa.default_implementation("gpu", pattern=dense) == "pallas"
    assert sa.default_implementation("cpu", P.BlockLayout) == "xla"
    if jax.default_backend() == "cpu":
        assert sa.resolve_implementation(dense) == "reference" and sa.resolve_implementation(window) == "xla"
        assert sa.prepare(dense).implementation == "reference"
    assert sa.resolve_implementation(dense, "xla") == "xla"
    with pytest.raises(ValueError, match="not an implementation of Intervals patterns"):
        sa.resolve_implementation(dense, "packed")


def test_register_default_and_counterpart():
    """Conditional defaults come first (newest first) for the patterns they accept; `counterpart` keeps a name the
    pattern type has and falls back to its default otherwise."""
    class Striped(P.Intervals):  # its own registration: the table of Intervals is not touched
        pass

    striped = Striped(**{f: getattr(P.dense(N), f) for f in ("lo", "hi", "causal", "reach")})
    sa.register_executor(Striped, "xla", xla_attention, default_on="cpu")
    assert registry.default(Striped, "cpu", striped) == "xla"
    registry.register_default(Striped, "reference", on="cpu", when=lambda p: p.num_tokens > 8)
    assert registry.default(Striped, "cpu", striped) == "reference"
    assert registry.default(Striped, "cpu") == "xla"  # no pattern: the unconditional default
    assert registry.default(Striped, "gpu", striped) == "xla"  # the portable choice, no rule for gpu
    with pytest.raises(ValueError, match="register executor 'fast'"):
        registry.register_default(Striped, "fast", on="cpu")
    with pytest.raises(ValueError, match="platforms"):
        registry.register_default(Striped, "xla", on="quantum")
    nl = P.NeighbourList(jnp.zeros((1, 1, N, 1), jnp.int32), jnp.ones((1, 1, N, 1), bool))
    assert registry.counterpart(nl, "reference") == "reference"
    assert registry.counterpart(nl, "pallas", "gpu") == "xla"  # no kernel for neighbour lists: their default
    assert registry.counterpart(nl, None, "cpu") == "xla"

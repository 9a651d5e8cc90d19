"""The bucket-sorted work-skipping executor == the dense reference on the same label pattern (outputs, grads)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from label_oracles import outputs_and_grads

from sparse_attn.executors.labels.bucketed import bucketed_attention, default_reach
from sparse_attn.executors.reference import reference_attention
from sparse_attn.patterns.labels import bits as B
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.pattern import LabelPattern

TOL = dict(atol=2e-5, rtol=2e-5)  # float32 executor vs float32 dense reference


def _qkv(b, n, h, g, dh, seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    return (
        jax.random.normal(ks[0], (b, n, h, dh)),
        jax.random.normal(ks[1], (b, n, g, dh)),
        jax.random.normal(ks[2], (b, n, g, dh)),
        jax.random.normal(ks[3], (b, n, h, dh)),
    )


@pytest.mark.parametrize(
    "label_heads,causal,d,k,block,reach,group",
    [
        (1, False, 8, 2, 16, None, 1024),  # default reach
        (1, True, 40, 3, 8, 12, 16),  # two bitmask words, several scan groups, band not block-aligned
        (4, False, 6, 1, 16, 8, 32),  # per-head labels, k = 1 (no dedup)
        (4, True, 8, 2, 32, None, 64),
    ],
)
def test_outputs_and_gradients_match_the_reference(label_heads, causal, d, k, block, reach, group):
    b, n, h, g, dh = 2, 56, 4, 2, 8
    q, kk, v, ct = _qkv(b, n, h, g, dh)
    labels = B.top_k_labels(jax.random.normal(jax.random.PRNGKey(7), (b, label_heads, n, d)), k)
    vl = jnp.asarray([n, 41])
    base = BaseGraph(radius=9, landmark_every=13, causal=causal)
    pattern = LabelPattern(B.pack_labels(labels, d), vl, base)

    def ours(q, kk, v):
        out, lse, info = bucketed_attention(
            q, kk, v, labels, num_labels=d, base=base, valid_len=vl, block=block, reach=reach, group_entries=group
        )
        return out, lse, info

    def ref(q, kk, v):
        return reference_attention(q, kk, v, pattern, 1 / np.sqrt(dh))

    ((out, lse, info), g_ours), ((r_out, r_lse), g_ref) = outputs_and_grads(ours, ref, q, kk, v, ct)
    assert int(info["overflow"]) == 0
    np.testing.assert_allclose(np.asarray(out), np.asarray(r_out), **TOL)
    np.testing.assert_array_equal(np.isfinite(lse), np.isfinite(r_lse))
    finite = jnp.isfinite(r_lse)
    np.testing.assert_allclose(np.asarray(jnp.where(finite, lse, 0)), np.asarray(jnp.where(finite, r_lse, 0)), **TOL)
    np.testing.assert_array_equal(
        np.asarray(info["keys"]), np.broadcast_to(np.asarray(pattern.to_dense()).sum(-1), info["keys"].shape)
    )
    for a, r in zip(g_ours, g_ref, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(r), **TOL)


def test_masked_keys_and_padding_get_exactly_zero_gradient():
    b, n, h, dh, d = 1, 40, 2, 8, 8
    q, kk, v, ct = _qkv(b, n, h, h, dh, seed=1)
    labels = B.top_k_labels(jax.random.normal(jax.random.PRNGKey(3), (1, 1, n, d)), 2)
    base = BaseGraph(radius=4, landmark_every=10)
    vl = jnp.asarray([33])
    mask = np.asarray(LabelPattern(B.pack_labels(labels, d), vl, base).to_dense())[0, 0]
    u = 20

    def fn(q, kk, v):
        return bucketed_attention(q, kk, v, labels, num_labels=d, base=base, valid_len=vl, block=16)[0]

    @jax.jit
    def outputs_and_grads(q, kk, v):
        out = fn(q, kk, v)
        row = jax.grad(lambda kk, v: jnp.sum(fn(q, kk, v)[0, u] * ct[0, u]), argnums=(0, 1))(kk, v)
        return out, row, jax.grad(lambda q: jnp.sum(fn(q, kk, v)))(q)

    out, (gk, gv), gq = outputs_and_grads(q, kk, v)
    hit = np.any(np.asarray(gk)[0] != 0, axis=(1, 2)) | np.any(np.asarray(gv)[0] != 0, axis=(1, 2))
    np.testing.assert_array_equal(hit, mask[u])
    assert np.all(np.asarray(out)[0, 33:] == 0)
    assert np.all(np.asarray(gq)[0, 33:] == 0)


def test_every_token_disconnected_gives_its_own_value_and_no_nan():
    b, n, h, dh = 1, 32, 2, 4
    q, kk, v, _ = _qkv(b, n, h, h, dh, seed=2)
    labels = (jnp.arange(n) % 32).reshape(1, 1, n, 1)  # distinct labels: no token shares one
    for base in (BaseGraph(radius=3), BaseGraph(radius=5, landmark_every=8, causal=True)):

        @jax.jit
        def run(q, kk, v, base=base):
            def fn(q, kk, v):
                return bucketed_attention(q, kk, v, labels, num_labels=32, base=base, block=16)

            return fn(q, kk, v), jax.grad(lambda *a: jnp.sum(fn(*a)[0]), argnums=(0, 1, 2))(q, kk, v)

        (out, _, info), grads = run(q, kk, v)
        np.testing.assert_allclose(np.asarray(out), np.asarray(v), atol=1e-6)
        np.testing.assert_array_equal(np.asarray(info["keys"]), 1)
        assert all(np.all(np.isfinite(np.asarray(x))) for x in grads)
        # A softmax over one key does not depend on its logit: 0 up to float32 rounding of p (dP - Δ).
        np.testing.assert_allclose(np.asarray(grads[1]), 0.0, atol=1e-5)


def test_default_reach_and_bad_inputs():
    base = BaseGraph(radius=2048, landmark_every=512)
    assert default_reach(8192, base, 32, 2) >= 2048 * 2 // 32
    q, kk, v, _ = _qkv(1, 16, 2, 2, 4)
    labels = jnp.zeros((1, 1, 16, 1), jnp.int32)
    with pytest.raises(ValueError, match="num_labels"):
        bucketed_attention(q, kk, v, labels, num_labels=65, base=base)
    with pytest.raises(ValueError, match="top_k"):
        bucketed_attention(q, kk, v, jnp.zeros((1, 1, 16, 3), jnp.int32), num_labels=2, base=base)
    with pytest.raises(ValueError, match="labels must be"):
        bucketed_attention(q, kk, v, jnp.zeros((1, 3, 16, 1), jnp.int32), num_labels=2, base=base)
    with pytest.raises(ValueError, match="labels must be"):
        bucketed_attention(q, kk, v, jnp.zeros((1, 1, 15, 1), jnp.int32), num_labels=2, base=base)
    with pytest.raises(ValueError, match="q/k/v"):
        bucketed_attention(q, kk[:, :8], v[:, :8], labels, num_labels=2, base=base)


def test_edge_geometry_short_sequences_and_empty_batches():
    """n < block, radius >= n, a single landmark, and a sequence with valid_len = 0."""
    b, n, h, dh, d = 2, 5, 2, 4, 3
    q, kk, v, _ = _qkv(b, n, h, 1, dh, seed=5)
    labels = B.top_k_labels(jax.random.normal(jax.random.PRNGKey(6), (b, 1, n, d)), 2)
    vl = jnp.asarray([n, 0])
    for base in (BaseGraph(radius=50, landmark_every=7), BaseGraph(radius=1, landmark_every=3, causal=True)):
        out, lse, info = jax.jit(
            lambda q, kk, v, base=base: bucketed_attention(
                q, kk, v, labels, num_labels=d, base=base, valid_len=vl, block=16
            )
        )(q, kk, v)
        r_out, _ = reference_attention(q, kk, v, LabelPattern(B.pack_labels(labels, d), vl, base), 1 / np.sqrt(dh))
        np.testing.assert_allclose(np.asarray(out), np.asarray(r_out), **TOL)
        assert np.all(np.asarray(out)[1] == 0) and np.all(np.isneginf(np.asarray(lse)[1]))
        assert int(info["overflow"]) == 0 and np.all(np.asarray(info["keys"])[1] == 0)

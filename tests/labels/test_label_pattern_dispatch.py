"""LabelPattern is a first-class pattern: `attention()` runs it with every registered executor, each equal to
"reference" (outputs, lse and gradients)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sparse_attn
from sparse_attn.patterns.labels import bits as B
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.pattern import LabelPattern

TOL = dict(atol=2e-5, rtol=2e-5)


def _run(pattern, impl, q, k, v, ct, **options):
    def loss(q, k, v):
        out, lse = sparse_attn.attention(q, k, v, pattern, implementation=impl, return_lse=True, **options)
        return jnp.sum(out * ct) + jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0)), (out, lse)

    return jax.jit(jax.value_and_grad(loss, (0, 1, 2), has_aux=True))(q, k, v)


@pytest.mark.parametrize(
    "impl,label_heads,landmarks,causal",
    [("bucketed", 1, 11, False), ("bucketed", 4, 0, True), ("xla", 4, 0, False), ("pallas", 1, 0, True)],
)
def test_every_executor_matches_the_reference(impl, label_heads, landmarks, causal):
    b, n, h, g, d, dh = 2, 48, 4, 2, 8, 8
    ks = jax.random.split(jax.random.PRNGKey(0), 5)
    q = jax.random.normal(ks[0], (b, n, h, dh))
    k, v = (jax.random.normal(x, (b, n, g, dh)) for x in ks[1:3])
    ct = jax.random.normal(ks[3], q.shape)
    labels = B.top_k_labels(jax.random.normal(ks[4], (b, label_heads, n, d)), 2)
    base = BaseGraph(radius=7, landmark_every=landmarks, causal=causal)
    pattern = LabelPattern.from_labels(labels, d, base=base, valid_len=jnp.asarray([n, 37]))
    options = {"config": sparse_attn.kernels.KernelConfig(interpret=True)} if impl == "pallas" else {}
    ((_, (o1, l1)), g1), ((_, (o2, l2)), g2) = _run(pattern, impl, q, k, v, ct, **options), _run(
        pattern, "reference", q, k, v, ct
    )
    np.testing.assert_allclose(o1, o2, **TOL)
    np.testing.assert_array_equal(np.isneginf(l1), np.isneginf(l2))
    np.testing.assert_allclose(np.where(np.isinf(l2), 0, l1), np.where(np.isinf(l2), 0, l2), **TOL)
    for a, c in zip(g1, g2, strict=True):
        np.testing.assert_allclose(a, c, **TOL)


def test_choices_that_cannot_run_name_what_can():
    n = 16
    q = k = v = jnp.zeros((1, n, 1, 4))
    labels = jnp.zeros((1, 1, n, 1), jnp.int32)
    with_landmarks = LabelPattern.from_labels(labels, 4, base=BaseGraph(radius=2, landmark_every=4))
    with pytest.raises(ValueError, match="landmark.*'bucketed' or 'reference'"):
        sparse_attn.attention(q, k, v, with_landmarks, implementation="xla")
    bits_only = LabelPattern(B.pack_labels(labels, 4), None, BaseGraph(radius=2))
    with pytest.raises(ValueError, match="from_labels"):
        sparse_attn.attention(q, k, v, bits_only, implementation="bucketed")
    with pytest.raises(ValueError, match=r"one of \['bucketed', 'bucketed_pallas', 'pallas', 'reference', 'xla'\]"):
        sparse_attn.attention(q, k, v, bits_only, implementation="packed")
    assert sparse_attn.default_implementation("cpu", LabelPattern) == "bucketed"


def test_bucketed_hands_its_diagnostics_on_through_return_aux():
    """`return_aux=True`: "bucketed" returns its per-query allowed keys (== the pattern's, counted independently)
    and band overflow; an executor without diagnostics returns {}; the outputs are those of the plain call."""
    b, n, d = 2, 40, 6
    ks = jax.random.split(jax.random.PRNGKey(1), 4)
    q, k, v = (jax.random.normal(x, (b, n, 2, 8)) for x in ks[:3])
    labels = B.top_k_labels(jax.random.normal(ks[3], (b, 1, n, d)), 2)
    pattern = LabelPattern.from_labels(labels, d, base=BaseGraph(radius=5, landmark_every=9), valid_len=jnp.asarray([n, 29]))
    run = jax.jit(lambda q, k, v, p, impl, **kw: sparse_attn.attention(q, k, v, p, implementation=impl, **kw),
                  static_argnames=("impl", "return_lse", "return_aux"))
    out, lse, aux = run(q, k, v, pattern, None, return_lse=True, return_aux=True)
    np.testing.assert_array_equal(out, run(q, k, v, pattern, None))
    want = np.asarray(pattern.to_dense()).sum(-1)  # [B, 1, N]
    np.testing.assert_array_equal(np.asarray(aux["keys"]), want)
    assert int(aux["overflow"]) == 0 and lse.shape == (b, n, 2)
    ref, ref_aux = run(q, k, v, pattern, "reference", return_aux=True)
    assert ref_aux == {}
    np.testing.assert_allclose(out, ref, **TOL)

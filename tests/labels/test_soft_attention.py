"""Soft and straight-through phases against dense float64 oracles; τ -> 0; self-loops."""

import functools
import itertools

import jax
import jax.numpy as jnp
import label_oracles as oracles
import numpy as np
import pytest

from sparse_attn.executors.labels.soft import soft_label_attention
from sparse_attn.patterns.labels import bits as B
from sparse_attn.patterns.labels import soft, thinning
from sparse_attn.patterns.labels.base_graph import BaseGraph

N, D, L = 40, 8, 6


def _inputs(seed=0, n=N):
    ks = jax.random.split(jax.random.PRNGKey(seed), 4)
    q = jax.random.normal(ks[0], (1, n, 2, D))
    k = jax.random.normal(ks[1], (1, n, 1, D))
    v = jax.random.normal(ks[2], (1, n, 1, D))
    r = 2.0 * jax.random.normal(ks[3], (1, 1, n, L))
    return q, k, v, r


def _blend_bias(p, hard, alpha, eps):
    """log(q + ε), or log((1 - α) q + α A_hard + ε) for α > 0 (the ramp), in float64; 0 on the diagonal."""
    p64 = np.asarray(p, np.float64)
    q_soft = 1 - np.prod(1 - p64[:, None, :] * p64[None, :, :], axis=-1)
    bias = np.log(q_soft + eps) if alpha == 0 else np.log((1 - alpha) * q_soft + alpha * hard + eps)
    np.fill_diagonal(bias, 0.0)  # q_uu := 1
    return bias


def _soft_oracle(q, k, v, p, h, eps, alpha=0.0, hard=None):
    """Soft attention on the mask h (H, or H thinned); with α > 0 the score (1 - α) q + α A_hard (the ramp)."""
    bias = _blend_bias(p, hard, alpha, eps)
    return np.stack([oracles.attention(q[:, j], k[:, 0], v[:, 0], h, bias) for j in range(q.shape[1])], axis=1)


@functools.partial(jax.jit, static_argnames=("base", "mode", "eps", "block"))
def _run(q, k, v, p, bits, *, base, mode, eps=1e-6, block=16, valid_len=None, alpha=0.0, thin_seed=None):
    out, lse, info = soft_label_attention(
        q, k, v, p, bits, base=base, mode=mode, eps=eps, valid_len=valid_len, block=block, hard_weight=alpha,
        thin_seed=thin_seed,
    )
    return out, lse, info["keys"], info["edges"], info["dropped"]


@pytest.mark.parametrize("causal", [False, True])
def test_soft_and_ramp_phases_match_the_dense_oracle(causal):
    q, k, v, r = _inputs()
    base = BaseGraph(radius=6, landmark_every=9, causal=causal)
    p = soft.memberships(r, 0.7)
    bits = B.pack_labels(B.top_k_labels(r, 2), L)
    h = oracles.base_graph(N, 6, 9, causal)
    z = oracles.z_from_labels(np.asarray(B.top_k_labels(r, 2)[0, 0]), L)
    hard = oracles.hard_mask(z, h).astype(np.float64)
    for alpha in (0.0, 0.6):
        out, _, keys, edges, _ = _run(q, k, v, p, bits, base=base, mode="soft", alpha=alpha)
        args = (np.asarray(q[0]), np.asarray(k[0]), np.asarray(v[0]), np.asarray(p[0, 0]), h, 1e-6)
        want = _soft_oracle(*args, alpha=alpha, hard=hard)
        np.testing.assert_allclose(np.asarray(out[0]), want, atol=2e-5, rtol=2e-5)
    np.testing.assert_array_equal(np.asarray(keys[0, 0]), hard.sum(-1))
    np.testing.assert_array_equal(np.asarray(edges[0, 0]), h.sum(-1))
    # The ramp's thinning: a dropped edge takes part iff its draw for (seed, u, v) is >= α; the rest as above.
    alpha, step = 0.6, 7
    present = np.asarray(thinning.present(thinning.seeds(step, 1)[0], np.arange(N)[:, None], np.arange(N)[None], alpha))
    live = h & ((hard > 0) | present)
    assert h.sum() > live.sum() > hard.sum()  # some dropped edges in, some out
    out, _, _, edges, dropped = _run(q, k, v, p, bits, base=base, mode="soft", alpha=alpha, thin_seed=jnp.int32(step))
    np.testing.assert_array_equal(np.asarray(edges[0, 0]), live.sum(-1))  # the keys the thinned rows weigh
    args = (np.asarray(q[0]), np.asarray(k[0]), np.asarray(v[0]), np.asarray(p[0, 0]), live, 1e-6)
    np.testing.assert_allclose(np.asarray(out[0]), _soft_oracle(*args, alpha=alpha, hard=hard), atol=2e-5, rtol=2e-5)
    # `dropped`: the weight on live edges the hard pattern drops, mean over the label head's two attention heads.
    want = np.mean([oracles.weights(q[0, :, j], k[0, :, 0], live, _blend_bias(p[0, 0], hard, alpha, 1e-6))
                    for j in range(2)], axis=0)
    np.testing.assert_allclose(np.asarray(dropped[0, 0]), (want * (live & (hard == 0))).sum(-1), atol=2e-5)


def test_thinning_draws_each_dropped_edge_with_probability_one_minus_alpha_afresh_every_step():
    u, v = np.arange(300)[:, None], np.arange(300)[None]
    draws = [np.asarray(thinning.present(thinning.seeds(step, 2)[j], u, v, 0.3)) for step in (0, 1) for j in (0, 1)]
    for d in draws:  # 90 000 draws each: the standard error of the frequency is 0.0015
        assert abs(d.mean() - 0.7) < 0.01
    for a, b in itertools.pairwise(draws):  # other step or other row: independent, agreement 0.7² + 0.3² = 0.58
        assert abs(np.mean(a == b) - 0.58) < 0.01
    assert np.all(np.asarray(thinning.present(5, u, v, 0.0))) and not np.any(np.asarray(thinning.present(5, u, v, 1.0)))


@pytest.mark.parametrize("causal", [False, True])
def test_straight_through_forward_is_the_hard_pattern(causal):
    q, k, v, r = _inputs(1)
    base = BaseGraph(radius=6, landmark_every=9, causal=causal)
    labels = B.top_k_labels(r, 2)
    out = _run(q, k, v, soft.memberships(r, 0.3), B.pack_labels(labels, L), base=base, mode="straight_through")[0]
    mask = oracles.hard_mask(oracles.z_from_labels(np.asarray(labels[0, 0]), L), oracles.base_graph(N, 6, 9, causal))
    want = np.stack([oracles.attention(q[0, :, j], k[0, :, 0], v[0, :, 0], mask) for j in range(2)], axis=1)
    np.testing.assert_allclose(np.asarray(out[0]), want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("mode", ["soft", "straight_through"])
def test_router_gradients_are_nonzero_and_reach_dropped_edges(mode):
    q, k, v, r = _inputs(2)
    base = BaseGraph(radius=5, landmark_every=8)
    bits = B.pack_labels(B.top_k_labels(r, 2), L)
    ct = jax.random.normal(jax.random.PRNGKey(9), q.shape)

    def loss(r):
        return jnp.sum(_run(q, k, v, soft.memberships(r, 0.5), bits, base=base, mode=mode)[0] * ct)

    g = np.asarray(jax.jit(jax.grad(loss))(r))
    assert np.all(np.isfinite(g)) and np.mean(np.abs(g) > 0) > 0.5


def test_soft_attention_converges_to_the_label_mask_as_tau_goes_to_zero():
    q, k, v, r = _inputs(3)
    r = jnp.sign(r) * (0.05 + jnp.abs(r))  # |R| >= 0.05: the limit 1[R > 0] is reached at the smallest τ
    base = BaseGraph(radius=8, landmark_every=10)
    z = np.asarray(r[0, 0]) > 0  # σ(R/τ) -> 1[R > 0]
    mask = oracles.hard_mask(z, oracles.base_graph(N, 8, 10, False))
    want = np.stack([oracles.attention(q[0, :, j], k[0, :, 0], v[0, :, 0], mask) for j in range(2)], axis=1)
    bits = B.pack_memberships(jnp.asarray(z))[None, None]
    errs = []
    for tau in (1.0, 0.01, 0.001):
        out = _run(q, k, v, soft.memberships(r, tau), bits, base=base, mode="soft", eps=1e-9)[0]
        errs.append(float(np.max(np.abs(np.asarray(out[0]) - want))))
    assert errs[0] > errs[1] > errs[2] and errs[2] < 1e-5 and errs[0] > 1e-2


def test_rows_sum_to_one_with_self_loops_even_when_disconnected():
    n = 24
    q, k, v, _ = _inputs(4, n)
    ones = jnp.ones((1, n, 1, D))
    base = BaseGraph(radius=0)  # H = self only: every token is disconnected
    p = jnp.full((1, 1, n, L), 1e-3)
    bits = B.pack_labels(jnp.zeros((1, 1, n, 1), jnp.int32), L)
    for mode in ("soft", "straight_through"):
        out, _, keys, _, _ = _run(q, k, ones, p, bits, base=base, mode=mode, valid_len=jnp.asarray([20]))
        assert np.all(np.isfinite(np.asarray(out))) and np.all(np.asarray(keys)[0, 0, :20] == 1)
        np.testing.assert_allclose(np.asarray(out)[0, :20], 1.0, atol=1e-6)  # softmax rows sum to 1
        np.testing.assert_array_equal(np.asarray(out)[0, 20:], 0.0)
        out = _run(q, k, v, p, bits, base=base, mode=mode, valid_len=jnp.asarray([20]))[0]
        np.testing.assert_allclose(np.asarray(out[0, :20, 0]), np.asarray(v[0, :20, 0]), atol=1e-6)
    with pytest.raises(ValueError, match="mode"):
        soft_label_attention(q, k, v, p, bits, base=base, mode="hard")
    with pytest.raises(ValueError, match="memberships"):
        soft_label_attention(q, k, v, p[:, :, :5], bits, base=base)

"""The soft score and the schedules (docs/labels.md): the soft score q_uv, its stable log, σ at small τ."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparse_attn.patterns.labels import schedule, soft


def test_q_is_the_monte_carlo_probability_of_a_shared_label():
    rng = np.random.default_rng(0)
    d = 6
    p_u, p_v = rng.uniform(0.05, 0.6, d), rng.uniform(0.05, 0.6, d)
    draws = 200_000
    z_u, z_v = rng.random((draws, d)) < p_u, rng.random((draws, d)) < p_v
    mc = np.mean(np.any(z_u & z_v, axis=1))
    q = float(soft.q_direct(jnp.asarray(p_u), jnp.asarray(p_v)))
    assert abs(q - mc) < 4 * np.sqrt(mc * (1 - mc) / draws)
    assert abs(float(jnp.exp(soft.log_q(jnp.asarray(p_u), jnp.asarray(p_v), 0.0))) - q) < 1e-6
    # Self: P(S_u non-empty) = 1 - Π(1 - p), not the pair formula with p².
    mc_self = np.mean(np.any(z_u, axis=1))
    q_self = float(soft.q_self(jnp.asarray(p_u)))
    assert abs(q_self - mc_self) < 4 * np.sqrt(mc_self * (1 - mc_self) / draws)
    assert abs(q_self - float(soft.q_direct(jnp.asarray(p_u), jnp.asarray(p_u)))) > 0.05


def test_stable_log_q_matches_float64_and_stays_finite_in_float32():
    rng = np.random.default_rng(1)
    for scale in (1e-4, 1e-2, 0.5, 1.0):
        p_u = rng.uniform(0, 1, (50, 32)) * scale
        p_v = rng.uniform(0, 1, (50, 32)) * scale
        exact = np.log(-np.expm1(np.sum(np.log1p(-np.minimum(p_u * p_v, 1 - 1e-7)), -1)) + 1e-12)
        got = np.asarray(soft.log_q(jnp.asarray(p_u, jnp.float32), jnp.asarray(p_v, jnp.float32), 1e-12))
        assert np.all(np.isfinite(got))
        np.testing.assert_allclose(got, exact, rtol=2e-3, atol=2e-3)
    tiny = jnp.full((32,), 1e-4, jnp.float32)
    assert not np.isfinite(float(jnp.log(soft.q_direct(tiny, tiny))))  # the direct form underflows to log 0
    val = float(soft.log_q(tiny, tiny, 0.0))
    assert np.isfinite(val) and abs(val - np.log(32e-8)) < 1e-3  # log(32e-8) = -14.95 (32 pairs of 1e-8)
    ones = jnp.ones((8,), jnp.float32)
    assert np.isfinite(float(soft.log_q(ones, ones)))  # products that round to 1 are clipped
    g = jax.grad(lambda p: soft.log_q(p, ones * 0.5))(ones)
    assert np.all(np.isfinite(np.asarray(g)))


def test_sigmoid_has_no_overflow_at_small_temperature():
    r = jnp.asarray([-50.0, -1.0, 0.0, 1.0, 50.0])
    p = soft.memberships(r, 1e-4)
    np.testing.assert_array_equal(np.asarray(p), [0.0, 0.0, 0.5, 1.0, 1.0])
    g = jax.grad(lambda x: jnp.sum(soft.memberships(x, 1e-4)))(r)
    assert np.all(np.isfinite(np.asarray(g)))
    np.testing.assert_allclose(np.asarray(soft.sigmoid(r / 7)), np.asarray(jax.nn.sigmoid(r / 7)), atol=1e-6)


def test_temperature_and_phase_are_pure_functions_of_the_step():
    taus = [float(schedule.temperature(s, anneal_steps=100)) for s in (0, 50, 100, 1000)]
    assert taus[0] == pytest.approx(1.0) and taus[2] == pytest.approx(0.1) and taus[3] == pytest.approx(0.1)
    assert taus[0] > taus[1] > taus[2]
    jitted = jax.jit(lambda s: schedule.temperature(s, anneal_steps=100))
    assert float(jitted(jnp.int32(50))) == pytest.approx(taus[1])
    phases = [int(schedule.phase(s, soft_steps=3, straight_through_steps=2)) for s in range(7)]
    assert phases == [0, 0, 0, 2, 2, 3, 3]
    phases = [int(schedule.phase(s, soft_steps=1, ramp_steps=2, straight_through_steps=1)) for s in range(6)]
    assert phases == [0, 1, 1, 2, 3, 3]
    vector = schedule.phase(jnp.arange(6), soft_steps=1, ramp_steps=2, straight_through_steps=1)  # elementwise
    assert vector.shape == (6,) and vector.tolist() == phases
    alphas = [float(schedule.hard_weight(s, soft_steps=2, ramp_steps=3)) for s in range(7)]
    assert alphas == [0.0, 0.0, 0.25, 0.5, 0.75, 1.0, 1.0]
    assert int(schedule.phase(schedule.INFERENCE_STEP, soft_steps=10**6, straight_through_steps=10**6)) == 3
    with pytest.raises(ValueError):
        schedule.temperature(0, tau_end=0.0)


def test_centred_memberships_tend_to_the_top_k_labels():
    """σ((R - θ)/τ) -> the top-k indicator as τ -> 0 (σ(R/τ) -> {R > 0}, any number); gradients finite."""
    r = jax.random.normal(jax.random.PRNGKey(1), (3, 1, 20, 8)) + 0.7  # most logits positive
    top = np.asarray(jax.nn.one_hot(jax.lax.top_k(r, 2)[1], 8).sum(-2))
    np.testing.assert_allclose(np.asarray(soft.centred_memberships(r, 1e-4, 2)), top, atol=1e-3)
    assert float(jnp.mean(jnp.sum(soft.memberships(r, 1e-4), -1))) > 4  # the plain sigmoid keeps every R > 0
    assert float(jnp.mean(jnp.sum(soft.centred_memberships(r, 1.0, 2), -1))) > 2.5  # spread at τ = 1
    np.testing.assert_array_equal(np.asarray(soft.centred_memberships(r, 0.1, 8)) > 0.99, True)  # k = d: all
    g = jax.grad(lambda x: jnp.sum(soft.centred_memberships(x, 0.1, 2) ** 2))(r)
    assert np.all(np.isfinite(np.asarray(g))) and float(jnp.sum(jnp.abs(g))) > 0


def test_pairwise_log_q_matches_the_broadcast_form_with_its_own_backward():
    """`log_q_pairs` (custom VJP, einsum backward) against autodiff of the broadcast `log_q`, clip included."""
    rng = np.random.default_rng(3)
    p_u = rng.uniform(0, 1, (3, 5, 8)).astype(np.float32)
    p_v = rng.uniform(0, 1, (3, 7, 8)).astype(np.float32)
    p_u[0, 0], p_v[0, 0] = 1.0, 1.0  # products that hit the clip: no gradient through them
    p_u, p_v = jnp.asarray(p_u), jnp.asarray(p_v)
    g = jnp.asarray(rng.normal(size=(3, 5, 7)), jnp.float32)

    def broadcast(a, b):
        return soft.log_q(a[:, :, None, :], b[:, None, :, :])

    np.testing.assert_allclose(np.asarray(soft.log_q_pairs(p_u, p_v)), np.asarray(broadcast(p_u, p_v)), rtol=1e-6)
    want = jax.grad(lambda a, b: jnp.sum(g * broadcast(a, b)), argnums=(0, 1))(p_u, p_v)
    got = jax.grad(lambda a, b: jnp.sum(g * soft.log_q_pairs(a, b)), argnums=(0, 1))(p_u, p_v)
    for w, o in zip(want, got, strict=True):
        assert np.all(np.isfinite(np.asarray(o)))
        np.testing.assert_allclose(np.asarray(o), np.asarray(w), rtol=1e-5, atol=1e-5)

"""Label attention with position labels (`position_cell`): the pattern every phase and executor runs keeps every near
pair, and equals an oracle built from the definition (router top-k sharing, or the same position cell)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparse_attn.modules.labels import LabelAttentionConfig, LabelCapacity
from sparse_attn.modules.labels.core import label_core
from sparse_attn.patterns.labels.base_graph import BaseGraph

N, L, RADIUS, CELL, EVERY = 48, 6, 7, 4, 16


def _cfg(**kw):
    return LabelAttentionConfig(num_labels=L, top_k=2, radius=RADIUS, landmark_every=EVERY, position_cell=CELL,
                                capacity=LabelCapacity(block=16, soft_block=16), rope_base=None, **kw)


@jax.jit(static_argnames=("cfg", "base"))
def _core(q, k, v, r, valid, *, cfg, base):
    return label_core(q, k, v, r, cfg, base, step=jnp.int32(0), valid_len=valid)


def _oracle(r_NxL, valid, causal):
    """bool[N, N] from the definition: (window or landmark edge) and (shared router top-2 label or shared position
    cell number, M = ceil(radius / cell) + 1 cells per grid), or self; both valid."""
    top = np.argsort(-r_NxL, axis=-1, kind="stable")[:, :2]
    member = np.zeros((N, L), bool)
    np.put_along_axis(member, top, True, axis=-1)
    m = -(-RADIUS // CELL) + 1
    pos = np.arange(N)
    g1, g2 = (pos // CELL) % m, ((pos + CELL // 2) // CELL) % m
    share = (member[:, None] & member[None]).any(-1) | (g1[:, None] == g1[None]) | (g2[:, None] == g2[None])
    d = pos[:, None] - pos[None]
    window = (d >= 0) & (d <= RADIUS) if causal else np.abs(d) <= RADIUS
    landmark = (pos[None] % EVERY == 0) & ~window & ((d >= 0) if causal else True)
    ok = ((window | landmark) & share) | (d == 0)
    return ok & (pos[:, None] < valid) & (pos[None] < valid), np.abs(d) < CELL // 2


@pytest.mark.parametrize("causal", [False, True])
def test_every_phase_and_executor_runs_the_pattern_with_near_pairs(causal):
    """v = identity over keys, so row i of the output is query i's attention weights: the allowed keys are its
    non-zero entries (the soft phase's pattern is all of H; straight-through and hard run the hard pattern)."""
    valid = 41
    r = jax.random.normal(jax.random.PRNGKey(3), (1, 1, N, L))
    q = jax.random.normal(jax.random.PRNGKey(4), (1, N, 1, N))
    k = jax.random.normal(jax.random.PRNGKey(5), (1, N, 1, N))
    v = jnp.eye(N, dtype=jnp.float32)[None, :, None, :]
    base = BaseGraph(radius=RADIUS, landmark_every=EVERY, causal=causal)
    expect, near = _oracle(np.asarray(r[0, 0]), valid, causal)
    seen = {}
    for phase, impl in (("hard", None), ("hard", "reference"), ("straight_through", None)):
        o, aux = _core(q, k, v, r, jnp.asarray([valid]), cfg=_cfg(phase=phase, implementation=impl), base=base)
        w = np.asarray(o[0, :, 0, :])
        allowed = w > 0
        np.testing.assert_array_equal(allowed[:valid], expect[:valid], err_msg=f"{phase} {impl}")
        assert (w[valid:] == 0).all()
        np.testing.assert_array_equal(np.asarray(aux["hard_keys"][0, 0, :valid]), expect[:valid].sum(-1))
        assert aux["labels"].shape[-1] == 2 and aux["p"].shape[-1] == L  # the router's own, for its losses
        seen[(phase, impl)] = w
    both = expect[:valid] & near[:valid]
    assert both.sum() == (near & (np.arange(N)[:, None] < valid) & (np.arange(N)[None] < valid)
                          & ((np.arange(N)[:, None] >= np.arange(N)[None]) if causal else True)).sum()
    np.testing.assert_allclose(seen[("hard", None)], seen[("hard", "reference")], atol=2e-6)
    np.testing.assert_allclose(seen[("straight_through", None)], seen[("hard", None)], atol=2e-6)


def test_gradients_match_the_reference_and_masked_keys_get_none():
    valid = 45
    keys = jax.random.split(jax.random.PRNGKey(7), 4)
    r = jax.random.normal(keys[0], (1, 1, N, L))
    q, k, v = (jax.random.normal(kk, (1, N, 2, 8)) for kk in keys[1:])
    base = BaseGraph(radius=RADIUS, landmark_every=EVERY, causal=True)
    ct = jax.random.normal(jax.random.PRNGKey(8), (1, N, 2, 8))

    def grads(impl):
        cfg = _cfg(phase="hard", implementation=impl)
        f = lambda q, k, v: jnp.sum(label_core(q, k, v, r, cfg, base, step=jnp.int32(0),  # noqa: E731
                                               valid_len=jnp.asarray([valid]))[0] * ct)
        return jax.jit(jax.grad(f, argnums=(0, 1, 2)))(q, k, v)

    fast, ref = grads(None), grads("reference")
    for a, b in zip(fast, ref, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(b), atol=2e-5, rtol=2e-5)
    # Padding keys are allowed to no query: exactly zero gradient there.
    assert (np.asarray(fast[1])[0, valid:] == 0).all() and (np.asarray(fast[2])[0, valid:] == 0).all()


def test_config_refuses_more_labels_than_the_bitmasks_hold():
    with pytest.raises(ValueError, match="exceeds 64"):
        LabelAttentionConfig(num_labels=32, radius=64, position_cell=4)
    assert LabelAttentionConfig(num_labels=32, radius=64, position_cell=8).total_labels == 32 + 2 * 9

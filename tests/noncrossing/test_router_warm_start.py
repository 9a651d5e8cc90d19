"""The router warm start: teacher targets of the layered construction, and a fit that makes the router build the
bracket matching."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from sparse_attn.data.tasks.dyck import sample_shape
from sparse_attn.modules.noncrossing import NoncrossingAttentionConfig
from sparse_attn.modules.noncrossing.warm_start import bracket_matching, bracket_targets, warm_start_loss
from sparse_attn.patterns.noncrossing import diagram_np as dn

D, H, T, N = 16, 2, 3, 12


def test_targets_of_a_small_word():
    opens = np.array([1, 1, 0, 0, 1, 0, 0, 0], bool)  # (())() then 2 padding
    t = jax.tree.map(np.asarray, bracket_targets(opens[None], np.array([6]), 3))
    assert bracket_matching(opens[:6]) == [(0, 3), (1, 2), (4, 5)]
    # Layer 0: every adjacent pair inside the prefix; (1, 2) and (4, 5) are the height-1 brackets.
    assert np.flatnonzero(t["m"][0, 0]).tolist() == [0, 1, 2, 3, 4]
    assert t["nxt"][0, 0, :5].tolist() == [1, 2, 3, 4, 5]
    assert np.flatnonzero(t["y"][0, 0]).tolist() == [1, 4]
    # Layer 1: strands 0, 3, 6, 7 remain; only (0, 3) lies in the prefix, and it closes.
    assert np.flatnonzero(t["m"][0, 1]).tolist() == [0] and t["nxt"][0, 1, 0] == 3 and t["y"][0, 1, 0] == 1
    assert not t["m"][0, 2].any()  # nothing left to pair
    with pytest.raises(ValueError, match="not balanced"):
        bracket_matching(np.array([0, 1], bool))


def _words(rng, b):
    opens = np.zeros((b, N), bool)
    vl = 2 * rng.integers(3, N // 2 + 1, size=b)
    for i, v in enumerate(vl):
        opens[i, :v] = sample_shape(rng, int(v), T)
    return opens, vl


def test_fit_builds_the_bracket_matching():
    attn = NoncrossingAttentionConfig(num_route_layers=T, router_dim=8).make(D, H, rngs=nnx.Rngs(0))
    e_2xD = jax.random.normal(jax.random.PRNGKey(1), (2, D))  # close / open token features
    rng = np.random.default_rng(0)

    def feats(opens, vl):
        x = e_2xD[jnp.asarray(opens, jnp.int32)]
        return jnp.where(jnp.arange(N)[None, :, None] < jnp.asarray(vl)[:, None, None], x, 0.0)

    opt = nnx.Optimizer(attn, optax.adam(3e-2), wrt=nnx.Param)

    @nnx.jit
    def step(attn, opt, x, targets):
        loss, g = nnx.value_and_grad(warm_start_loss)(attn, x, targets)
        opt.update(attn, g)
        return loss

    for _ in range(60):
        opens, vl = _words(rng, 16)
        loss = step(attn, opt, feats(opens, vl), bracket_targets(opens, vl, T))
    assert float(loss) < 0.1  # the BCE plateaus near 0.2 for ~20 steps, then falls
    opens, vl = _words(rng, 16)
    p_BxHx2N = np.asarray(jax.jit(attn.route)(feats(opens, vl), jnp.asarray(vl))["p"])
    for p_Hx2N, o, v in zip(p_BxHx2N, opens, vl, strict=True):
        for p in p_Hx2N:
            assert [c for c in dn.caps(p) if c[1] < v] == bracket_matching(o[:v])


@pytest.mark.parametrize("kw", [dict(router="brick_wall"), dict(doubled=True)])
def test_refuses_other_routers(kw):
    attn = NoncrossingAttentionConfig(num_route_layers=T, **kw).make(D, H, rngs=nnx.Rngs(0))
    opens = np.array([[1, 0] * (N // 2)], bool)
    with pytest.raises(ValueError, match="defect-pair"):
        warm_start_loss(attn, jnp.zeros((1, N, D)), bracket_targets(opens, np.array([N]), T))


def test_refuses_targets_of_another_depth():
    attn = NoncrossingAttentionConfig(num_route_layers=T).make(D, H, rngs=nnx.Rngs(0))
    opens = np.array([[1, 0] * (N // 2)], bool)
    with pytest.raises(ValueError, match="routing layers"):
        warm_start_loss(attn, jnp.zeros((1, N, D)), bracket_targets(opens, np.array([N]), T + 1))

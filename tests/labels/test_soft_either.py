"""mode="either" (the scheduled core's one soft-like branch): the soft or straight-through pass picked by a traced
flag gives that mode's outputs, statistics and gradients (memberships included), ramp thinning and padding on."""

import functools

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparse_attn.executors.labels.soft import soft_label_attention
from sparse_attn.patterns.labels import bits as B
from sparse_attn.patterns.labels import soft
from sparse_attn.patterns.labels.base_graph import BaseGraph

N, D, L = 40, 8, 6
TOL = dict(rtol=1e-6, atol=1e-6)  # the same float32 operations either way; only the branch selection differs


@functools.partial(jax.jit, static_argnames=("base", "mode"))
def _value_and_grads(q, k, v, p, bits, ct, straight, *, base, mode):
    def loss(q, k, v, p):
        out, lse, info = soft_label_attention(
            q, k, v, p, bits, base=base, mode=mode, valid_len=jnp.asarray([N - 3]), block=16, hard_weight=0.4,
            thin_seed=jnp.int32(7), straight_through=straight if mode == "either" else None,
        )  # fmt: skip
        finite_lse = jnp.sum(jnp.where(jnp.isfinite(lse), lse, 0.0))
        return jnp.sum(out * ct) + finite_lse, (out, lse, info)

    return jax.value_and_grad(loss, argnums=(0, 1, 2, 3), has_aux=True)(q, k, v, p)


@pytest.mark.parametrize("causal", [False, True])
def test_either_mode_equals_the_mode_its_flag_picks(causal):
    ks = jax.random.split(jax.random.PRNGKey(0), 5)
    q = jax.random.normal(ks[0], (1, N, 2, D))
    k, v = (jax.random.normal(x, (1, N, 1, D)) for x in ks[1:3])
    r = 2.0 * jax.random.normal(ks[3], (1, 1, N, L))
    ct = jax.random.normal(ks[4], (1, N, 2, D))
    p = soft.memberships(r, 0.7)
    bits = B.pack_labels(B.top_k_labels(r, 2), L)
    base = BaseGraph(radius=6, landmark_every=9, causal=causal)
    results = {}
    for mode, straight in (("soft", False), ("straight_through", True)):
        (_, want), want_g = _value_and_grads(q, k, v, p, bits, ct, jnp.bool_(straight), base=base, mode=mode)
        (_, got), got_g = _value_and_grads(q, k, v, p, bits, ct, jnp.bool_(straight), base=base, mode="either")
        for a, b in zip(jax.tree.leaves((got, got_g)), jax.tree.leaves((want, want_g)), strict=True):
            np.testing.assert_allclose(np.asarray(a), np.asarray(b), **TOL)
        results[mode] = (want, want_g)
    # The two modes differ (so the comparison above can tell which branch ran): outputs and membership gradients.
    assert not np.allclose(results["soft"][0][0], results["straight_through"][0][0], atol=1e-3)
    assert not np.allclose(results["soft"][1][3], results["straight_through"][1][3], atol=1e-3)


def test_either_mode_needs_its_flag():
    q = jnp.ones((1, 8, 1, 4))
    p = jnp.full((1, 1, 8, 4), 0.5)
    bits = B.pack_labels(jnp.zeros((1, 1, 8, 1), jnp.int32), 4)
    with pytest.raises(ValueError, match="straight_through"):
        soft_label_attention(q, q, q, p, bits, base=BaseGraph(radius=2), mode="either")
    with pytest.raises(ValueError, match="straight_through"):
        soft_label_attention(q, q, q, p, bits, base=BaseGraph(radius=2), mode="soft", straight_through=True)

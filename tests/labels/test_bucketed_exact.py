"""The hard phase is exact for any router: collapsed and skewed labels overflow the planned reach, and the wider
band tiers give the dense reference's outputs, lse and gradients (before exact tiers: max error ~0.66)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from label_oracles import outputs_and_grads

from sparse_attn.executors.labels.bucketed import bucketed_attention, default_reach, fallback_reaches
from sparse_attn.executors.reference import reference_attention
from sparse_attn.modules.base import AttentionContext
from sparse_attn.modules.labels import LabelAttentionConfig, LabelCapacity, LabelRouterConfig
from sparse_attn.patterns.labels import bits as B
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.pattern import LabelPattern

TOL = dict(atol=2e-5, rtol=2e-5)  # float32 executor vs float32 dense reference (as test_bucketed_executor.py)


def _labels(router, b, p, n, d, k, seed):
    if router == "collapsed":  # every token holds the same labels 0..k-1: k buckets of n tokens, the rest empty
        return jnp.broadcast_to(jnp.arange(k, dtype=jnp.int32), (b, p, n, k))
    # skewed: label j gets logit offset 3 - j, so label 0 sits in ~all tokens and the tail buckets are small
    offset = (3.0 - jnp.arange(d, dtype=jnp.float32)).reshape(1, 1, 1, d)
    return B.top_k_labels(jax.random.normal(jax.random.PRNGKey(seed), (b, p, n, d)) + offset, k)


@pytest.mark.parametrize(
    "router,label_heads,causal,d,k,reach",
    [
        ("collapsed", 1, False, 8, 1, None),  # one bucket of n tokens: the widest tier
        ("collapsed", 4, True, 8, 2, 2),  # per-head labels; bucket 1 holds pairs the dedup gives to bucket 0
        ("skewed", 1, True, 40, 2, None),  # two bitmask words
        ("skewed", 4, False, 6, 3, 2),
    ],
)
def test_overflowing_routers_match_the_reference(router, label_heads, causal, d, k, reach):
    b, n, h, g, dh, block = 2, 64, 4, 2, 8, 8
    ks = jax.random.split(jax.random.PRNGKey(1), 4)
    q = jax.random.normal(ks[0], (b, n, h, dh))
    kk, v = (jax.random.normal(x, (b, n, g, dh)) for x in ks[1:3])
    ct = jax.random.normal(ks[3], (b, n, h, dh))
    labels = _labels(router, b, label_heads, n, d, k, seed=2)
    vl = jnp.asarray([n, 45])
    base = BaseGraph(radius=20, landmark_every=13, causal=causal)
    pattern = LabelPattern(B.pack_labels(labels, d), vl, base)

    def ours(q, kk, v):
        return bucketed_attention(
            q, kk, v, labels, num_labels=d, base=base, valid_len=vl, block=block, reach=reach, group_entries=16
        )

    def ref(q, kk, v):
        return reference_attention(q, kk, v, pattern, 1 / np.sqrt(dh))

    ((out, lse, info), g_ours), ((r_out, r_lse), g_ref) = outputs_and_grads(ours, ref, q, kk, v, ct)
    planned = default_reach(n, base, d, k) if reach is None else reach
    assert int(info["overflow"]) > 0 and int(info["reach"]) > planned  # the planned band did not hold it
    np.testing.assert_allclose(np.asarray(out), np.asarray(r_out), **TOL)
    np.testing.assert_array_equal(np.isneginf(lse), np.isneginf(r_lse))
    finite = jnp.isfinite(r_lse)
    np.testing.assert_allclose(np.asarray(jnp.where(finite, lse, 0)), np.asarray(jnp.where(finite, r_lse, 0)), **TOL)
    np.testing.assert_array_equal(
        np.asarray(info["keys"]), np.broadcast_to(np.asarray(pattern.to_dense()).sum(-1), info["keys"].shape)
    )
    for a, r in zip(g_ours, g_ref, strict=True):
        np.testing.assert_allclose(np.asarray(a), np.asarray(r), **TOL)


def test_tiers_reach_the_window_and_the_narrowest_sufficient_one_runs():
    assert fallback_reaches(4, 10, 64) == (4, 10)
    assert fallback_reaches(2, 40, 64) == (2, 8, 32, 40)
    assert fallback_reaches(16, 10, 64) == (16,)  # the planned band already holds any range: no fallback
    assert fallback_reaches(8, 100, 30) == (8, 30)
    b, n, h, dh = 1, 64, 2, 8
    q, kk, v = (jax.random.normal(jax.random.PRNGKey(s), (b, n, h, dh)) for s in range(3))
    base = BaseGraph(radius=10)
    run = jax.jit(bucketed_attention, static_argnames=("num_labels", "base", "block", "reach"))
    collapsed = jnp.zeros((1, 1, n, 1), jnp.int32)  # entry u needs [u-10, u+10]
    _, _, info = run(q, kk, v, collapsed, num_labels=4, base=base, block=8, reach=4)
    # A block [s, s+8) reads [s-4, s+12): entry u's range [max(u-10, 0), min(u+10, 63)] must lie inside it.

    def fits(u, s):
        return max(u - 10, 0) >= s - 4 and min(u + 10, n - 1) <= s + 11

    want = sum(1 for u in range(n) if not fits(u, (u // 8) * 8))
    assert int(info["overflow"]) == want > 0 and int(info["reach"]) == 10
    _, _, info = run(q, kk, v, collapsed, num_labels=4, base=base, block=8, reach=16)
    assert int(info["overflow"]) == 0 and int(info["reach"]) == 16
    spread = (jnp.arange(n) % 4).reshape(1, 1, n, 1)  # 4 balanced buckets: ranges of <= 3 entries per side
    _, _, info = run(q, kk, v, spread, num_labels=4, base=base, block=8, reach=4)
    assert int(info["overflow"]) == 0 and int(info["reach"]) == 4


@pytest.mark.parametrize("causal", [False, True])
def test_module_hard_phase_with_a_collapsed_router_equals_the_reference_path(causal):
    n, dm, heads = 64, 16, 2
    cfg = LabelAttentionConfig(
        num_labels=16, top_k=2, radius=40, landmark_every=10, phase="hard", rope_base=None,
        router=LabelRouterConfig(hidden=8), capacity=LabelCapacity(block=8),
    )
    module = cfg.make(dm, heads, rngs=nnx.Rngs(0))
    # Collapse the router: label 0 always wins and label 1 wins the tie among the rest, for every token.
    module.router.out.kernel[...] = jnp.zeros_like(module.router.out.kernel[...])
    module.router.out.bias[...] = jnp.zeros_like(module.router.out.bias[...]).at[0].set(10.0)
    x = jax.random.normal(jax.random.PRNGKey(3), (1, n, dm))
    ct = jax.random.normal(jax.random.PRNGKey(4), (1, n, dm))
    vl = jnp.asarray([n])
    base = BaseGraph(radius=cfg.radius, landmark_every=cfg.landmark_every, causal=causal)

    def reference_path(module, x):
        q, k, v = module.proj.qkv(x)
        labels = B.top_k_labels(module.router(x), cfg.top_k)
        pattern = LabelPattern(B.pack_labels(labels, cfg.num_labels), vl, base)
        return module.proj.out(reference_attention(q, k, v, pattern, 1 / np.sqrt(q.shape[-1]))[0]), labels

    @nnx.jit
    def run(module, x):
        def loss(x):
            out = module(x, AttentionContext(valid_len=vl, step=jnp.int32(0), causal=causal))
            return jnp.sum(out.y * ct), out

        def ref_loss(x):
            y, labels = reference_path(module, x)
            return jnp.sum(y * ct), (y, labels)

        (_, out), dx = jax.value_and_grad(loss, has_aux=True)(x)
        (_, (y_ref, labels)), dx_ref = jax.value_and_grad(ref_loss, has_aux=True)(x)
        return out, dx, y_ref, dx_ref, labels

    out, dx, y_ref, dx_ref, labels = run(module, x)
    assert np.all(np.asarray(labels) == np.arange(2))  # collapsed: every token holds labels {0, 1}
    assert float(out.stats["capacity_overflow"]) > 0  # planned reach 24 < the 40 entries a side it needs
    np.testing.assert_allclose(np.asarray(out.y), np.asarray(y_ref), **TOL)
    np.testing.assert_allclose(np.asarray(dx), np.asarray(dx_ref), **TOL)

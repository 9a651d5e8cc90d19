"""Non-finite values: NaN/inf at padding are invisible; at a valid position they reach only its readers.

The guarantee (docs/labels.md): padding of q, k, v (and of the layer input) changes nothing, forward or backward; a
non-finite q, k or v at a valid position makes exactly the rows that read it NaN, and the gradients w.r.t. q, k, v of
a loss that skips those rows equal a clean run's, with exactly 0 at the planted position. Also: the CV² balance loss
of an empty sequence is 0.
"""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_attn.executors.labels.bucketed import bucketed_attention
from sparse_attn.modules.base import AttentionContext
from sparse_attn.modules.labels import LabelAttentionConfig, LabelRouterConfig, LabelSchedule
from sparse_attn.executors.labels.soft import soft_label_attention
from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels import losses, soft
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.pattern import LabelPattern

B, N, H, G, D, L, K = 2, 40, 2, 1, 8, 6, 2
VL = (N, 27)
BAD = (jnp.nan, jnp.inf, -jnp.inf)
BASE = BaseGraph(radius=6, landmark_every=11)


def _inputs(seed=0):
    ks = jax.random.split(jax.random.PRNGKey(seed), 5)
    qkv = [jax.random.normal(ks[0], (B, N, H, D)), *(jax.random.normal(kk, (B, N, G, D)) for kk in ks[1:3])]
    logits = jax.random.normal(ks[3], (B, 1, N, L))
    return qkv, logits, jax.random.normal(ks[4], (B, N, H, D))


def _padding():
    return np.arange(N)[None, :] >= np.asarray(VL)[:, None]  # [B, N]


def _check(fn, qkv, allowed_BxNxN, ct):
    """fn(q, k, v) -> (out, lse): padding invisible; a valid NaN/inf reaches only the rows that read it."""

    @jax.jit
    def run(q, k, v, rows_BxN):
        def loss(q, k, v):
            out, lse = fn(q, k, v)
            return jnp.sum(jnp.where(rows_BxN[..., None, None], out * ct, 0.0)), (out, lse)

        return jax.grad(loss, (0, 1, 2), has_aux=True)(q, k, v)

    everyone = jnp.ones((B, N), bool)
    g_clean, (o_clean, lse_clean) = run(*qkv, everyone)
    pad = _padding()
    for value in BAD:
        planted = [jnp.where(jnp.asarray(pad)[..., None, None], value, x) for x in qkv]
        g, (o, lse) = run(*planted, everyone)
        np.testing.assert_array_equal(o, o_clean)
        np.testing.assert_array_equal(lse, lse_clean)
        for a, c in zip(g, g_clean, strict=True):
            np.testing.assert_array_equal(a, c)
            assert np.all(np.asarray(a)[pad] == 0)
    b, j = 0, 17
    for which in range(3):
        readers = np.zeros((B, N), bool)
        readers[b] = allowed_BxNxN[b, :, j] if which else np.arange(N) == j
        assert readers.sum() > 1 or which == 0
        rows = jnp.asarray(~readers)
        g_ref, (o_ref, _) = run(*qkv, rows)
        for value in BAD:
            planted = list(qkv)
            planted[which] = planted[which].at[b, j].set(value)
            g, (o, _) = run(*planted, rows)
            o = np.asarray(o)
            np.testing.assert_array_equal(o[~readers], np.asarray(o_ref)[~readers])
            assert np.all(np.isnan(o[readers]))
            for a, c in zip(g, g_ref, strict=True):
                assert np.all(np.isfinite(a))
                np.testing.assert_array_equal(a, c)
            assert np.all(np.asarray(g[which])[b, j] == 0)


def test_bucketed_executor_isolates_nonfinite_values():
    qkv, logits, ct = _inputs()
    labels = bits_lib.top_k_labels(logits, K)
    vl = jnp.asarray(VL)
    allowed = np.asarray(LabelPattern(bits_lib.pack_labels(labels, L), vl, BASE).to_dense())[:, 0]

    def fn(q, k, v):
        return bucketed_attention(q, k, v, labels, num_labels=L, base=BASE, valid_len=vl, block=8)[:2]

    _check(fn, qkv, allowed, ct)


@pytest.mark.parametrize("mode", ["soft", "straight_through"])
def test_soft_attention_isolates_nonfinite_values(mode):
    qkv, logits, ct = _inputs(1)
    labels = bits_lib.top_k_labels(logits, K)
    bits = bits_lib.pack_labels(labels, L)
    vl = jnp.asarray(VL)
    pad = jnp.asarray(_padding())[:, None, :, None]
    p = jnp.where(pad, jnp.nan, soft.memberships(logits, 0.5))  # memberships at padding: anything
    # What a row reads: every edge of H (soft), the kept edges (straight-through: the forward is the hard pattern).
    read_bits = jnp.full_like(bits, 0xFFFFFFFF) if mode == "soft" else bits
    allowed = np.asarray(LabelPattern(read_bits, vl, BASE).to_dense())[:, 0]

    def fn(q, k, v):
        return soft_label_attention(q, k, v, p, bits, base=BASE, mode=mode, valid_len=vl, block=16)[:2]

    _check(fn, qkv, allowed, ct)


def test_module_ignores_nonfinite_hidden_states_at_padding_in_every_phase():
    cfg = LabelAttentionConfig(
        num_labels=L, top_k=K, radius=5, landmark_every=9,
        schedule=LabelSchedule(num_steps=4, soft=0.25, ramp=0.25, straight_through=0.25),
        router=LabelRouterConfig(z_loss_weight=0.1),
    )  # fmt: skip
    module = cfg.make(16, 2, rngs=nnx.Rngs(0))
    x = jax.random.normal(jax.random.PRNGKey(2), (B, N, 16))
    graphdef, params = nnx.split(module)
    ct = jax.random.normal(jax.random.PRNGKey(4), x.shape)

    @jax.jit
    def run(params, x, step):
        def loss(params, x):
            ctx = AttentionContext(valid_len=jnp.asarray(VL, jnp.int32), step=step)
            out = nnx.merge(graphdef, params)(x, ctx)
            return jnp.sum(out.y * ct) + sum(out.aux_losses.values()), out.y

        return jax.grad(loss, (0, 1), has_aux=True)(params, x)

    pad = jnp.asarray(_padding())[..., None]
    for step in range(4):  # soft, ramp, straight-through, hard
        (gp_clean, gx_clean), y_clean = run(params, x, step)
        for value in BAD:
            (gp, gx), y = run(params, jnp.where(pad, value, x), step)
            np.testing.assert_array_equal(y, y_clean)
            np.testing.assert_array_equal(gx, gx_clean)
            assert np.all(np.asarray(gx)[_padding()] == 0)
            jax.tree.map(np.testing.assert_array_equal, gp, gp_clean)


def test_balance_and_router_losses_of_an_empty_sequence():
    p = jax.nn.sigmoid(jax.random.normal(jax.random.PRNGKey(0), (2, 1, 8, 4)))
    p = p.at[:, :, 5:].set(jnp.nan)  # padding: anything
    vl = jnp.asarray([0, 5])
    sizes = losses.soft_sizes(p, vl)
    assert float(losses.cv2(sizes[:1])) == 0.0  # empty: nothing to balance (was -1)
    np.testing.assert_allclose(losses.cv2(sizes), losses.cv2(sizes[1:]) / 2, rtol=1e-6)
    grads = jax.grad(lambda p: losses.cv2(losses.soft_sizes(p, vl)) + losses.sparsity(p, vl))(p)
    assert np.all(np.isfinite(grads)) and np.all(np.asarray(grads)[:, :, 5:] == 0)
    assert np.isfinite(losses.z_loss(jnp.where(jnp.isnan(p), jnp.inf, p), vl))

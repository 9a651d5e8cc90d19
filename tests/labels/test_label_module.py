"""LabelAttention (NNX): phases follow the step, router gradients, causality through gradients, losses, stats."""

import jax
import jax.numpy as jnp
import label_oracles as oracles
import numpy as np
import pytest
from flax import nnx

from sparse_attn.models.transformer import TransformerConfig, TransformerLM
from sparse_attn.modules.base import AttentionContext
from sparse_attn.modules.labels import LabelAttentionConfig
from sparse_attn.patterns.labels import bits as B
from sparse_attn.patterns.labels import losses
from sparse_attn.patterns.labels.stats import label_stats

N, DM, HEADS = 32, 16, 2
CFG = LabelAttentionConfig(
    num_labels=6, top_k=2, radius=5, landmark_every=8, router_hidden=8, soft_steps=10, straight_through_steps=10,
    anneal_steps=10, block=8, soft_block=8, z_loss_weight=1e-3, rope_base=None,
)  # fmt: skip


def _x(seed=0):
    return jax.random.normal(jax.random.PRNGKey(seed), (1, N, DM))


@nnx.jit(static_argnames=("causal",))
def _output_and_grads(module, x, step, causal):
    """y, and the gradients of row t = N // 2 of y w.r.t. the router and x (one backward pass)."""
    ctx = AttentionContext(valid_len=jnp.asarray([N]), step=step, causal=causal)
    ct = jnp.sin(jnp.arange(DM, dtype=jnp.float32))

    def loss(module, x):
        out = module(x, ctx)
        return jnp.sum(out.y[0, N // 2] * ct), out

    (module_grad, dx), out = nnx.grad(loss, argnums=(0, 1), has_aux=True)(module, x)
    return out, module_grad["router"], dx


@pytest.mark.parametrize("causal", [False, True])
def test_phases_router_gradients_and_causality(causal):
    module = CFG.make(DM, HEADS, rngs=nnx.Rngs(0))
    x = _x()
    ys = {}
    for name, step in (("soft", 0), ("straight_through", 12), ("hard", 25)):
        out, router_grad, dx = _output_and_grads(module, x, jnp.int32(step), causal)
        ys[name] = np.asarray(out.y)
        assert np.all(np.isfinite(ys[name]))
        norm = sum(float(jnp.sum(jnp.abs(g))) for g in jax.tree.leaves(router_grad))
        if name != "hard":  # the hard phase's top-k has no gradient; the router learns in soft / ST phases
            assert norm > 0, name
        leak = np.abs(np.asarray(dx)[0, N // 2 + 1 :]).max()
        if causal:
            assert leak == 0.0, name  # nothing flows from the future, through any phase
        else:
            assert leak > 0.0
        assert set(out.aux_losses) == {"label_sparsity", "label_balance", "label_z_loss"}
        assert int(out.stats["capacity_overflow"]) == 0
    # Straight-through's forward is the hard pattern: two executors, one pattern.
    np.testing.assert_allclose(ys["straight_through"], ys["hard"], atol=2e-5, rtol=2e-5)
    assert np.max(np.abs(ys["soft"] - ys["hard"])) > 1e-3


def test_pinned_phase_config_errors_and_model_plug_in():
    with pytest.raises(ValueError, match="num_labels"):
        LabelAttentionConfig(num_labels=65)
    with pytest.raises(ValueError, match="top_k"):
        LabelAttentionConfig(num_labels=4, top_k=5)
    with pytest.raises(ValueError, match="top_k"):
        LabelAttentionConfig(top_k=0)
    with pytest.raises(ValueError, match="phase"):
        LabelAttentionConfig(phase="warm")
    with pytest.raises(ValueError, match="balance"):
        LabelAttentionConfig(balance="l2")
    cfg = TransformerConfig(
        vocab_size=16, model_dim=DM, num_heads=HEADS, num_layers=2, mlp_dim=32,
        attention=(CFG, LabelAttentionConfig(num_labels=4, top_k=1, radius=3, phase="hard", per_head_labels=True,
                                             balance="switch", block=8)),
    )  # fmt: skip
    model = TransformerLM(cfg, rngs=nnx.Rngs(1))
    tokens = jnp.arange(N, dtype=jnp.int32)[None] % 16
    out = nnx.jit(lambda m, t: m(t, step=3))(model, tokens)
    assert out.logits.shape == (1, N, 16) and np.isfinite(float(out.aux_loss))
    assert "layer1/mean_degree" in out.stats and "layer0/tau" in out.stats


def test_balance_losses_at_uniform_and_skewed_sizes():
    uniform = jnp.full((2, 1, 8), 5.0)
    skewed = jnp.asarray([[[20.0, 5, 5, 5, 2, 1, 1, 1]]] * 2)
    assert float(losses.cv2(uniform)) == pytest.approx(0.0, abs=1e-6)
    assert float(losses.switch(uniform, uniform)) == pytest.approx(1.0)
    assert float(losses.cv2(skewed)) > 0.5
    assert float(losses.switch(skewed, skewed)) > 1.5
    p = jnp.full((1, 1, 4, 3), 0.25)
    assert float(losses.sparsity(p, jnp.asarray([2]))) == pytest.approx(0.25)
    g = jax.grad(lambda s: losses.switch(skewed, s))(skewed)
    assert np.all(np.isfinite(np.asarray(g)))


def test_statistics_are_exact():
    n, d = 40, 8
    labels = B.top_k_labels(jax.random.normal(jax.random.PRNGKey(5), (1, 1, n, d)), 1)
    z = oracles.z_from_labels(np.asarray(labels[0, 0]), d)
    h = oracles.base_graph(n, 3, 0, False, 36)
    keys = oracles.hard_mask(z, h).sum(-1)[None, None]
    sizes = z[:36].sum(0)[None, None]
    st = label_stats(
        jnp.asarray(keys), jnp.asarray(sizes), heads=4, head_dim=8, causal=False, valid_len=jnp.asarray([36])
    )
    deg = keys[0, 0, :36] - 1
    assert float(st["frac_disconnected"]) == pytest.approx(np.mean(deg == 0))
    assert float(st["mean_degree"]) == pytest.approx(deg.mean())
    assert float(st["max_degree"]) == deg.max()
    assert float(st["attention_flops"]) == pytest.approx(4 * keys[0, 0, :36].sum() * 4 * 8)
    assert float(st["flops_vs_dense"]) == pytest.approx(keys[0, 0, :36].sum() / 36**2)
    hist = sum(float(v) for k, v in st.items() if k.startswith("bucket_hist/"))
    assert hist == d

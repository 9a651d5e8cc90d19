"""Models: forward and one optimizer step with every baseline attention; LM causality through gradients; every
mechanism's common statistics under one naming scheme."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from sparse_attn import patterns as P
from sparse_attn.models import TransformerClassifier, TransformerConfig, TransformerLM
from sparse_attn.models.transformer import layer_stats
from sparse_attn.modules import (
    AnchorAttentionConfig,
    BigBirdAttention,
    DenseAttention,
    FixedAnchors,
    LabelAttentionConfig,
    LocalAttention,
    LongformerAttention,
    NoncrossingAttentionConfig,
)
from sparse_attn.modules.base import AttentionContext, AttentionOutput, keys_per_query
from sparse_attn.patterns import abca
from sparse_attn.patterns.block_layout import BlockLayout
from sparse_attn.patterns.labels import BaseGraph, LabelPattern
from sparse_attn.patterns.stats import key_counts

N, V = 32, 40
BASELINES = {
    "dense": DenseAttention(),
    "local": LocalAttention(radius=4),
    "longformer": LongformerAttention(radius=4, num_global=2),
    "bigbird": BigBirdAttention(radius=4, num_global=1, num_random=1, block=8),
}


def config(attention, **kw):
    kw = dict(dict(vocab_size=V, model_dim=32, num_heads=4, num_layers=2, mlp_dim=64), **kw)
    return TransformerConfig(attention=attention, **kw)


def tokens(seed=0):
    return jax.random.randint(jax.random.PRNGKey(seed), (2, N), 0, V)


def _dense_mask(attention, ctx) -> np.ndarray:
    """The attention's pattern at length N under `ctx`, as its dense mask (built under jit, as in the model)."""
    return np.asarray(jax.jit(lambda: attention.pattern(N, ctx).to_dense())())


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_lm_and_classifier_train_one_step(name):
    t = tokens()
    valid_len = jnp.array([N, 20])
    for model_cls in (TransformerLM, TransformerClassifier):
        model = model_cls(config(BASELINES[name]), rngs=nnx.Rngs(0))
        opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

        def loss_fn(m):
            out = m(t, valid_len=valid_len)
            if isinstance(m, TransformerLM):
                return optax.softmax_cross_entropy_with_integer_labels(out.logits[:, :-1], t[:, 1:]).mean(), out.stats
            return optax.softmax_cross_entropy_with_integer_labels(out.logits, jnp.array([0, 1])).mean(), out.stats

        @nnx.jit
        def step(m, o):  # one compilation: the step and the loss after it (eager, the loss alone took ~20 CPU-s)
            (loss, stats), grads = nnx.value_and_grad(loss_fn, has_aux=True)(m)
            o.update(m, grads)
            return loss, stats, loss_fn(m)[0]

        l0, stats, l1 = step(model, opt)
        assert np.isfinite(l0) and float(l1) < float(l0)
        # The common statistics: the pattern's keys per valid query (its dense oracle), vs dense of the same causality.
        causal = model_cls is TransformerLM
        ctx = AttentionContext(valid_len=valid_len, causal=causal)
        mask = _dense_mask(BASELINES[name], ctx)
        kpq = float(keys_per_query(mask.sum(-1), valid_len))
        dense = (N * (N + 1) / 2 + 20 * 21 / 2) / (N + 20) if causal else (N * N + 20 * 20) / (N + 20)
        assert set(stats) == {f"layer{i}/{k}" for i in (0, 1) for k in ("keys_per_query", "attn_flops_vs_dense")}
        assert float(stats["layer1/keys_per_query"]) == pytest.approx(kpq, rel=1e-6)
        assert float(stats["layer1/attn_flops_vs_dense"]) == pytest.approx(kpq / dense, rel=1e-6)


@pytest.mark.parametrize("name", ["dense", "local", "longformer", "bigbird"])
def test_lm_is_causal_through_gradients(name):
    model = TransformerLM(config(BASELINES[name]), rngs=nnx.Rngs(1))
    emb = model.embed(tokens())
    t = 11

    def out_at_t(m, x_BxNxD):
        return jnp.sum(m(tokens(), embeddings=x_BxNxD).logits[:, t])

    g = np.asarray(nnx.jit(jax.grad(out_at_t, argnums=1))(model, emb))  # one compilation, not op by op
    assert (g[:, t + 1 :] == 0).all()
    assert np.abs(g[:, : t + 1]).sum() > 0


def test_per_layer_attention_and_config_errors():
    cfg = config((DenseAttention(), LocalAttention(radius=2)))
    model = TransformerLM(cfg, rngs=nnx.Rngs(0))
    assert type(model.blocks[1].attn.config).__name__ == "LocalAttention"
    with pytest.raises(ValueError, match="2 attention configs for 3 layers"):
        TransformerLM(config((DenseAttention(), LocalAttention()), num_layers=3), rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="divisible"):
        TransformerLM(TransformerConfig(model_dim=30, num_heads=4), rngs=nnx.Rngs(0))


def test_classifier_ignores_padding():
    model = TransformerClassifier(config(LocalAttention(radius=3)), rngs=nnx.Rngs(0))
    t = tokens()
    t2 = t.at[:, 20:].set(7)
    a = model(t, valid_len=jnp.array([20, 20])).logits
    b = model(t2, valid_len=jnp.array([20, 20])).logits
    np.testing.assert_allclose(a, b, atol=1e-5)


def test_inputs_are_refused_not_converted():
    """Float or wrapping lengths, lengths of another batch, token ids outside the vocabulary: one ValueError
    naming the problem; ids that are only known under jit turn their rows NaN instead of wrapping."""
    lm, cl = (cls(config(DenseAttention()), rngs=nnx.Rngs(0)) for cls in (TransformerLM, TransformerClassifier))
    t = tokens()
    b, n = t.shape
    with pytest.raises(ValueError, match="valid_len must have an integer dtype"):
        cl(t, valid_len=jnp.full((b,), 3.5))
    with pytest.raises(ValueError, match=rf"valid_len must lie in \[0, {n}\]"):
        cl(t, valid_len=np.full((b,), 2**32 + 5, np.int64))
    with pytest.raises(ValueError, match=f"valid_len has 3 rows but tokens have batch {b}"):
        lm(t, valid_len=jnp.full((3,), 4))
    for bad in (-1, V):
        with pytest.raises(ValueError, match=rf"token ids must lie in \[0, {V}\)"):
            lm(t.at[0, 5].set(bad))
    logits = nnx.jit(lambda m, t: m(t).logits)(lm, t.at[0, 5].set(-1))
    assert np.isnan(np.asarray(logits[0, 5:])).all() and np.isfinite(np.asarray(logits[0, :5])).all()


MECHANISMS = (
    *BASELINES.values(),
    AnchorAttentionConfig(placement=FixedAnchors(interval=6), max_zone=8),
    LabelAttentionConfig(num_labels=8, radius=6, phase="hard"),
    NoncrossingAttentionConfig(num_route_layers=2),
)


def test_layer_stats_file_common_keys_by_layer_and_the_rest_by_mechanism():
    assert len({att.mechanism for att in MECHANISMS}) == len(MECHANISMS)  # every config declares its own name
    ctx = AttentionContext(valid_len=jnp.array([8, 4]))
    att = AttentionOutput(y=jnp.zeros(()), aux_losses={"placement": 0.5}, stats={"keys_per_query": 3.0, "anchors": 2.0})
    st = layer_stats(3, MECHANISMS[4], att, ctx)
    dense = (8 * 8 + 4 * 4) / 12  # bidirectional: L keys per valid query
    assert st == pytest.approx({"layer3/keys_per_query": 3.0, "layer3/attn_flops_vs_dense": 3.0 / dense,
                                "layer3/abca/anchors": 2.0, "layer3/abca/placement": 0.5})  # fmt: skip

    class Undeclared:  # a config without `mechanism` files its own statistics under the layer
        pass

    assert set(layer_stats(0, Undeclared(), att, ctx)) == {
        "layer0/keys_per_query", "layer0/attn_flops_vs_dense", "layer0/anchors", "layer0/placement"
    }  # fmt: skip
    with pytest.raises(ValueError, match="twice"):
        layer_stats(0, MECHANISMS[4], AttentionOutput(y=att.y, aux_losses={"x": 1.0}, stats={"x": 1.0}), ctx)
    with pytest.raises(ValueError, match="the model divides"):
        layer_stats(0, MECHANISMS[4], AttentionOutput(y=att.y, stats={"attn_flops_vs_dense": 1.0}), ctx)


def test_key_counts_closed_form_equals_the_dense_oracle():
    """The O(N) count of Intervals (what baselines report every forward), BigBird's random blocks on top of it, and
    ABCA's / label patterns' counts."""
    vl = jnp.array([13, 7, 16], jnp.int32)
    # Random blocks placed anywhere (over the window, the diagonal, global keys), query blocks of 4, key blocks of 2.
    rnd = jax.random.uniform(jax.random.PRNGKey(1), (3, 2, 4, 8)) < 0.3
    rnd = rnd & (jnp.cumsum(rnd, -1) <= 3)
    g = jnp.zeros((1, 16), bool).at[0, jnp.array([2, 9, 14])].set(True)
    zones = abca.compute_zones(abca.enforce_zone_cap(abca.fixed_interval_anchors(3, 16, 5), vl, 6)[0], vl)
    labels = jax.random.randint(jax.random.PRNGKey(0), (3, 2, 16, 2), 0, 8)

    @jax.jit
    def counts_and_masks():
        out = []
        for causal in (False, True):
            for p in (
                P.dense(16, causal=causal, valid_len=vl),
                P.sliding_window(16, 3, causal=causal),
                P.longformer(16, 2, 2, causal=causal, valid_len=vl),
                P.longformer(16, 2, g, causal=causal, valid_len=vl),
                abca.ZonePattern(zones, stage="layer", causal=causal, max_zone=6),
                LabelPattern.from_labels(labels, 8, base=BaseGraph(radius=3, causal=causal), valid_len=vl),
                P.bigbird(16, 2, g, 2, 4, jax.random.PRNGKey(2), causal=causal, valid_len=vl, batch=3),
                BlockLayout.from_intervals(P.longformer(16, 2, g, causal=causal, valid_len=vl), 4, 2,
                                           random_blocks=rnd, max_random=3),
            ):
                out.append((*key_counts(p), p.to_dense()))
        return out

    for keys, self_ok, mask in counts_and_masks():
        mask = np.asarray(mask)
        np.testing.assert_array_equal(keys, np.broadcast_to(mask.sum(-1), keys.shape))
        np.testing.assert_array_equal(self_ok, np.broadcast_to(np.diagonal(mask, axis1=-2, axis2=-1), keys.shape))

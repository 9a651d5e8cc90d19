"""Models: forward and one optimizer step with every baseline attention; LM causality through gradients."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
import pytest
from flax import nnx

from sparse_attn.models import TransformerClassifier, TransformerConfig, TransformerLM
from sparse_attn.modules import BigBirdAttention, DenseAttention, LocalAttention, LongformerAttention

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


@pytest.mark.parametrize("name", sorted(BASELINES))
def test_lm_and_classifier_train_one_step(name):
    t = tokens()
    for model_cls in (TransformerLM, TransformerClassifier):
        model = model_cls(config(BASELINES[name]), rngs=nnx.Rngs(0))
        opt = nnx.Optimizer(model, optax.adam(1e-2), wrt=nnx.Param)

        def loss_fn(m):
            out = m(t, valid_len=jnp.array([N, 20]))
            if isinstance(m, TransformerLM):
                return optax.softmax_cross_entropy_with_integer_labels(out.logits[:, :-1], t[:, 1:]).mean()
            return optax.softmax_cross_entropy_with_integer_labels(out.logits, jnp.array([0, 1])).mean()

        @nnx.jit
        def step(m, o):
            loss, grads = nnx.value_and_grad(loss_fn)(m)
            o.update(m, grads)
            return loss

        l0 = step(model, opt)
        l1 = loss_fn(model)
        assert np.isfinite(l0) and float(l1) < float(l0)


@pytest.mark.parametrize("name", ["dense", "local", "longformer", "bigbird"])
def test_lm_is_causal_through_gradients(name):
    model = TransformerLM(config(BASELINES[name]), rngs=nnx.Rngs(1))
    emb = model.embed(tokens())
    t = 11

    def out_at_t(x_BxNxD):
        return jnp.sum(model(tokens(), embeddings=x_BxNxD).logits[:, t])

    g = np.asarray(jax.grad(out_at_t)(emb))
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

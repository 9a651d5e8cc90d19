"""Every mechanism plugs into the unmodified models per layer, trains a step, and reports its auxiliaries."""

import jax
import jax.numpy as jnp
import numpy as np
import optax
from flax import nnx

from sparse_attn.models import TransformerClassifier, TransformerConfig
from sparse_attn.modules import AnchorAttentionConfig, DenseAttention, LabelAttentionConfig, NoncrossingAttentionConfig


def test_encoder_with_one_layer_of_each_mechanism_trains():
    cfg = TransformerConfig(
        vocab_size=64,
        model_dim=64,
        num_heads=4,
        num_layers=4,
        mlp_dim=128,
        attention=(AnchorAttentionConfig(), LabelAttentionConfig(), NoncrossingAttentionConfig(), DenseAttention()),
    )
    model = TransformerClassifier(cfg, rngs=nnx.Rngs(0))
    opt = nnx.Optimizer(model, optax.adam(3e-3), wrt=nnx.Param)
    tokens = jax.random.randint(jax.random.PRNGKey(0), (2, 64), 0, 64)
    labels = jnp.array([0, 1])

    def loss_fn(m):
        out = m(tokens, valid_len=jnp.array([64, 40]))
        ce = optax.softmax_cross_entropy_with_integer_labels(out.logits, labels).mean()
        return ce + out.aux_loss, out.stats

    @nnx.jit
    def step(m, o):
        (loss, stats), grads = nnx.value_and_grad(loss_fn, has_aux=True)(m)
        o.update(m, grads)
        return loss, stats, grads

    loss0, stats, grads = step(model, opt)
    assert np.isfinite(float(loss0))
    for i, att in enumerate(cfg.attention):  # the common statistics for every layer, the rest under its mechanism
        assert {f"layer{i}/keys_per_query", f"layer{i}/attn_flops_vs_dense"} <= set(stats)
        own = {k for k in stats if k.startswith(f"layer{i}/") and k.count("/") > 1}
        assert all(k.startswith(f"layer{i}/{att.mechanism}/") for k in own) and (i == 3 or own)
    for i in range(3):  # each mechanism's own parameters receive gradient
        leaves = jax.tree_util.tree_leaves(nnx.state(grads["blocks"][i]["attn"]))
        assert sum(float(jnp.abs(g).sum()) for g in leaves) > 0
    loss1, _, _ = step(model, opt)
    assert float(loss1) < float(loss0)

"""The per-layer probe (sparse_attn/diagnostics/probe.py): it replays the model's trunk exactly, a window layer
reports recall 0 for a pair beyond its reach where a dense layer reports 1, every row's masses sum to 1, and the
MoBA and label probes return their layer's own pattern."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sparse_attn.diagnostics import layer_inputs, retrieval_probe
from sparse_attn.models import TransformerConfig, TransformerLM
from sparse_attn.modules import DenseAttention, LabelAttentionConfig, LocalAttention, MobaAttentionConfig

N = 24
LAYERS = (LocalAttention(radius=3), DenseAttention(), MobaAttentionConfig(block_size=4, top_k=2),
          LabelAttentionConfig(num_labels=4, top_k=1, radius=4, block=8, soft_block=8, phase="hard"))  # fmt: skip


def _model():
    cfg = TransformerConfig(vocab_size=32, model_dim=16, num_heads=2, num_layers=len(LAYERS), mlp_dim=32,
                            attention=LAYERS)  # fmt: skip
    return TransformerLM(cfg, rngs=nnx.Rngs(0))


def test_layer_inputs_replay_the_trunk():
    model = _model()
    tokens = jax.random.randint(jax.random.PRNGKey(0), (2, N), 0, 32)
    inputs, ctx = layer_inputs(model, tokens)
    x = model.embed(tokens)
    for block, xin in zip(model.blocks, inputs):
        np.testing.assert_allclose(block.norm1(x), xin, atol=1e-6)
        x, _ = block(x, ctx)
    np.testing.assert_allclose(model.head(model.norm(x)), model(tokens).logits, atol=1e-5)


def test_recall_and_mass_per_layer():
    model = _model()
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, N), 0, 32)
    i = 20
    q_pos = jnp.full((1, i + 1), i, jnp.int32)
    k_pos = jnp.arange(i + 1, dtype=jnp.int32)[None]  # every key a causal row may read
    rows = retrieval_probe(model, tokens, q_pos, k_pos)
    local, dense, moba, labels = rows
    np.testing.assert_array_equal(local["recall"][0, 0], (k_pos[0] >= i - 3).astype(np.float32))
    assert np.all(np.asarray(dense["recall"]) == 1)
    for row in rows:  # one softmax per row: its masses over all keys sum to 1, none outside the pattern
        np.testing.assert_allclose(np.asarray(row["mass"]).sum(-1), 1.0, rtol=1e-5)
        assert not np.any(np.asarray(row["mass"])[np.asarray(row["recall"]) == 0])
    assert 0 < np.asarray(moba["recall"]).sum(-1).min() < i + 1  # a selection: some blocks, not all
    assert 0 < np.asarray(labels["recall"]).sum(-1).min() < i + 1

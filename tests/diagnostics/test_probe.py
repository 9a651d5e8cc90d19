"""The per-layer probe (sparse_attn/diagnostics/probe.py): it replays the model's trunk exactly, a window layer
reports recall 0 for a pair beyond its reach where a dense layer reports 1, every row's masses sum to 1, and the
MoBA and label probes return their layer's own pattern."""

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

from sparse_attn.diagnostics import attention_rollout, layer_inputs, retrieval_probe
from sparse_attn.models import TransformerConfig, TransformerLM
from sparse_attn.modules import (
    AnchorAttentionConfig,
    DenseAttention,
    FixedAnchors,
    LabelAttentionConfig,
    LabelCapacity,
    LocalAttention,
    MobaAttentionConfig,
    NsaAttentionConfig,
)

N = 24
LAYERS = (LocalAttention(radius=3), DenseAttention(), MobaAttentionConfig(block_size=4, top_k=2),
          LabelAttentionConfig(num_labels=4, top_k=1, radius=4, capacity=LabelCapacity(block=8, soft_block=8),
                               phase="hard"))  # fmt: skip


def _model():
    cfg = TransformerConfig(vocab_size=32, model_dim=16, num_heads=2, num_layers=len(LAYERS), mlp_dim=32,
                            attention=LAYERS)  # fmt: skip
    return TransformerLM(cfg, rngs=nnx.Rngs(0))


def test_layer_inputs_replay_the_trunk():
    model = _model()
    tokens = jax.random.randint(jax.random.PRNGKey(0), (2, N), 0, 32)
    inputs, ctx = layer_inputs(model, tokens)
    x = model.embed(tokens)
    for block, xin in zip(model.blocks, inputs, strict=True):
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


def _two_layer(first, second):
    cfg = TransformerConfig(vocab_size=32, model_dim=16, num_heads=2, num_layers=2, mlp_dim=32,
                            attention=(first, second))  # fmt: skip
    return TransformerLM(cfg, rngs=nnx.Rngs(1))


def test_rollout_reaches_as_far_as_the_layers_compose():
    model = _two_layer(LocalAttention(radius=3), LocalAttention(radius=3))  # two hops of 3: distance 6, not 7
    tokens = jax.random.randint(jax.random.PRNGKey(2), (2, N), 0, 32)
    i = 20
    q_pos = jnp.full((1, i + 1), i, jnp.int32)
    k_pos = jnp.arange(i + 1, dtype=jnp.int32)[None]
    out = attention_rollout(model, tokens, q_pos, k_pos)
    for name in ("rollout", "rollout_uniform"):
        r = np.asarray(out[name])
        np.testing.assert_allclose(r.sum(-1), 1.0, rtol=1e-5)  # the row's whole flow
        assert np.all(r[:, : i - 6] == 0) and np.all(r[:, i - 6:] > 0)
    assert attention_rollout(_two_layer(NsaAttentionConfig(), DenseAttention()), tokens, q_pos, k_pos) is None


def test_abca_layers_report_their_path():
    abca = AnchorAttentionConfig(placement=FixedAnchors(interval=6), max_zone=6, implementation="reference")
    model = _two_layer(abca, DenseAttention())
    tokens = jax.random.randint(jax.random.PRNGKey(3), (2, N), 0, 32)
    rows = retrieval_probe(model, tokens, jnp.array([[20, 20, 20]]), jnp.array([[19, 9, 3]]))
    first = {k: np.asarray(v) for k, v in rows[0].items()}
    np.testing.assert_array_equal(first["recall"], np.broadcast_to([1.0, 1.0, 0.0], first["recall"].shape))
    assert np.all(first["mass"][..., :2] > 0) and np.all(first["mass"][..., 2] == 0)
    assert {"direct", "to_anchor", "gather", "handshake", "gather_uniform"} <= set(first)
    r = attention_rollout(model, tokens, jnp.array([[20, 20, 20]]), jnp.array([[19, 9, 3]]))
    assert np.all(np.asarray(r["rollout"]) > 0)  # the dense second layer reads every position the first filled

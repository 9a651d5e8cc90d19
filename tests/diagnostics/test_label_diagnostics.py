"""Label attention's diagnostics (sparse_attn/diagnostics/labels.py) on planted labels with known answers, and the
router's task gradient: present in the soft phase, exactly 0 in the hard phase (the top-k has no gradient)."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_attn.diagnostics import layer_inputs
from sparse_attn.diagnostics.labels import kept_of_base, label_layer_probe, label_usage, router_gradient_norms
from sparse_attn.models import TransformerConfig, TransformerLM
from sparse_attn.modules import LabelAttentionConfig, LabelCapacity, LabelRouterConfig, LocalAttention
from sparse_attn.patterns.labels.base_graph import BaseGraph

N, L = 16, 4


def test_usage_of_planted_labels():
    one = jnp.zeros((2, 1, N, 1), jnp.int32)  # every token on label 0
    spread = jnp.broadcast_to((jnp.arange(N) % L)[None, None, :, None], (2, 1, N, 1))  # each label N / L times
    u1, u2 = label_usage(one, L), label_usage(spread, L)
    np.testing.assert_allclose(u1["entropy"], 0.0, atol=1e-6)
    np.testing.assert_allclose(u1["max_share"], 1.0)
    np.testing.assert_allclose(u2["entropy"], 1.0, rtol=1e-6)
    np.testing.assert_allclose(u2["bucket_cv"], 0.0, atol=1e-6)
    np.testing.assert_allclose(u2["share"], 1 / L)
    # padding does not count: only the first 4 tokens live, labels 0..3 once each
    np.testing.assert_allclose(label_usage(spread, L, jnp.array([4, 4]))["share"], 1 / L)


def test_kept_of_base():
    base = BaseGraph(radius=3, causal=True)
    vl = jnp.array([N, N])
    same = jnp.zeros((2, 1, N, 1), jnp.int32)
    parity = jnp.broadcast_to((jnp.arange(N) % 2)[None, None, :, None], (2, 1, N, 1))
    np.testing.assert_allclose(kept_of_base(same, L, base, vl), 1.0)
    # window edges at distances 1, 2, 3: only distance 2 keeps the parity (counts 15 + 14 + 13 edges)
    np.testing.assert_allclose(kept_of_base(parity, L, base, vl), 14 / 42, rtol=1e-6)


def _model(phase, **kw):
    lab = LabelAttentionConfig(num_labels=L, top_k=1, radius=4, landmark_every=4, phase=phase,
                               capacity=LabelCapacity(block=8, soft_block=8), **kw)  # fmt: skip
    cfg = TransformerConfig(vocab_size=32, model_dim=16, num_heads=2, num_layers=2, mlp_dim=32,
                            attention=(LocalAttention(radius=3), lab))  # fmt: skip
    return TransformerLM(cfg, rngs=nnx.Rngs(0))


def test_layer_probe_base_recall():
    model = _model("hard")
    tokens = jax.random.randint(jax.random.PRNGKey(0), (2, N), 0, 32)
    inputs, ctx = layer_inputs(model, tokens)
    out = label_layer_probe(model.blocks[1].attn, inputs[1], ctx, jnp.array([[14, 14, 14]]), jnp.array([[12, 8, 9]]))
    np.testing.assert_array_equal(out["base_recall"], [[1.0, 1.0, 0.0], [1.0, 1.0, 0.0]])  # window; landmark; neither
    assert 0 < float(out["kept_of_base"]) <= 1 and out["share"].shape == (1, L)


@pytest.mark.parametrize("phase, freeze", [("soft", True), ("hard", True), ("hard", False)])
def test_router_gradient_norms(phase, freeze):
    model = _model(phase, router=LabelRouterConfig(freeze_when_hard=freeze))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, N), 0, 32)
    rows = router_gradient_norms(model, tokens, jnp.roll(tokens, -1, 1), jnp.ones((2, N)), step=0)
    assert rows[0] is None
    task, aux = float(rows[1]["task"]), float(rows[1]["aux"])
    if phase == "soft":
        assert task > 0 and aux > 0
    else:  # the top-k has no gradient; the frozen router gets none from its losses either
        assert task == 0.0 and (aux == 0.0 if freeze else aux > 0)

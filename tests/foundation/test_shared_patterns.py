"""Patterns built once per forward: the model calls `config.prepare` once per distinct layer config, hands the
result to every layer of that config (`ctx.shared`), and the outputs and statistics equal those of layers that each
build their own."""

import dataclasses
from unittest import mock

import jax
import jax.numpy as jnp
import numpy as np
from flax import nnx

import sparse_attn
from sparse_attn.models import TransformerConfig, TransformerLM
from sparse_attn.models import transformer
from sparse_attn.modules import BigBirdAttention, LocalAttention
from sparse_attn.modules.base import AttentionContext
from sparse_attn.modules.pattern_attention import _PatternConfig

LOCAL = LocalAttention(radius=3, implementation="xla")
BIGBIRD = BigBirdAttention(radius=2, num_global=1, num_random=1, block=4)
CONFIG = TransformerConfig(vocab_size=16, model_dim=16, num_heads=2, num_layers=3, mlp_dim=32,
                           attention=(LOCAL, BIGBIRD, dataclasses.replace(LOCAL)))


def _forward(model, tokens, valid_len):
    out = model(tokens, valid_len=valid_len)
    return out.logits, out.stats


def test_each_distinct_config_is_prepared_once_and_shared():
    model = TransformerLM(CONFIG, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, 16), 0, 16)
    valid_len = jnp.asarray([16, 11])
    calls = []
    real = _PatternConfig.prepare

    def counting(self, n, ctx, head_dim):
        calls.append(type(self).__name__)
        return real(self, n, ctx, head_dim)

    with mock.patch.object(_PatternConfig, "prepare", counting):
        ctx = lambda vl: AttentionContext(valid_len=vl, causal=True)  # noqa: E731
        shared = jax.jit(lambda vl: list(transformer.shared_per_config(CONFIG, 16, ctx(vl)).values()))(valid_len)
    assert sorted(calls) == ["BigBirdAttention", "LocalAttention"]  # 3 layers, 2 distinct configs
    assert all(isinstance(s["pattern"], sparse_attn.Prepared) and s["pattern"].head_dim == 8 for s in shared)

    y1, s1 = nnx.jit(_forward)(model, tokens, valid_len)
    with mock.patch.object(transformer, "shared_per_config", lambda *a: {}):  # every layer builds its own
        y2, s2 = nnx.jit(_forward)(model, tokens, valid_len)  # a new jit: traced with the hook off
    np.testing.assert_allclose(y1, y2, rtol=1e-5, atol=1e-6)
    assert s1.keys() == s2.keys() and all(np.allclose(s1[k], s2[k]) for k in s1)

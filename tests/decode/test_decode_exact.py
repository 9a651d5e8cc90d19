"""Step-by-step decoding == the full forward pass (teacher forcing) for every decodable causal mechanism.

Tolerance: fp32, |logits difference| <= 2e-5 (logits are O(1); the two paths sum the same terms in another
order). The model mixes every mechanism in one stack (one compilation of each path); the window (radius 5) wraps
around its ring several times in 40 tokens, row 1 is padded (valid_len 29) and compared at its valid positions.
Every sparse layer's pattern differs from dense attention at these sizes (radius <= 6 of 40 tokens), so a decoder
that ignored its pattern, its ring order or its landmarks would miss the full forward's logits by far more than
the tolerance.
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_attn.decode import LMDecoder, cache_bytes, decoder_for, init_caches
from sparse_attn.decode import labels as labels_decode
from sparse_attn.models.transformer import TransformerConfig, TransformerLM
from sparse_attn.modules import (
    BigBirdAttention,
    DenseAttention,
    LabelAttentionConfig,
    LabelCapacity,
    LabelRouterConfig,
    LabelSchedule,
    LocalAttention,
    LongformerAttention,
    MobaAttentionConfig,
    NsaAttentionConfig,
)

N, VOCAB, TOL = 40, 50, 2e-5


def _labels(**kw):
    return LabelAttentionConfig(num_labels=8, top_k=2, radius=6, capacity=LabelCapacity(block=16, soft_block=16), **kw)


LAYERS = (
    LocalAttention(radius=5, num_kv_heads=2),
    LongformerAttention(radius=4, num_global=3),
    BigBirdAttention(radius=4, num_global=1, num_random=2, block=8),
    _labels(landmark_every=7, phase="hard", router=LabelRouterConfig(per_head=True)),
    # scheduled, evaluated at the end of its 10-step run: the hard phase
    _labels(landmark_every=9, phase="schedule", schedule=LabelSchedule(num_steps=10), position_cell=4),  # + positions
    DenseAttention(num_kv_heads=1),
    # block selection: groups of 2 queries select at their first query, from block means / compressed tokens
    MobaAttentionConfig(block_size=4, top_k=3, query_block=2, num_kv_heads=2),
    NsaAttentionConfig(compress_block=6, compress_stride=3, select_block=4, top_n=3, sink_blocks=1, window=3,
                       query_block=2, tile=2, num_kv_heads=2),
)


@pytest.fixture(scope="module")
def model():
    cfg = TransformerConfig(vocab_size=VOCAB, model_dim=32, num_heads=4, num_layers=len(LAYERS), mlp_dim=64,
                            attention=LAYERS)
    return TransformerLM(cfg, rngs=nnx.Rngs(0))


@pytest.fixture(scope="module")
def tokens_and_full(model):
    """Tokens [2, N] and the full forward's logits at step 10 with row 1 padded from position 29 (one compile)."""
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, N), 0, VOCAB)
    full = nnx.jit(lambda m, t: m(t, valid_len=jnp.array([N, 29]), step=10).logits)(model, tokens)
    return tokens, np.asarray(full)


def test_prefill_equals_full_forward(model, tokens_and_full):
    tokens, full = tokens_and_full
    dec = LMDecoder(model, batch=2, max_len=N, step=10)
    assert dec.warnings == []  # every label layer is hard at step 10
    logits, _ = dec.prefill(tokens)
    err = np.abs(np.asarray(logits) - full)
    assert err[0].max() <= TOL, err[0].max(axis=-1)
    assert err[1, :29].max() <= TOL, err[1, :29].max(axis=-1)


def test_step_continues_prefill(model, tokens_and_full):
    """Prefill a prompt, then the jitted one-token step: the same logits as the full forward pass (row 0; row 1
    is padding past position 29)."""
    tokens, full = tokens_and_full
    dec = LMDecoder(model, batch=2, max_len=N, step=10)
    _, caches = dec.prefill(tokens[:, :30])
    for pos in range(30, N):
        last, caches = dec.step(caches, tokens[:, pos], pos)
        assert np.abs(np.asarray(last)[0] - full[0, pos]).max() <= TOL, pos


def test_bounded_caches():
    """Window, Longformer and label caches do not grow with the context; dense and BigBird keep every key."""
    cfg = TransformerConfig(vocab_size=VOCAB, model_dim=32, num_heads=4, num_layers=1, mlp_dim=64)
    sizes = {}
    for name, att in {"local": LocalAttention(radius=5), "longformer": LongformerAttention(radius=5, num_global=2),
                      "labels": _labels(landmark_every=0), "dense": DenseAttention()}.items():
        m = TransformerLM(dataclasses.replace(cfg, attention=att), rngs=nnx.Rngs(0))
        sizes[name] = [cache_bytes(jax.eval_shape(lambda m=m, n=n: init_caches(m, 1, n))) for n in (1024, 65536)]
    for name in ("local", "longformer", "labels"):
        assert sizes[name][0] == sizes[name][1], (name, sizes[name])
    assert sizes["dense"][1] == 64 * sizes["dense"][0]
    # window 6 keys x (k + v) x 32 floats, plus ring positions
    assert sizes["local"][0] == 6 * 2 * 32 * 4 + 6 * 4


def test_unregistered_module_names_itself():
    class Mystery:
        pass

    with pytest.raises(NotImplementedError, match="Mystery; mechanisms with one: fixed, labels, abca"):
        decoder_for(Mystery())


def test_label_phase_warning():
    cfg = TransformerConfig(vocab_size=VOCAB, model_dim=32, num_heads=4, num_layers=1, mlp_dim=64,
                            attention=_labels(phase="schedule", schedule=LabelSchedule(num_steps=100)))
    m = TransformerLM(cfg, rngs=nnx.Rngs(0))
    assert labels_decode.phase_at(m.blocks[0].attn, 0) == "soft"
    assert labels_decode.phase_at(m.blocks[0].attn, 100) == "hard"
    assert "soft phase at step 0" in LMDecoder(m, batch=1, max_len=8, step=0).warnings[0]


def test_bad_tokens_are_refused_before_decoding():
    """Out-of-range ids would be clamped by the embedding gather: refused with the range, before any compile."""
    cfg = TransformerConfig(vocab_size=VOCAB, model_dim=32, num_heads=4, num_layers=1, mlp_dim=64)
    dec = LMDecoder(TransformerLM(cfg, rngs=nnx.Rngs(0)), batch=2, max_len=8)
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 50\), got values in \[1, 50\]"):
        dec.prefill(jnp.array([[1, 2], [3, VOCAB]]))
    with pytest.raises(ValueError, match=r"token ids must be in \[0, 50\), got values in \[-1, 4\]"):
        dec.step(None, jnp.array([4, -1]), 0)
    with pytest.raises(ValueError, match=r"token must be int\[2\]"):
        dec.step(None, jnp.array([4]), 0)
    with pytest.raises(ValueError, match="does not fit max_len=8"):
        dec.prefill(jnp.zeros((2, 9), jnp.int32))

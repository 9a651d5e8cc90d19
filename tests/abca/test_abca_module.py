"""AnchorAttention: causality through gradients, implementations agree, aux loss, stats, errors, model plug-in."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_attn.models import TransformerConfig, TransformerLM
from sparse_attn.modules.abca import AnchorAttentionConfig
from sparse_attn.modules.abca.stats import _handshake_pairs
from sparse_attn.modules.base import AttentionContext
from sparse_attn.patterns import abca

B, N, DM, H = 2, 20, 16, 2
VOCAB, ANCHOR = 11, 3


def _inputs(seed=0):
    x = jax.random.normal(jax.random.PRNGKey(seed), (B, N, DM))
    tokens = jax.random.randint(jax.random.PRNGKey(seed + 1), (B, N), 0, VOCAB)
    return x, tokens


def _run(cfg, x, tokens, *, causal, valid_len=(N, 14), seed=0):
    module = cfg.make(DM, H, rngs=nnx.Rngs(seed))
    ctx = AttentionContext(valid_len=jnp.asarray(valid_len, jnp.int32), tokens=tokens, causal=causal)
    return module, ctx


CAUSAL_CONFIGS = {
    "explicit_global": AnchorAttentionConfig(
        placement="explicit",
        anchor_id=ANCHOR,
        vocab_size=VOCAB,
        max_zone=4,
        handshake="global",
        max_anchors=3,
        handshake_steps=2,
    ),
    "learned_st": AnchorAttentionConfig(
        placement="learned",
        max_zone=5,
        handshake_steps=2,
        straight_through=True,
        boundary_ids=(1, 2),
        score_bias_init=0.0,
    ),
}


@pytest.mark.parametrize("name", sorted(CAUSAL_CONFIGS))
def test_causal_outputs_ignore_later_tokens(name):
    """d y[:, :t+1] / d x[:, t+1:] == 0 exactly, through placement, the handshake chain and the zones."""
    x, tokens = _inputs()
    module, ctx = _run(CAUSAL_CONFIGS[name], x, tokens, causal=True)
    graphdef, state = nnx.split(module)
    ct = jax.random.normal(jax.random.PRNGKey(5), (B, N, DM))

    @jax.jit
    def grads(x):
        def prefix_loss(x, t):
            y = nnx.merge(graphdef, state)(x, ctx).y
            keep = (jnp.arange(N) <= t)[None, :, None]
            return jnp.sum(jnp.where(keep, y * ct, 0.0))

        return jax.vmap(lambda t: jax.grad(prefix_loss)(x, t))(jnp.arange(N))

    g = np.asarray(grads(x))  # [t, B, N, DM]
    later = np.arange(N)[None, :] > np.arange(N)[:, None]  # [t, position]
    assert np.all(g[later[:, None, :, None].repeat(B, 1).repeat(DM, 3)] == 0)
    assert np.any(g[~later[:, None, :, None].repeat(B, 1).repeat(DM, 3)] != 0)


def test_learned_placement_gets_gradients():
    x, tokens = _inputs(2)
    cfg = CAUSAL_CONFIGS["learned_st"]
    module, ctx = _run(cfg, x, tokens, causal=False)

    def loss(m):
        out = m(x, ctx)
        return jnp.sum(out.y**2) + sum(out.aux_losses.values())

    grads = nnx.jit(nnx.grad(loss))(module)
    assert float(jnp.abs(grads.score.kernel[...]).sum()) > 0
    out = nnx.jit(lambda m: m(x, ctx))(module)
    assert set(out.aux_losses) == {"placement"} and float(out.aux_losses["placement"]) > 0


# bidirectional: test_abca_core compares the implementations; num_kv_heads=1: grouped-query attention (MQA)
@pytest.mark.parametrize("causal,kv_heads", [(True, None), (True, 1)])
def test_module_implementations_agree(causal, kv_heads):
    x, tokens = _inputs(3)
    outs = {}
    for impl in ("reference", None):
        cfg = AnchorAttentionConfig(
            placement="explicit",
            anchor_id=ANCHOR,
            vocab_size=VOCAB,
            max_zone=6,
            handshake_steps=2,
            implementation=impl,
            num_kv_heads=kv_heads,
        )
        module, ctx = _run(cfg, x, tokens, causal=causal)
        assert module.proj.num_kv_heads == (kv_heads or module.proj.num_heads)
        run = nnx.jit(lambda m, x, c: (m(x, c), jax.grad(lambda x: jnp.sum(m(x, c).y ** 2))(x)))
        outs[impl] = run(module, x, ctx)
    (o1, g1), (o2, g2) = outs[None], outs["reference"]
    np.testing.assert_allclose(o1.y, o2.y, atol=1e-5, rtol=1e-5)
    np.testing.assert_allclose(g1, g2, atol=1e-4, rtol=1e-4)
    assert np.all(np.asarray(o1.y)[1, 14:] == 0)  # padding outputs 0


def test_stats_report_zones_and_flops():
    x, tokens = _inputs()
    cfg = AnchorAttentionConfig(placement="fixed", interval=8, max_zone=5)
    module, ctx = _run(cfg, x, tokens, causal=False, valid_len=(N, N))
    st = {k: float(v) for k, v in nnx.jit(lambda m, x, c: m(x, c))(module, x, ctx).stats.items()}
    # interval 8 under a cap of 5: anchors at 0, 5, 8, 13, 16 -> k = 5, 2 inserted (5, 13), zones 5,3,5,3,4.
    assert st["anchors"] == 5 and st["inserted_anchors"] == 2
    assert st["max_zone"] == 5 and st["mean_zone"] == pytest.approx(4.0)
    # keys per query over every pass: the stage-1/3 oracle mask plus the chain handshake's neighbour slots
    is_anchor, _ = abca.enforce_zone_cap(abca.fixed_interval_anchors(B, N, 8), ctx.valid_len, 5)
    zones = abca.compute_zones(is_anchor, ctx.valid_len)
    stages = np.asarray(abca.ZonePattern(zones, stage="layer", causal=False, max_zone=5).to_dense()).sum()
    handshake = np.asarray(abca.chain_handshake(zones, causal=False).valid).sum()
    assert st["keys_per_query"] == pytest.approx((stages + handshake) / (B * N))


def test_config_and_call_errors():
    with pytest.raises(ValueError, match="outside the vocabulary"):
        AnchorAttentionConfig(placement="explicit", anchor_id=VOCAB, vocab_size=VOCAB)
    with pytest.raises(ValueError, match="max_zone"):
        AnchorAttentionConfig(max_zone=0)
    with pytest.raises(ValueError, match="handshake_steps"):
        AnchorAttentionConfig(handshake_steps=0)
    with pytest.raises(ValueError, match="placement"):
        AnchorAttentionConfig(placement="random")
    x, tokens = _inputs()
    module, ctx = _run(AnchorAttentionConfig(placement="explicit", anchor_id=ANCHOR), x, tokens, causal=False)
    with pytest.raises(ValueError, match="anchor_mask"):
        module(x, AttentionContext(valid_len=ctx.valid_len))
    with pytest.raises(ValueError, match="does not match"):
        module(x, ctx, anchor_mask=jnp.ones((B, N - 1), bool))
    with pytest.raises(ValueError, match="does not match"):
        module(x, AttentionContext(valid_len=ctx.valid_len, tokens=tokens[:, :-1]))
    with pytest.raises(ValueError, match="model_dim"):
        module(x[0], ctx)


def test_plugs_into_the_language_model():
    cfg = TransformerConfig(
        vocab_size=VOCAB,
        model_dim=DM,
        num_heads=H,
        num_layers=2,
        mlp_dim=32,
        attention=(
            AnchorAttentionConfig(placement="fixed", interval=4, max_zone=4),
            AnchorAttentionConfig(placement="learned", max_zone=6, boundary_ids=(1,)),
        ),
    )
    model = TransformerLM(cfg, rngs=nnx.Rngs(0))
    _, tokens = _inputs()
    out = nnx.jit(lambda m, t: m(t, valid_len=jnp.array([N, 9])))(model, tokens)
    assert out.logits.shape == (B, N, VOCAB) and np.all(np.isfinite(out.logits))
    assert float(out.aux_loss) > 0
    assert any("abca/anchors" in k for k in out.stats)


@pytest.mark.parametrize("causal", [False, True])
def test_handshake_pair_count_matches_the_patterns(causal):
    """The stats count handshake pairs from k alone; the chain / global neighbour lists must agree. One array
    shape (N = 40, lengths drawn below it as valid lengths), so the eager ops compile once, not per length."""
    rng = np.random.default_rng(int(causal))
    for _ in range(20):
        n, cap = int(rng.integers(1, 41)), int(rng.integers(1, 8))
        vl = jnp.asarray([n, int(rng.integers(0, n + 1))], jnp.int32)
        is_anchor, _ = abca.enforce_zone_cap(jnp.asarray(rng.random((2, 40)) < rng.random()), vl, cap)
        zones = abca.compute_zones(is_anchor, vl)
        m = int(rng.integers(1, 6))
        chain = abca.chain_handshake(zones, causal=causal).valid.sum((1, 2, 3))
        glob = abca.global_handshake(zones, max_anchors=m, causal=causal)[0].valid.sum((1, 2, 3))
        np.testing.assert_array_equal(_handshake_pairs(zones.num_anchors, causal, "chain", None), chain)
        np.testing.assert_array_equal(_handshake_pairs(zones.num_anchors, causal, "global", m), glob)

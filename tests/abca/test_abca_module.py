"""AnchorAttention: causality through gradients, implementations agree, aux loss, stats, errors, model plug-in."""

import dataclasses
import json
import re

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_attn.models import TransformerConfig, TransformerLM
from sparse_attn.modules.abca import AnchorAttentionConfig, ExplicitAnchors, FixedAnchors, LearnedAnchors
from sparse_attn.modules.abca.stats import _handshake_pairs
from sparse_attn.modules.base import AttentionContext
from sparse_attn.patterns import abca
from sparse_attn.studies.restore import from_json
from sparse_attn.train import run_config

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
        placement=ExplicitAnchors(anchor_id=ANCHOR, vocab_size=VOCAB),
        max_zone=4,
        handshake="global",
        max_anchors=3,
        handshake_steps=2,
    ),
    "learned_st": AnchorAttentionConfig(
        placement=LearnedAnchors(straight_through=True, boundary_ids=(1, 2), score_bias_init=0.0),
        max_zone=5,
        handshake_steps=2,
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
            placement=ExplicitAnchors(anchor_id=ANCHOR, vocab_size=VOCAB),
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
    cfg = AnchorAttentionConfig(placement=FixedAnchors(interval=8), max_zone=5)
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
        AnchorAttentionConfig(placement=ExplicitAnchors(anchor_id=VOCAB, vocab_size=VOCAB))
    with pytest.raises(ValueError, match="max_zone"):
        AnchorAttentionConfig(max_zone=0)
    with pytest.raises(ValueError, match="handshake_steps"):
        AnchorAttentionConfig(handshake_steps=0)
    with pytest.raises(TypeError, match="placement must be one of FixedAnchors"):
        AnchorAttentionConfig(placement="random")
    x, tokens = _inputs()
    module, ctx = _run(AnchorAttentionConfig(placement=ExplicitAnchors(anchor_id=ANCHOR)), x, tokens, causal=False)
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
            AnchorAttentionConfig(placement=FixedAnchors(interval=4), max_zone=4),
            AnchorAttentionConfig(placement=LearnedAnchors(boundary_ids=(1,)), max_zone=6),
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


def test_placement_sub_configs_refuse_the_flat_form_and_validate():
    """The old flat fields are refused with the new form named (one line each); each placement validates its own
    fields; `flat_fields()` gives the flat names result rows record; the nested config round-trips through JSON."""
    for old, new in (("interval", "FixedAnchors(interval=...)"), ("anchor_id", "ExplicitAnchors(anchor_id=...)"),
                     ("vocab_size", "ExplicitAnchors(vocab_size=...)"),
                     ("boundary_ids", "LearnedAnchors(boundary_ids=...)"),
                     ("placement_loss_weight", "LearnedAnchors(loss_weight=...)"),
                     ("straight_through", "LearnedAnchors(straight_through=...)"),
                     ("score_bias_init", "LearnedAnchors(score_bias_init=...)")):
        with pytest.raises(TypeError, match=rf"no field '{old}': use placement={re.escape(new)}$"):
            AnchorAttentionConfig(**{old: 1})
        with pytest.raises(AttributeError, match=rf"use placement={re.escape(new)}"):
            getattr(AnchorAttentionConfig(), old)
    for kind, new in (("fixed", "FixedAnchors(interval=...)"), ("learned", "LearnedAnchors(boundary_ids=...")):
        with pytest.raises(TypeError, match=rf"placement='{kind}' is the old string form: use placement={re.escape(new)}"):
            AnchorAttentionConfig(placement=kind)
    with pytest.raises(TypeError, match="has no field 'interval'"):
        dataclasses.replace(AnchorAttentionConfig(), interval=8)
    bad = [(lambda: FixedAnchors(interval=0), "FixedAnchors.interval"),
           (lambda: FixedAnchors(interval=2.0), "FixedAnchors.interval"),
           (lambda: ExplicitAnchors(anchor_id=-1), "ExplicitAnchors.anchor_id"),
           (lambda: ExplicitAnchors(vocab_size=0), "ExplicitAnchors.vocab_size"),
           (lambda: LearnedAnchors(loss_weight=float("nan")), "LearnedAnchors.loss_weight"),
           (lambda: LearnedAnchors(loss_weight=-0.1), "LearnedAnchors.loss_weight"),
           (lambda: LearnedAnchors(score_bias_init=float("inf")), "LearnedAnchors.score_bias_init"),
           (lambda: LearnedAnchors(straight_through=1), "LearnedAnchors.straight_through"),
           (lambda: LearnedAnchors(boundary_ids=(1, "a")), "LearnedAnchors.boundary_ids"),
           (lambda: LearnedAnchors(boundary_ids="ab"), "LearnedAnchors.boundary_ids")]
    for make, field in bad:
        with pytest.raises(ValueError, match=re.escape(field)):
            make()
    assert AnchorAttentionConfig().placement == FixedAnchors(interval=64)
    assert LearnedAnchors(boundary_ids=[3, 1]).boundary_ids == (3, 1)  # a list (as JSON gives) becomes a tuple

    explicit = AnchorAttentionConfig(placement=ExplicitAnchors(anchor_id=ANCHOR, vocab_size=VOCAB), max_zone=9)
    flat = explicit.flat_fields()
    assert (flat["placement"], flat["anchor_id"], flat["vocab_size"], flat["max_zone"]) == ("explicit", ANCHOR, VOCAB, 9)
    assert flat["interval"] == 64 and flat["straight_through"] is True  # the flat config's values for other modes
    learned = AnchorAttentionConfig(placement=LearnedAnchors(boundary_ids=(1,), loss_weight=0.5)).flat_fields()
    assert (learned["placement"], learned["boundary_ids"], learned["placement_loss_weight"]) == ("learned", (1,), 0.5)
    assert set(flat) == {f.name for f in dataclasses.fields(AnchorAttentionConfig)} | {
        "interval", "anchor_id", "vocab_size", "boundary_ids", "placement_loss_weight", "straight_through",
        "score_bias_init"}

    for cfg in (AnchorAttentionConfig(), explicit, AnchorAttentionConfig(placement=LearnedAnchors(boundary_ids=(1, 2)))):
        stored = json.loads(json.dumps(run_config.to_json(cfg)))
        assert stored["placement"]["_type"] == type(cfg.placement).__name__
        assert from_json(stored) == cfg

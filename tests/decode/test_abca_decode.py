"""ABCA incremental decoding == the causal full forward pass, at every position (teacher forcing, fp32).

Each placement mode (explicit, fixed, learned) runs with the chain and the global handshake, and pooled writes
(`summaries_per_anchor` > 1) with each handshake; the configurations
are chosen so that zones close, the zone cap inserts fallback anchors, the global handshake overflows its head, and
row 1 is padded (its valid positions must agree; the full pass's padding never reaches them).
"""

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_attn.decode import DecodeContext, decoder_for
from sparse_attn.decode import abca as abca_decode
from sparse_attn.modules.abca import AnchorAttentionConfig, ExplicitAnchors, FixedAnchors, LearnedAnchors
from sparse_attn.modules.base import AttentionContext
from sparse_attn.patterns import abca

B, N, DM, H = 2, 48, 32, 4
VOCAB, ANCHOR = 7, 3
VALID = (N, 37)
TOL = dict(rtol=2e-5, atol=2e-5)  # fp32: the decoder sums the same terms in another order

EXPLICIT = ExplicitAnchors(anchor_id=ANCHOR, vocab_size=VOCAB)
CONFIGS = {
    "explicit_chain": AnchorAttentionConfig(placement=EXPLICIT, max_zone=6, handshake_steps=2, num_kv_heads=2),
    "explicit_global": AnchorAttentionConfig(placement=EXPLICIT, max_zone=8, handshake="global", max_anchors=4),
    "fixed_chain": AnchorAttentionConfig(placement=FixedAnchors(interval=10), max_zone=7),
    "fixed_global": AnchorAttentionConfig(
        placement=FixedAnchors(interval=9), max_zone=5, handshake="global", max_anchors=6, handshake_steps=2,
        num_kv_heads=1,
    ),
    "learned_chain": AnchorAttentionConfig(
        placement=LearnedAnchors(straight_through=True, score_bias_init=-1.0, boundary_ids=(1,)), max_zone=5
    ),
    "learned_global": AnchorAttentionConfig(
        placement=LearnedAnchors(score_bias_init=-1.0), max_zone=9, handshake="global", max_anchors=5,
        handshake_steps=2,
    ),
    # Pooled writes (P summaries per anchor): each summary's gather, handshake and zone read, online.
    "fixed_chain_p3": AnchorAttentionConfig(placement=FixedAnchors(interval=10), max_zone=7, summaries_per_anchor=3,
                                            num_kv_heads=2),  # fmt: skip
    "learned_global_p2": AnchorAttentionConfig(
        placement=LearnedAnchors(score_bias_init=-1.0, straight_through=True), max_zone=9, handshake="global",
        max_anchors=5, handshake_steps=2, summaries_per_anchor=2,
    ),
}


def _raw_anchors(module, x, tokens):
    place = module.config.placement
    if isinstance(place, ExplicitAnchors):
        return tokens == place.anchor_id
    if isinstance(place, FixedAnchors):
        return abca.fixed_interval_anchors(B, N, place.interval)
    return module.score(x)[..., 0] > 0


def _full_and_decoded(cfg, seed=0):
    # The full pass on the dense-masked "reference" path: the cheapest to compile, and tests/abca checks that every
    # implementation computes the same function.
    module = dataclasses.replace(cfg, implementation="reference").make(DM, H, rngs=nnx.Rngs(seed))
    x = jax.random.normal(jax.random.PRNGKey(seed + 1), (B, N, DM))
    tokens = jax.random.randint(jax.random.PRNGKey(seed + 2), (B, N), 0, VOCAB)
    init_cache, step = decoder_for(module)
    graphdef, state = nnx.split(module)

    @jax.jit
    def run(state, x, tokens):
        m = nnx.merge(graphdef, state)
        valid = jnp.asarray(VALID, jnp.int32)
        full = m(x, AttentionContext(valid_len=valid, tokens=tokens, causal=True)).y
        raw = _raw_anchors(m, x, tokens)
        is_anchor, _ = abca.enforce_zone_cap(raw, valid, cfg.max_zone)

        def body(cache, t):
            ctx = DecodeContext(pos=t, token=tokens[:, t], step=jnp.zeros((), jnp.int32))
            y, cache = step(m, jax.lax.dynamic_slice_in_dim(x, t, 1, axis=1), cache, ctx)
            return cache, (y[:, 0], cache.left == t)

        _, (ys, opened) = jax.lax.scan(body, init_cache(m, B, N, x.dtype), jnp.arange(N))
        return full, jnp.swapaxes(ys, 0, 1), jnp.swapaxes(opened, 0, 1), is_anchor, raw

    return module, jax.tree.map(np.asarray, run(state, x, tokens))


@pytest.mark.parametrize("name", sorted(CONFIGS))
def test_decode_matches_full_forward(name):
    cfg = CONFIGS[name]
    _, (full, dec, opened, is_anchor, raw) = _full_and_decoded(cfg)
    valid = np.arange(N)[None] < np.asarray(VALID)[:, None]
    # The decoder opens a zone exactly where the full pass has an anchor (placement + zone cap, online).
    np.testing.assert_array_equal(opened & valid, is_anchor)
    # The case is not trivial: several zones in each row, fallback anchors (zone cap hit), global overflow.
    k = is_anchor.sum(1)
    fallbacks = (is_anchor & ~raw)[:, 1:].sum()
    assert np.all(k >= 4) and fallbacks >= 2, (k, fallbacks)
    if cfg.handshake == "global":
        assert np.any(k > cfg.max_anchors), k
    assert np.all(np.isfinite(dec))
    np.testing.assert_allclose(np.where(valid[..., None], dec, 0.0), full, **TOL)


def test_cache_does_not_grow_with_context():
    """Bytes from the cache's shapes alone (no allocation): flat in max_len; at 64k with anchors every 256 the cache
    is far below 1/64 of a dense KV cache (2 * max_len * G * D values), for the chain and the global handshake and
    four summaries per anchor."""
    n = 65536
    cases = (("chain", {}), ("global", {"max_anchors": n // 256}), ("chain", {"summaries_per_anchor": 4}))
    for handshake, extra in cases:
        cfg = AnchorAttentionConfig(placement=FixedAnchors(interval=256), max_zone=256, handshake=handshake, **extra)
        module = cfg.make(256, 4, rngs=nnx.Rngs(0))

        def size(max_len, module=module):
            return abca_decode.cache_bytes(
                jax.eval_shape(lambda: abca_decode.init_cache(module, 1, max_len, jnp.float32)))

        assert size(1024) == size(n)
        dense = 2 * n * module.proj.num_kv_heads * module.proj.head_dim * 4
        assert size(n) * 64 <= dense, (handshake, size(n), dense)


def test_bad_inputs_name_the_problem():
    cfg = AnchorAttentionConfig(placement=ExplicitAnchors(), max_zone=4)  # anchors only from an anchor_mask
    module = cfg.make(DM, H, rngs=nnx.Rngs(0))
    with pytest.raises(ValueError, match="anchor_id"):
        abca_decode.init_cache(module, B, 8)
    cfg = AnchorAttentionConfig(placement=ExplicitAnchors(anchor_id=ANCHOR), max_zone=4)
    module = cfg.make(DM, H, rngs=nnx.Rngs(0))
    cache = abca_decode.init_cache(module, B, 8)
    ctx = DecodeContext(pos=jnp.int32(0), token=jnp.zeros((B,), jnp.int32), step=jnp.int32(0))
    with pytest.raises(ValueError, match=r"x \[B, 1, 32\]"):
        abca_decode.step(module, jnp.zeros((B, 2, DM)), cache, ctx)
    with pytest.raises(ValueError, match="batch"):
        abca_decode.step(module, jnp.zeros((B + 1, 1, DM)), cache, ctx)
    with pytest.raises(ValueError, match="ctx.token"):
        abca_decode.step(module, jnp.zeros((B, 1, DM)), cache, DecodeContext(ctx.pos, jnp.zeros((B, 1)), ctx.step))
    with pytest.raises(ValueError, match="ctx.pos"):
        abca_decode.step(module, jnp.zeros((B, 1, DM)), cache, DecodeContext(jnp.int32(-1), ctx.token, ctx.step))

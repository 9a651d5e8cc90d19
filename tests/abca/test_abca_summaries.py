"""Pooled writes (`summaries_per_anchor` P > 1, docs/abca.md): the core against its loop definition, every
implementation against the reference (outputs and gradients), padding and masked keys, the key count, and clear
refusals of bad options."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_attn.modules import AnchorAttentionConfig, FixedAnchors
from sparse_attn.modules.abca import AnchorAttention, AnchorProjections, abca_core
from sparse_attn.modules.abca.stats import abca_stats
from sparse_attn.modules.base import AttentionContext
from sparse_attn.patterns import abca
from tests.abca import oracles

B, N, D, MZ = 2, 24, 8, 6
VL = (24, 15)


def _setup(seed, heads=2, groups=2, summaries=3):
    rng = np.random.default_rng(seed)
    vl = jnp.asarray(VL, jnp.int32)
    is_anchor, _ = abca.enforce_zone_cap(jnp.asarray(rng.random((B, N)) < 0.2), vl, MZ)
    zones = abca.compute_zones(is_anchor, vl)
    ks = jax.random.split(jax.random.PRNGKey(seed), 7)
    q = jax.random.normal(ks[0], (B, N, heads, D))
    k, v = (jax.random.normal(kk, (B, N, groups, D)) for kk in ks[1:3])
    w = [0.4 * jax.random.normal(kk, (heads, D, D)) for kk in ks[3:6]]
    w.append(0.4 * jax.random.normal(ks[6], (summaries - 1, heads, D, D)))
    return zones, (q, k, v), w


def _core(zones, **kw):
    def f(q, k, v, wq, wk, wv, ws):
        proj = AnchorProjections(wq, wk, wv, rope_base=100.0)
        return abca_core(q, k, v, zones, proj, max_zone=MZ, summary_wq=ws, **kw)[0]

    return f


CASES = [  # (core options, heads, KV groups)
    ({"causal": True, "handshake": "chain", "handshake_steps": 1}, 2, 2),
    ({"causal": False, "handshake": "chain", "handshake_steps": 2}, 2, 2),
    ({"causal": True, "handshake": "global", "handshake_steps": 1, "max_anchors": 16}, 4, 2),
]


@pytest.mark.parametrize("case", range(len(CASES)))
def test_reference_matches_loop_definition(case):
    kw, heads, groups = CASES[case]
    zones, args, w = _setup(case, heads, groups)
    out = jax.jit(_core(zones, implementation="reference", **kw))(*args, *w)
    for b in range(B):
        want = oracles.abca_forward_summaries(
            *(np.asarray(x[b], np.float64) for x in args), np.asarray(zones.is_anchor[b]), VL[b],
            *(np.asarray(x, np.float64) for x in w), causal=kw["causal"], steps=kw["handshake_steps"],
            kind=kw["handshake"], max_anchors=kw.get("max_anchors"), rope_base=100.0,
        )  # fmt: skip
        np.testing.assert_allclose(out[b], want, atol=2e-5, rtol=2e-5)
    assert np.all(np.asarray(out[1, VL[1] :]) == 0)  # padding rows: 0, not NaN


@pytest.mark.parametrize("case,impl", [(0, "packed"), (1, "xla"), (2, "packed"), (0, "pallas")])
def test_implementations_match_reference(case, impl):
    kw, heads, groups = CASES[case]
    zones, args, w = _setup(case, heads, groups)
    ct = jax.random.normal(jax.random.PRNGKey(7), args[0].shape)
    ref, fast = _core(zones, implementation="reference", **kw), _core(zones, implementation=impl, **kw)
    np.testing.assert_allclose(jax.jit(fast)(*args, *w), jax.jit(ref)(*args, *w), atol=1e-5, rtol=1e-5)

    def loss(f):
        return lambda *a: jnp.sum(f(*a) * ct)

    g_ref = jax.jit(jax.grad(loss(ref), tuple(range(7))))(*args, *w)
    g_fast = jax.jit(jax.grad(loss(fast), tuple(range(7))))(*args, *w)
    for a, b in zip(g_fast, g_ref, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)
    assert float(jnp.max(jnp.abs(g_ref[-1]))) > 0  # the summaries' query maps learn


def test_padded_keys_get_exactly_zero_gradient_and_nan_stays_out():
    kw, heads, groups = CASES[0]
    zones, (q, k, v), w = _setup(0, heads, groups)
    bad = lambda x: x.at[1, VL[1] :].set(jnp.nan)  # noqa: E731
    f = _core(zones, implementation="packed", **kw)
    out = jax.jit(f)(bad(q), bad(k), bad(v), *w)
    assert np.all(np.isfinite(np.asarray(out[0]))) and np.all(np.isfinite(np.asarray(out[1, : VL[1]])))
    dk, dv = jax.jit(jax.grad(lambda k_, v_: jnp.sum(f(q, k_, v_, *w)), (0, 1)))(k, v)
    assert np.all(np.asarray(dk[1, VL[1] :]) == 0) and np.all(np.asarray(dv[1, VL[1] :]) == 0)


@pytest.mark.parametrize("causal", [True, False])
def test_key_count_matches_the_loop_masks(causal):
    """`keys_per_query` with P summaries: P times stages 1 and 2, stage 3's rows, and P - 1 more keys per anchor a
    row holds, counted from the oracle's masks."""
    zones, _, _ = _setup(3)
    p, total = 3, 0
    for b in range(B):
        is_anchor = np.asarray(zones.is_anchor[b])
        rows = oracles.layer_mask(is_anchor, VL[b], causal)
        anchors = oracles.anchor_list(is_anchor, VL[b])
        hs = oracles.handshake_mask(is_anchor, VL[b], causal)
        total += p * (rows[anchors].sum() + hs.sum())
        tokens = [t for t in range(VL[b]) if t not in anchors]
        total += rows[tokens].sum() + (p - 1) * rows[tokens][:, anchors].sum()
    st = abca_stats(zones, jnp.zeros((B,)), {}, causal=causal, handshake="chain", handshake_steps=1,
                    max_anchors=None, summaries_per_anchor=p)  # fmt: skip
    assert float(st["keys_per_query"]) == pytest.approx(total / sum(VL))


def test_layer_learns_its_summaries_and_refusals_are_clear():
    cfg = AnchorAttentionConfig(placement=FixedAnchors(interval=5), max_zone=5, summaries_per_anchor=3)
    layer = AnchorAttention(cfg, 16, 2, rngs=nnx.Rngs(0))
    assert layer.summary_wq.shape == (2, 2, 8, 8)
    x = jax.random.normal(jax.random.PRNGKey(1), (B, N, 16))
    ctx = AttentionContext(valid_len=jnp.asarray(VL, jnp.int32), step=jnp.int32(0), causal=True)
    grads = nnx.grad(lambda m: jnp.sum(m(x, ctx).y ** 2))(layer)
    assert float(jnp.max(jnp.abs(grads.summary_wq[...]))) > 0
    with pytest.raises(ValueError, match="summaries_per_anchor must be >= 1"):
        AnchorAttentionConfig(summaries_per_anchor=0)
    zones, (q, k, v), w = _setup(0)
    with pytest.raises(ValueError, match=r"summary_wq must be \[P - 1, H, D, D\]"):
        abca_core(q, k, v, zones, AnchorProjections(*w[:3]), max_zone=MZ, summary_wq=w[3][:, :, :4])

"""The ABCA core: every implementation against the loop definition of the three stages, and against each other."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparse_attn.modules.abca import AnchorProjections, abca_core
from sparse_attn.patterns import abca
from tests.abca import oracles

B, N, H, D, MZ = 2, 32, 2, 8, 6
VL = (32, 19)


def _setup(seed=0, density=0.2):
    rng = np.random.default_rng(seed)
    vl = jnp.asarray(VL, jnp.int32)
    is_anchor, _ = abca.enforce_zone_cap(jnp.asarray(rng.random((B, N)) < density), vl, MZ)
    zones = abca.compute_zones(is_anchor, vl)
    ks = jax.random.split(jax.random.PRNGKey(seed), 6)
    q, k, v = (jax.random.normal(kk, (B, N, H, D)) for kk in ks[:3])
    w = [0.4 * jax.random.normal(kk, (H, D, D)) for kk in ks[3:]]
    return zones, (q, k, v), w


def _core(zones, w, **kw):
    def f(q, k, v, wq, wk, wv):
        proj = AnchorProjections(wq, wk, wv, rope_base=100.0)
        return abca_core(q, k, v, zones, proj, max_zone=MZ, **kw)[0]

    return f


CONFIGS = [
    {"causal": False, "handshake": "chain", "handshake_steps": 1},
    {"causal": False, "handshake": "chain", "handshake_steps": 3},
    {"causal": True, "handshake": "chain", "handshake_steps": 3},
    {"causal": False, "handshake": "global", "handshake_steps": 2, "max_anchors": 4},  # overflow: chain for the rest
    {"causal": True, "handshake": "global", "handshake_steps": 1, "max_anchors": 32},
]


def _assert_reference_matches_loops(zones, args, w, kw):
    out = jax.jit(_core(zones, w, implementation="reference", **kw))(*args, *w)
    for b in range(B):
        want = oracles.abca_forward_gqa(
            *(np.asarray(x[b], np.float64) for x in args),
            np.asarray(zones.is_anchor[b]),
            VL[b],
            *(np.asarray(x, np.float64) for x in w),
            causal=kw["causal"],
            steps=kw["handshake_steps"],
            kind=kw["handshake"],
            max_anchors=kw.get("max_anchors"),
            rope_base=100.0,
        )
        np.testing.assert_allclose(out[b], want, atol=2e-5, rtol=2e-5)


@pytest.mark.parametrize("cfg", range(len(CONFIGS)))
def test_reference_matches_loop_definition(cfg):
    zones, args, w = _setup(cfg)
    _assert_reference_matches_loops(zones, args, w, CONFIGS[cfg])


# gqa: 4 query heads over 2 KV heads (`_setup_gqa`)
@pytest.mark.parametrize(
    "cfg,impl,gqa",
    [(0, "packed", False), (3, "packed", False), (4, "packed", False), (1, "xla", False), (2, "pallas", False)]
    + [(3, "pallas", False), (2, "packed", True), (3, "packed", True), (0, "pallas", True)],
)
def test_implementations_match_reference(cfg, impl, gqa):
    kw = CONFIGS[cfg]
    zones, args, w = _setup_gqa(cfg) if gqa else _setup(cfg)
    ct = jax.random.normal(jax.random.PRNGKey(7), args[0].shape)
    ref, fast = _core(zones, w, implementation="reference", **kw), _core(zones, w, implementation=impl, **kw)
    np.testing.assert_allclose(jax.jit(fast)(*args, *w), jax.jit(ref)(*args, *w), atol=1e-5, rtol=1e-5)

    def loss(f):
        return lambda *a: jnp.sum(f(*a) * ct)

    g_ref = jax.jit(jax.grad(loss(ref), tuple(range(6))))(*args, *w)
    g_fast = jax.jit(jax.grad(loss(fast), tuple(range(6))))(*args, *w)
    for a, b in zip(g_fast, g_ref, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


@pytest.mark.parametrize("causal", [True])  # bidirectional, many pages: CONFIGS[3] (global) in the test above
def test_xla_handshake_over_many_pages_matches_reference(causal):
    """Pages of 3 anchors: the chain crosses page edges through the halo, and pages past the last anchor are
    skipped."""
    zones, args, w = _setup(3, density=0.6)
    assert int(jnp.min(zones.num_anchors)) > 3 * 2
    kw = {"causal": causal, "handshake": "chain", "handshake_steps": 2, "max_anchors": 3}

    def fast(*a):
        return abca_core(*a[:3], zones, AnchorProjections(*a[3:], rope_base=100.0), max_zone=MZ, **kw)

    ref = _core(zones, w, implementation="reference", **kw)
    np.testing.assert_allclose(jax.jit(fast)(*args, *w)[0], jax.jit(ref)(*args, *w), atol=1e-5, rtol=1e-5)
    ct = jax.random.normal(jax.random.PRNGKey(3), args[0].shape)

    def loss(f):
        return lambda *a: jnp.sum((f(*a)[0] if f is fast else f(*a)) * ct)

    g_fast = jax.jit(jax.grad(loss(fast), tuple(range(6))))(*args, *w)
    g_ref = jax.jit(jax.grad(loss(ref), tuple(range(6))))(*args, *w)
    for a, b in zip(g_fast, g_ref, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def test_core_rejects_bad_input():
    zones, (q, k, v), w = _setup()
    proj = AnchorProjections(*w)
    with pytest.raises(ValueError, match=r"k, v \[B, N, G, D\]"):
        abca_core(q, k[..., :4], v[..., :4], zones, proj, max_zone=MZ)

    def three(x):  # 3 KV heads for H = 2 query heads
        return jnp.concatenate([x, x[:, :, :1]], axis=2)

    with pytest.raises(ValueError, match="multiple of KV heads"):
        abca_core(q, three(k), three(v), zones, proj, max_zone=MZ)
    with pytest.raises(ValueError, match="do not match"):
        abca_core(q[:, :16], k[:, :16], v[:, :16], zones, proj, max_zone=MZ)
    with pytest.raises(ValueError, match="max_zone"):
        abca_core(q, k, v, zones, proj, max_zone=0)
    with pytest.raises(ValueError, match="handshake_steps"):
        abca_core(q, k, v, zones, proj, max_zone=MZ, handshake_steps=0)
    with pytest.raises(ValueError, match="max_anchors"):
        abca_core(q, k, v, zones, proj, max_zone=MZ, handshake="global")
    with pytest.raises(ValueError, match="max_anchors"):
        abca_core(q, k, v, zones, proj, max_zone=MZ, max_anchors=0)  # chain: the handshake page size
    with pytest.raises(ValueError, match="implementation"):
        abca_core(q, k, v, zones, proj, max_zone=MZ, implementation="cuda")


@pytest.mark.parametrize("cfg", [1, 3])
def test_xla_bf16_close_to_fp32_reference(cfg):
    """bf16 q, k, v and anchor weights: the packed path accumulates in fp32 and stays within bf16 rounding."""
    kw = CONFIGS[cfg]
    zones, args, w = _setup(cfg)

    def bf(xs):
        return [x.astype(jnp.bfloat16) for x in xs]

    def up(xs):
        return [x.astype(jnp.float32) for x in xs]

    args16, w16 = bf(args), bf(w)
    ref = jax.jit(_core(zones, w, implementation="reference", **kw))(*up(args16), *up(w16))
    fast = _core(zones, w, implementation="packed", **kw)
    out = jax.jit(fast)(*args16, *w16)
    assert out.dtype == jnp.bfloat16
    # Anchor states round to bf16 between stages (up to 3 residual handshake steps, |state| up to ~10): measured max
    # error 0.078 for cfg 1, 0.026 for cfg 3, i.e. a few bf16 ulps (2^-8 relative) of the largest states.
    np.testing.assert_allclose(np.asarray(out, np.float32), ref, atol=6e-2, rtol=6e-2)
    grads = jax.jit(jax.grad(lambda *a: jnp.sum(fast(*a).astype(jnp.float32)), tuple(range(6))))(*args16, *w16)
    assert all(g.dtype == jnp.bfloat16 and bool(jnp.all(jnp.isfinite(g.astype(jnp.float32)))) for g in grads)


@pytest.mark.parametrize("seed", [3, 11, 25])
def test_xla_matches_reference_on_random_configurations(seed):
    """Random length, zone cap, anchor density, valid lengths (0 allowed), direction, handshake, steps and page
    size (max_anchors down to 1: many pages): outputs and all six gradients agree with the reference."""
    rng = np.random.default_rng(seed)
    n, mz = int(rng.integers(8, 48)), int(rng.integers(1, 10))
    vl = jnp.asarray([n, int(rng.integers(0, n + 1))], jnp.int32)
    is_anchor, _ = abca.enforce_zone_cap(jnp.asarray(rng.random((B, n)) < rng.uniform(0.05, 0.9)), vl, mz)
    zones = abca.compute_zones(is_anchor, vl)
    handshake = ["chain", "global"][int(rng.integers(2))]
    kw = {
        "causal": bool(rng.integers(2)),
        "handshake": handshake,
        "handshake_steps": int(rng.integers(1, 4)),
        "max_anchors": int(rng.integers(1, 6)) if handshake == "global" or rng.random() < 0.5 else None,
    }
    ks = jax.random.split(jax.random.PRNGKey(seed), 7)
    args = [jax.random.normal(kk, (B, n, H, D)) for kk in ks[:3]] + [
        0.4 * jax.random.normal(kk, (H, D, D)) for kk in ks[3:6]
    ]
    ct = jax.random.normal(ks[6], (B, n, H, D))

    def core(impl):
        def f(q, k, v, wq, wk, wv):
            proj = AnchorProjections(wq, wk, wv, rope_base=100.0)
            return abca_core(q, k, v, zones, proj, max_zone=mz, implementation=impl, **kw)[0]

        return f

    # One compilation per implementation: the output comes out of the same jitted pass as the six gradients.
    def out_and_grads(f):
        return jax.jit(jax.grad(lambda *a: (jnp.sum(f(*a) * ct), f(*a)), tuple(range(6)), has_aux=True))(*args)

    (g_fast, o_fast), (g_ref, o_ref) = out_and_grads(core("packed")), out_and_grads(core("reference"))
    np.testing.assert_allclose(o_fast, o_ref, atol=1e-5, rtol=1e-5)
    for a, b in zip(g_fast, g_ref, strict=True):
        np.testing.assert_allclose(a, b, atol=1e-4, rtol=1e-4)


def _setup_gqa(seed, heads=4, groups=2):
    zones, _, _ = _setup(seed)
    ks = jax.random.split(jax.random.PRNGKey(seed + 100), 6)
    q = jax.random.normal(ks[0], (B, N, heads, D))
    k, v = (jax.random.normal(kk, (B, N, groups, D)) for kk in ks[1:3])
    w = [0.4 * jax.random.normal(kk, (heads, D, D)) for kk in ks[3:]]
    return zones, (q, k, v), w


@pytest.mark.parametrize("cfg", [1, 3])
def test_gqa_reference_matches_loop_definition(cfg):
    """Grouped-query attention (4 query heads, 2 KV heads): an anchor's zone key/value per group re-projects the
    states of the group's heads (the numpy definition spells it out)."""
    zones, args, w = _setup_gqa(cfg)
    _assert_reference_matches_loops(zones, args, w, CONFIGS[cfg])

"""NoncrossingAttention: router == host simulation, gradients reach the router, padding, model integration."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_attn.models import TransformerClassifier, TransformerConfig
from sparse_attn.modules import DenseAttention
from sparse_attn.modules.base import AttentionContext
from sparse_attn.modules.noncrossing import NoncrossingAttentionConfig
from sparse_attn.modules.noncrossing.core import EdgeMLP, edge_mlp_attention
from sparse_attn.patterns.neighbours import NeighbourList
from sparse_attn.patterns.noncrossing import diagram_np as dn
from tests.noncrossing import tl_oracles

D, H, N = 32, 2, 12


def _x(b=2, n=N, seed=1):
    return jax.random.normal(jax.random.PRNGKey(seed), (b, n, D))


def _ctx(valid_len):
    return AttentionContext(valid_len=jnp.asarray(valid_len, jnp.int32))


def _gelu(x):  # jax.nn.gelu's default tanh form, written out in numpy
    return 0.5 * x * (1 + np.tanh(np.sqrt(2 / np.pi) * (x + 0.044715 * x**3)))


def _route_and_pattern(m, x, vl):
    """Jitted route + pattern, returned as numpy."""
    routed, nl = jax.jit(lambda x, vl: (lambda r: (r, m.pattern(r, vl)))(m.route(x, vl)))(x, vl)
    return jax.tree.map(np.asarray, routed), jax.tree.map(np.asarray, nl)


def _host_defect_pair_router(u, v, w, c, beta, limit, n, tau=0.0):
    """Independent host simulation of the defect-pair router (docs/noncrossing.md, "Routers"): defect lists, local
    max on the list, generators by walking cups."""
    p = dn.identity(n)
    cap_score = {}
    for t in range(u.shape[1]):
        defects = [a for a in range(n) if p[a] >= n]
        pairs = [(defects[j], defects[j + 1]) for j in range(len(defects) - 1) if defects[j + 1] < limit]
        s = [float(_gelu(u[a, t] + v[b, t] + c[t]) @ w[t] + beta[t]) for a, b in pairs]
        chosen = [
            pairs[j]
            for j in range(len(pairs))
            if s[j] > tau and (j == 0 or s[j] > s[j - 1]) and (j + 1 == len(pairs) or s[j] >= s[j + 1])
        ]
        cap_score.update({pr: sc for pr, sc in zip(pairs, s, strict=True) if pr in chosen})
        gens = [i for a, b in chosen for i in tl_oracles.pair_closing_generators(p, a, b)]
        for i in sorted(gens):
            dn.rmul_gen(p, i)
    return p, cap_score


@pytest.mark.parametrize("doubled", [False, True])
def test_defect_pair_router_equals_host_simulation(doubled):
    m = NoncrossingAttentionConfig(num_route_layers=3, doubled=doubled).make(D, H, rngs=nnx.Rngs(0))
    x, vl = _x(), np.array([N, 9])
    routed, nl = _route_and_pattern(m, x, jnp.asarray(vl))
    feats = m.scorer.half_point_features if doubled else m.scorer.features
    u, v = (np.asarray(a) for a in feats(x))
    w, c, beta = (np.asarray(a[...]) for a in (m.scorer.w, m.scorer.c, m.scorer.beta))
    pts = 2 * N if doubled else N
    for b in range(2):
        for h in range(H):
            limit = 2 * vl[b] if doubled else vl[b]
            want, cap_score = _host_defect_pair_router(u[b, h], v[b, h], w[h], c[h], beta[h], limit, pts)
            assert np.array_equal(routed["p"][b, h], want)
            assert not any(a >= limit or b2 >= limit for a, b2 in dn.caps(want))
            if not doubled:  # creator gate: a cap's slot bias is log σ(score of the pair that closed it)
                for (a, a2), sc in cap_score.items():
                    for q_, k_ in ((a, a2), (a2, a)):
                        np.testing.assert_allclose(nl.bias[b, h, q_, 1], -np.log1p(np.exp(-sc)), rtol=1e-5, atol=1e-6)
                        assert nl.idx[b, h, q_, 1] == k_


def test_key_rows_of_module_equal_coo_of_its_diagrams():
    m = NoncrossingAttentionConfig(num_route_layers=3).make(D, H, rngs=nnx.Rngs(2))
    x, vl = _x(), jnp.array([N, N])
    routed, nl = _route_and_pattern(m, x, vl)
    for b in range(2):
        for h in range(H):
            p = routed["p"][b, h]
            want = {(a, a) for a in range(N)} | {(a, b2) for a, b2 in dn.caps(p)} | {(b2, a) for a, b2 in dn.caps(p)}
            want |= {(a, b2) for a, b2 in dn.cups(p)} | {(b2, a) for a, b2 in dn.cups(p)}
            want |= {(a, b2) for a, b2 in dn.through_strands(p)} | {(b2, a) for a, b2 in dn.through_strands(p)}
            idx, valid = nl.idx[b, h], nl.valid[b, h]
            got = [(a, int(idx[a, s])) for a in range(N) for s in range(3) if valid[a, s]]
            assert len(got) == len(set(got)) and set(got) == want
            assert np.all(valid[:, 0] & (idx[:, 0] == np.arange(N)))  # rows never empty


@pytest.mark.parametrize(
    "cfg",
    [
        NoncrossingAttentionConfig(num_route_layers=2),
        NoncrossingAttentionConfig(router="adjacent_topk", rows="self_top", num_route_layers=2, num_kv_heads=1),
        NoncrossingAttentionConfig(doubled=True, edge_mlp_dim=8, num_route_layers=2, num_kv_heads=1),
    ],
    ids=["defect_pair", "adjacent_topk-self_top-gqa", "doubled-edge_mlp-gqa"],
)
def test_router_gradients_nonzero_and_finite(cfg):
    m = cfg.make(D, H, rngs=nnx.Rngs(3))
    x, ctx = _x(), _ctx([N, 10])

    def loss(m):
        return jnp.sum(m(x, ctx).y ** 2)

    g = nnx.jit(nnx.grad(loss))(m)
    for leaf in jax.tree.leaves(nnx.state(g)):
        assert np.all(np.isfinite(np.asarray(leaf)))
    assert float(jnp.sum(jnp.abs(g.scorer.proj.kernel[...]))) > 0
    assert float(jnp.sum(jnp.abs(g.scorer.w[...]))) > 0
    if cfg.edge_mlp_dim:
        assert float(jnp.sum(jnp.abs(g.edge_w1[...]))) > 0
    if cfg.doubled:
        assert float(jnp.sum(jnp.abs(g.scorer.side[...]))) > 0


def test_brick_wall_is_ring_local_and_has_no_router():
    m = NoncrossingAttentionConfig(router="brick_wall", num_route_layers=2).make(D, H, rngs=nnx.Rngs(4))
    assert m.scorer is None
    _, nl = _route_and_pattern(m, _x(), jnp.array([N, N]))
    got = {(a, int(nl.idx[0, 0, a, s])) for a in range(N) for s in range(3) if nl.valid[0, 0, a, s]}
    ring = {(a, (a + d) % N) for a in range(N) for d in (-1, 0, 1)}
    assert got == ring and nl.bias is None


def test_padding_never_reaches_valid_outputs():
    m = NoncrossingAttentionConfig(num_route_layers=2).make(D, H, rngs=nnx.Rngs(5))
    vl = 8
    x = _x(b=1)

    def valid_out(x):
        return m(x, _ctx([vl])).y[:, :vl]

    jac = jax.jit(jax.grad(lambda x: jnp.sum(valid_out(x) ** 2)))(x)
    assert np.all(np.asarray(jac[:, vl:]) == 0)
    assert float(jnp.abs(jac[:, :vl]).sum()) > 0


def test_through_only_ablation_gates_single_arc():
    m = NoncrossingAttentionConfig(rows="through", router="adjacent_topk", num_route_layers=2).make(D, H, rngs=nnx.Rngs(6))
    x, vl = _x(), jnp.array([N, N])
    routed, nl = _route_and_pattern(m, x, vl)
    assert nl.idx.shape[-1] == 1
    for b in range(2):
        for h in range(H):
            p = routed["p"][b, h]
            got = {(a, int(nl.idx[b, h, a, 0])) for a in range(N) if nl.valid[b, h, a, 0]}
            assert got == set(dn.through_strands(p))
    out = jax.jit(lambda x: m(x, _ctx([N, N])).y)(x)
    assert np.all(np.isfinite(np.asarray(out)))


def test_classifier_with_one_routing_layer_trains_one_step():
    cfg = TransformerConfig(
        vocab_size=11,
        model_dim=D,
        num_heads=H,
        num_layers=2,
        mlp_dim=64,
        attention=(DenseAttention(), NoncrossingAttentionConfig(num_route_layers=2)),
    )
    model = TransformerClassifier(cfg, rngs=nnx.Rngs(7))
    tokens = jax.random.randint(jax.random.PRNGKey(8), (2, N), 0, 11)

    def loss(model):
        out = model(tokens, valid_len=jnp.array([N, 7]))
        return jnp.mean(jax.nn.logsumexp(out.logits, -1) - out.logits[:, 0]), out.stats

    (val, st), g = nnx.jit(nnx.value_and_grad(loss, has_aux=True))(model)
    assert np.isfinite(float(val)) and "layer1/noncrossing/arcs" in st and "layer1/noncrossing/nesting_depth" in st
    assert 1.0 <= float(st["layer1/keys_per_query"]) <= 3.0  # self + at most two routed partners
    assert float(jnp.abs(g.blocks[1].attn.scorer.proj.kernel[...]).sum()) > 0


def test_causal_use_is_refused_with_a_clear_error():
    m = NoncrossingAttentionConfig(num_route_layers=1).make(D, H, rngs=nnx.Rngs(9))
    with pytest.raises(ValueError, match="bidirectional"):
        m(_x(b=1), AttentionContext(valid_len=jnp.array([N], jnp.int32), causal=True))


@pytest.mark.parametrize(
    "kw, msg",
    [
        (dict(router="foo"), "router"),
        (dict(rows="x"), "rows"),
        (dict(doubled=True, router="brick_wall"), "doubled"),
        (dict(topk_fraction=0.0), "topk_fraction"),
    ],
)
def test_config_validation(kw, msg):
    with pytest.raises(ValueError, match=msg):
        NoncrossingAttentionConfig(**kw)


def test_edge_mlp_attention_equals_dense_reference():
    m = NoncrossingAttentionConfig(num_route_layers=2, edge_mlp_dim=8, num_kv_heads=1).make(D, H, rngs=nnx.Rngs(10))
    x, vl = _x(), jnp.array([N, 9])
    q, k, v = m.proj.qkv(x)
    routed, nl = _route_and_pattern(m, x, vl)
    nl = NeighbourList(*(jnp.asarray(a) for a in (nl.idx, nl.valid, nl.bias)))
    edge = EdgeMLP(m.edge_w1[...], m.edge_w2[...])
    got = np.asarray(jax.jit(edge_mlp_attention)(q, k, v, nl, edge))
    w1, w2 = np.asarray(m.edge_w1[...]), np.asarray(m.edge_w2[...])
    dense_bias = np.asarray(nl.dense_bias())  # [B, H, N, N], -inf where not allowed
    q, k, v = (np.asarray(a, np.float64) for a in (q, k, v))
    for b in range(2):
        for h in range(H):
            qk = q[b, :, h, None, :] * k[b, None, :, 0, :]  # [N, N, D]; one KV head serves every query head
            s = _gelu(qk @ w1[h]) @ w2[h] + dense_bias[b, h]
            p = np.exp(s - s.max(-1, keepdims=True))
            p /= p.sum(-1, keepdims=True)
            np.testing.assert_allclose(got[b, :, h], p @ v[b, :, 0], rtol=2e-4, atol=2e-5)

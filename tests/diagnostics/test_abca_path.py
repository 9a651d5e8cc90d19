"""ABCA's information path (sparse_attn/diagnostics/abca.py): the dense maps rebuild the layer's own output, the
flow's rows sum to 1 and vanish off every route, and the hops of planted pairs (same zone, one zone back, beyond
one handshake step) are what the stages allow."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_attn.diagnostics.abca import abca_hops, abca_maps, layer_flow
from sparse_attn.modules import AnchorAttentionConfig, FixedAnchors
from sparse_attn.modules.abca import AnchorAttention
from sparse_attn.modules.base import AttentionContext

N, D, H = 24, 16, 2


def _layer(**kw):
    cfg = AnchorAttentionConfig(placement=FixedAnchors(interval=6), max_zone=6, implementation="reference", **kw)
    return AnchorAttention(cfg, D, H, rngs=nnx.Rngs(0))


def _ctx(causal=True):
    return AttentionContext(valid_len=jnp.array([N, N - 5], jnp.int32), step=jnp.int32(0), causal=causal)


X = jax.random.normal(jax.random.PRNGKey(3), (2, N, D))


@pytest.mark.parametrize("kw", [dict(), dict(handshake_steps=2), dict(handshake="global", max_anchors=8),
                                dict(num_kv_heads=1), dict(summaries_per_anchor=3, num_kv_heads=1),
                                dict(summaries_per_anchor=2, handshake="global", max_anchors=8)])  # fmt: skip
@pytest.mark.parametrize("causal", [True, False])
def test_maps_rebuild_the_layer(kw, causal):
    layer, ctx = _layer(**kw), _ctx(causal)
    maps = abca_maps(layer, X, ctx)
    y = layer(X, ctx).y
    live = (jnp.arange(N)[None] < ctx.valid_len[:, None])[..., None]
    rebuilt = jnp.where(live, layer.proj.out(maps.out.astype(X.dtype)), 0.0)
    np.testing.assert_allclose(rebuilt, y, atol=2e-5)


@pytest.mark.parametrize("summaries", [1, 2])
def test_flow_rows_sum_to_one_and_stay_on_routes(summaries):
    layer, ctx = _layer(summaries_per_anchor=summaries), _ctx()
    maps = abca_maps(layer, X, ctx)
    flow = np.asarray(layer_flow(maps))
    np.testing.assert_allclose(flow[0].sum(-1), 1.0, rtol=1e-5)
    np.testing.assert_allclose(flow[1, :, : N - 5].sum(-1), 1.0, rtol=1e-5)
    assert np.all(flow[:, :, np.triu_indices(N, 1)[0], np.triu_indices(N, 1)[1]] == 0)  # causal
    # anchors at 0, 6, 12, 18; one chain step: a query in zone (18, 24) reaches back to the zone (6, 12) and no
    # further: the anchor at 12 gathers [6, 12], the step brings it to the anchor at 18, which the query reads
    assert np.all(flow[0, :, 20, 7:12] > 0) and np.all(flow[0, :, 20, 1:6] == 0)


def test_hops_of_planted_pairs():
    layer, ctx = _layer(), _ctx()
    maps, uni = abca_maps(layer, X, ctx), abca_maps(layer, X, ctx, uniform=True)
    q_pos = jnp.array([[20, 20, 20]], jnp.int32)
    k_pos = jnp.array([[19, 9, 3]], jnp.int32)  # own zone; one zone back (one handshake hop); two zones back
    hops = {k: np.asarray(v)[0] for k, v in abca_hops(maps, q_pos, k_pos, uni).items()}
    direct, gather, handshake = hops["direct"], hops["gather"], hops["handshake"]
    assert np.all(direct[:, 0] > 0) and np.all(direct[:, 1:] == 0)
    # 9 and 3 have a later anchor that gathers them (12, 6); 19 lies after the last anchor (18): none
    assert np.all(gather[:, 1:] > 0) and np.all(gather[:, 0] == 0)
    # 12 -> 18 in one chain step; 6 -> 18 needs two; nothing carries 19
    assert np.all(handshake[:, 1] > 0) and np.all(handshake[:, [0, 2]] == 0)
    assert np.all(hops["flow"][:, :2] > 0) and np.all(hops["flow"][:, 2] == 0)
    # uniform attention: query 20 reads [18, 20] (3 keys), the anchor at 12 gathers [6, 12] (7 keys)
    np.testing.assert_allclose(hops["direct_uniform"][:, 0], 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(hops["to_anchor_uniform"][:, 0], 1 / 3, rtol=1e-6)
    np.testing.assert_allclose(hops["gather_uniform"][:, 1], 1 / 7, rtol=1e-6)
    # one chain step from 12 to 18: 0.5 (I + A), A uniform over {12, 18}
    np.testing.assert_allclose(hops["handshake_uniform"][:, 1], 0.25, rtol=1e-6)
    np.testing.assert_allclose(hops["flow_uniform"][:, 1], 1 / 3 * 0.25 * 1 / 7, rtol=1e-5)


def test_handshake_peak_is_the_sharpest_row_the_query_reads():
    layer, ctx = _layer(), _ctx()
    maps, uni = abca_maps(layer, X, ctx), abca_maps(layer, X, ctx, uniform=True)
    q_pos, k_pos = jnp.array([[20, 3]], jnp.int32), jnp.array([[9, 1]], jnp.int32)
    hops = {k: np.asarray(v)[0] for k, v in abca_hops(maps, q_pos, k_pos, uni).items()}
    # causal chain: the anchor at 18 (read by 20) has keys {12, 18}, the anchor at 0 (read by 3) only itself
    np.testing.assert_allclose(hops["handshake_peak_uniform"], [[0.5, 1.0]] * H, rtol=1e-6)
    w = np.asarray(maps.handshake[0])
    np.testing.assert_allclose(hops["handshake_peak"][:, 0], w[0, :, 18].max(-1), rtol=1e-6)
    # a handshake that puts all of every anchor's weight on itself: peak 1, and no flow from 12 reaches 18's row
    eye = jnp.broadcast_to(jnp.eye(N), w.shape) * maps.zones.is_anchor[:, None, :, None]
    hops = abca_hops(maps._replace(handshake=(eye,)), q_pos, k_pos)
    np.testing.assert_allclose(np.asarray(hops["handshake_peak"])[0], 1.0)
    np.testing.assert_allclose(np.asarray(hops["handshake"])[0, :, 0], 0.0, atol=1e-7)


def test_two_steps_reach_two_zones_back():
    layer, ctx = _layer(handshake_steps=2), _ctx()
    hops = abca_hops(abca_maps(layer, X, ctx), jnp.array([[20]]), jnp.array([[3]]))
    assert np.all(np.asarray(hops["handshake"])[0] > 0) and np.all(np.asarray(hops["flow"])[0] > 0)


def test_positions_out_of_range_refused():
    layer, ctx = _layer(), _ctx()
    maps = abca_maps(layer, X, ctx)
    with pytest.raises(ValueError, match="k_pos must lie in"):
        abca_hops(maps, jnp.array([[20]]), jnp.array([[N]]))


def test_pooled_writes_are_more_routes_of_the_same_anchors():
    """P = 2: a zone row reads each anchor it holds twice (two summaries); under uniform attention query 20 has
    keys 19, 20 and the anchor at 18's two summaries, and each summary carries 9 through its own gather."""
    layer, ctx = _layer(summaries_per_anchor=2), _ctx()
    maps, uni = abca_maps(layer, X, ctx), abca_maps(layer, X, ctx, uniform=True)
    assert len(maps.summaries) == 1
    q_pos, k_pos = jnp.array([[20, 20]], jnp.int32), jnp.array([[19, 9]], jnp.int32)
    hops = {k: np.asarray(v)[0] for k, v in abca_hops(maps, q_pos, k_pos, uni).items()}
    np.testing.assert_allclose(hops["direct_uniform"][:, 0], 1 / 4, rtol=1e-6)
    np.testing.assert_allclose(hops["to_anchor_uniform"][:, 0], 2 / 4, rtol=1e-6)
    # each summary: 1/4 (read) x 0.25 (one chain step 12 -> 18) x 1/7 (the anchor at 12 gathers [6, 12])
    np.testing.assert_allclose(hops["flow_uniform"][:, 1], 2 * (1 / 4 * 0.25 * 1 / 7), rtol=1e-5)
    # the trained weights differ between the summaries: the second gather query is its own
    assert not np.allclose(np.asarray(maps.gather), np.asarray(maps.summaries[0].gather))
    assert np.all(hops["flow"][:, 1] > 0)

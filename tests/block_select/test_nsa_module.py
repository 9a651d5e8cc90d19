"""The NSA module (sparse_attn/modules/nsa.py) against numpy transcriptions of the paper's rules: the compressed
branch against the entry point on the packed stream, the selection against the per-token rule (compressed
probabilities, summed over a GQA group, spread over selection blocks by overlap, top-n with forced initial and
local blocks), and the layer's causality, padding, executors and errors."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

import sparse_attn as sa
from sparse_attn.models import TransformerConfig, TransformerLM
from sparse_attn.modules import AttentionContext
from sparse_attn.modules.nsa import NsaAttentionConfig, compressed_attention, nsa_selection
from sparse_attn.patterns.block_select import layout_from_selection
from sparse_attn.patterns.compressed import compressed_counts, compressed_intervals, num_compressed
from sparse_attn.mechanisms.nsa import nsa_keys
from tests.lm_steps import two_train_steps

B, N, H, G, D = 2, 24, 4, 2, 8
VL = (N, 17)


def _cfg(**kw):
    base = dict(compress_block=4, compress_stride=2, select_block=4, top_n=3, sink_blocks=1, recent_blocks=0,
                window=3, query_block=1, causal=True, num_kv_heads=G)  # fmt: skip
    return NsaAttentionConfig(**{**base, **kw})


def _rand(seed, *shape):
    return jax.random.normal(jax.random.PRNGKey(seed), shape)


def _compressed(cfg, vl):
    m = num_compressed(N, cfg.compress_block, cfg.compress_stride)
    q, kc, vc = _rand(0, B, N, H, D), _rand(1, B, m, G, D), _rand(2, B, m, G, D)
    count = compressed_counts(N, cfg.compress_block, cfg.compress_stride, causal=cfg.causal, valid_len=vl)
    return q, kc, vc, count


def test_compressed_branch_equals_the_entry_point_on_the_packed_stream():
    cfg, vl = _cfg(), jnp.asarray(VL, jnp.int32)
    q, kc, vc, count = _compressed(cfg, vl)
    pad = lambda x: jnp.pad(x, ((0, 0), (0, N - x.shape[1]), (0, 0), (0, 0)))  # noqa: E731
    rule = compressed_intervals(N, cfg.compress_block, cfg.compress_stride, causal=True, valid_len=vl)
    w = _rand(3, B, N, H, D)

    def ours(q, kc, vc):
        return jnp.sum(compressed_attention(q, kc, vc, count)[0] * w)

    def reference(q, kc, vc):
        return jnp.sum(sa.attention(q, pad(kc), pad(vc), rule, implementation="reference") * w)

    o_ours, o_ref = compressed_attention(q, kc, vc, count)[0], sa.attention(q, pad(kc), pad(vc), rule,
                                                                           implementation="reference")  # fmt: skip
    np.testing.assert_allclose(o_ours, o_ref, atol=1e-5)
    grads_ours, grads_ref = jax.grad(ours, (0, 1, 2))(q, kc, vc), jax.grad(reference, (0, 1, 2))(q, kc, vc)
    for g_ours, g_ref in zip(grads_ours, grads_ref, strict=True):
        np.testing.assert_allclose(g_ours, g_ref[:, : g_ours.shape[1]], atol=5e-5)
    assert not np.any(np.asarray(o_ours)[count == 0])  # rows with no compressed token: 0


def paper_mask(p, cfg, valid_len):
    """bool[B, H, N, N] per query token: p_slc[j] = sum over the group's heads and compressed tokens c of
    overlap(c, j) p_cmp[c]; own block (up to the query), the first sink_blocks, the recent_blocks before the own
    one, then earlier blocks by descending p_slc (ties to the lower block) up to top_n; valid keys only."""
    p = np.asarray(p, np.float64)
    blk, d, bs = cfg.compress_block, cfg.compress_stride, cfg.select_block
    out = np.zeros((B, H, N, N), bool)
    for b in range(B):
        vl = valid_len[b]
        nkb = -(-vl // bs)
        for h in range(H):
            heads = range(h // (H // G) * (H // G), (h // (H // G) + 1) * (H // G))
            for i in range(vl):
                own = i // bs
                score = np.zeros(nkb)
                for c in range(p.shape[-1]):
                    keys = set(range(c * d, c * d + blk))
                    mass = sum(p[b, hh, i, c] for hh in heads)
                    for j in range(nkb):
                        score[j] += mass * len(keys & set(range(j * bs, j * bs + bs))) / blk
                forced = {own} | {j for j in range(own) if j < cfg.sink_blocks or own - j <= cfg.recent_blocks}
                rest = sorted((j for j in range(own) if j not in forced), key=lambda j: (-score[j], j))
                keep = forced | set(rest[: max(cfg.top_n - len(forced), 0)])
                for j in keep:
                    out[b, h, i, j * bs:min(j * bs + bs, vl, i + 1)] = True
    return out


@pytest.mark.parametrize("kw", [dict(), dict(top_n=9, recent_blocks=1), dict(sink_blocks=0, recent_blocks=1,
                                                                                compress_block=6, select_block=3)])
def test_per_token_selection_is_the_papers_rule(kw):
    cfg, vl = _cfg(**kw), jnp.asarray(VL, jnp.int32)
    q, kc, vc, count = _compressed(cfg, vl)
    kc = jnp.round(kc)  # integer keys: ties among the scores
    _, p = compressed_attention(q, kc, vc, count)
    sel = nsa_selection(p, N, cfg, G, causal=True, valid_len=vl)
    layout = layout_from_selection(sel, N, cfg.top_n, cfg.select_block, query_block=1, tile=1, causal=True,
                                   valid_len=vl)  # fmt: skip
    got = np.broadcast_to(np.asarray(layout.to_dense()), (B, H, N, N))
    np.testing.assert_array_equal(got, paper_mask(p, cfg, VL))


def _layer(cfg, seed=0):
    return cfg.make(16, H, rngs=nnx.Rngs(seed))


def test_layer_is_causal_and_padding_stays_out():
    cfg = _cfg(query_block=2, tile=2, recent_blocks=1)
    layer = _layer(cfg)
    x = _rand(4, B, N, 16)
    vl = jnp.asarray(VL, jnp.int32)
    ctx = AttentionContext(valid_len=vl, causal=True)
    y = layer(x, ctx).y
    x_late = x.at[:, 13:].add(_rand(5, B, N - 13, 16))  # change every token after position 12
    np.testing.assert_allclose(layer(x_late, ctx).y[:, :13], y[:, :13], atol=1e-5)
    x_nan = x.at[1, VL[1]:].set(jnp.nan)
    y_nan = layer(x_nan, ctx).y
    np.testing.assert_allclose(y_nan[1, : VL[1]], y[1, : VL[1]], atol=1e-5)
    empty = layer(x, AttentionContext(valid_len=jnp.asarray([N, 0], jnp.int32), causal=True)).y
    assert np.all(np.asarray(empty[1]) == 0)


def test_executors_agree_and_padded_keys_get_zero_gradient():
    x = _rand(6, B, N, 16)
    vl = jnp.asarray(VL, jnp.int32)
    ctx = AttentionContext(valid_len=vl, causal=True)
    w = _rand(7, B, N, 16) * (jnp.arange(N)[None, :, None] < vl[:, None, None])
    outs = {}
    for impl in ("reference", "xla", "pallas"):  # "pallas": the kernels in interpret mode on CPU
        layer = _layer(_cfg(query_block=4, tile=2, recent_blocks=1, implementation=impl))
        loss = lambda x, layer=layer: jnp.sum(layer(x, ctx).y * w)  # noqa: E731
        outs[impl] = (layer(x, ctx).y, jax.grad(loss)(x))
    for impl in ("xla", "pallas"):
        np.testing.assert_allclose(outs[impl][0], outs["reference"][0], atol=1e-5, err_msg=impl)
        np.testing.assert_allclose(outs[impl][1], outs["reference"][1], atol=5e-5, err_msg=impl)
        assert np.all(np.asarray(outs[impl][1][1, VL[1]:]) == 0), impl  # padding feeds no valid row


def test_lm_trains_and_keys_match_the_budget_formula():
    cfg = _cfg(query_block=4, tile=2, recent_blocks=1)
    model = TransformerLM(TransformerConfig(vocab_size=32, model_dim=16, num_heads=H, num_layers=1, mlp_dim=32,
                                            attention=(cfg,)), rngs=nnx.Rngs(0))  # fmt: skip
    tokens = jax.random.randint(jax.random.PRNGKey(8), (B, N + 1), 0, 32)
    loss0, loss1, stats = two_train_steps(model, tokens, lr=1e-2)
    assert np.isfinite(loss0) and loss1 < loss0
    # `mechanisms.nsa.nsa_keys` (closed form, the grids' budget matching) == what the layer measures
    assert float(stats["layer0/keys_per_query"]) == pytest.approx(nsa_keys(cfg, N), rel=1e-6)


@pytest.mark.parametrize("kw, match", [
    (dict(compress_stride=8), "compress_stride"), (dict(top_n=0), "top_n"), (dict(top_n=2, recent_blocks=1), "top_n"),
    (dict(query_block=3), "query_block"), (dict(window=-1), "window"),
])  # fmt: skip
def test_bad_config_names_the_argument(kw, match):
    with pytest.raises(ValueError, match=match):
        _cfg(**kw)


def test_gqa_mismatch_names_num_kv_heads():
    with pytest.raises(ValueError, match="num_kv_heads"):
        _cfg(num_kv_heads=3).make(16, H, rngs=nnx.Rngs(0))

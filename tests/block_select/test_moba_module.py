"""The MoBA module (sparse_attn/modules/moba.py) against a direct numpy transcription of the paper's gate: each query
scores every key block by q · mean(K_block), keeps its own block (causally) and the top-(k - 1) earlier blocks."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest
from flax import nnx

from sparse_attn.models import TransformerConfig, TransformerLM
from sparse_attn.modules import AttentionContext
from sparse_attn.modules.moba import MobaAttentionConfig, moba_layout, moba_selection, moba_stats
from sparse_attn.mechanisms.moba import moba_keys
from tests.lm_steps import two_train_steps

B, N, H, G, D = 2, 24, 4, 2, 8
BLOCK, TOP_K = 4, 3
VL = (N, 17)


def _qk(seed=0):
    kq, kk = jax.random.split(jax.random.PRNGKey(seed))
    return jax.random.normal(kq, (B, N, H, D)), jax.random.normal(kk, (B, N, G, D))


def paper_mask(q, k, valid_len):
    """bool[B, H, N, N], per query token: own block up to itself, plus the top-(k-1) complete earlier blocks by
    q_i · mean(valid keys of the block), ties to the lower block; padded queries and keys attend nothing."""
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    out = np.zeros((B, H, N, N), bool)
    for b in range(B):
        vl = valid_len[b]
        nkb = -(-vl // BLOCK)
        for h in range(H):
            kh = k[b, :, h // (H // G)]
            means = [kh[j * BLOCK:min((j + 1) * BLOCK, vl)].mean(0) for j in range(nkb)]
            for i in range(vl):
                own = i // BLOCK
                scores = [(-(q[b, i, h] @ means[j]), j) for j in range(own)]  # earlier blocks only
                keep = {own} | {j for _, j in sorted(scores)[: TOP_K - 1]}
                for j in keep:
                    lo, hi = j * BLOCK, min((j + 1) * BLOCK, vl)
                    out[b, h, i, lo:min(hi, i + 1)] = True
    return out


def test_per_token_gate_is_the_papers_rule():
    q, k = _qk()
    cfg = MobaAttentionConfig(block_size=BLOCK, top_k=TOP_K, query_block=1, causal=True)
    vl = jnp.asarray(VL, jnp.int32)
    sel = moba_selection(q, k, cfg, causal=True, valid_len=vl)
    dense = np.asarray(moba_layout(sel, N, cfg, causal=True, valid_len=vl).to_dense())
    np.testing.assert_array_equal(np.broadcast_to(dense, (B, H, N, N)), paper_mask(q, k, VL))
    keys = np.asarray(moba_stats(sel, N, cfg, causal=True, valid_len=vl)["keys_per_query"])
    want = paper_mask(q, k, VL).sum(-1)
    live = np.arange(N)[None, :] < np.asarray(VL)[:, None]
    assert keys == pytest.approx(want[np.broadcast_to(live[:, None], want.shape)].mean(), rel=1e-6)


@pytest.mark.parametrize("impl", ["xla", "pallas"])
def test_module_matches_the_reference_with_zero_gradient_to_masked_keys(impl):
    cfg = MobaAttentionConfig(block_size=BLOCK, top_k=2, causal=True, num_kv_heads=G, rope_base=None)
    x = jax.random.normal(jax.random.PRNGKey(3), (B, N, 32))

    def run(implementation):
        mod = MobaAttentionConfig(**{**cfg.__dict__, "implementation": implementation}).make(32, H, rngs=nnx.Rngs(0))
        ctx = AttentionContext(valid_len=jnp.asarray(VL, jnp.int32), causal=True)
        return jax.value_and_grad(lambda x: jnp.sum(mod(x, ctx).y[0] ** 2) + jnp.sum(mod(x, ctx).y[1, :VL[1]] ** 2))(x)

    (l1, g1), (l2, g2) = run(impl), run("reference")
    np.testing.assert_allclose(l1, l2, rtol=1e-5)
    np.testing.assert_allclose(g1, g2, atol=1e-5, rtol=1e-5)
    assert not np.asarray(g1[1, VL[1]:]).any()  # padded positions get exactly zero gradient


def test_module_trains_in_the_causal_lm():
    cfg = TransformerConfig(vocab_size=32, model_dim=32, num_heads=H, num_layers=1, mlp_dim=64,
                            attention=(MobaAttentionConfig(block_size=BLOCK, top_k=2),))
    model = TransformerLM(cfg, rngs=nnx.Rngs(0))
    tokens = jax.random.randint(jax.random.PRNGKey(1), (2, N + 1), 0, 32)
    loss0, loss1, stats = two_train_steps(model, tokens)
    assert np.isfinite(loss0) and loss1 < loss0
    assert 0 < float(stats["layer0/keys_per_query"]) <= BLOCK * 2


@pytest.mark.parametrize("kwargs,name", [
    (dict(top_k=0), "top_k"), (dict(block_size=6, query_block=4), "query_block"),
    (dict(block_size=0), "block_size"),
])
def test_bad_config_names_the_argument(kwargs, name):
    with pytest.raises(ValueError, match=name):
        MobaAttentionConfig(**kwargs)


def test_gqa_mismatch_names_num_kv_heads():
    with pytest.raises(ValueError, match="num_kv_heads"):
        MobaAttentionConfig(num_kv_heads=3).make(32, 4, rngs=nnx.Rngs(0))


def test_budget_count_equals_the_layout_on_full_sequences():
    """`mechanisms.moba.moba_keys` (closed form, the grids' budget matching) == keys of the layout the module runs."""
    q, k = _qk(5)
    for cfg in (MobaAttentionConfig(block_size=5, top_k=3, causal=True), MobaAttentionConfig(block_size=4, top_k=2)):
        sel = moba_selection(q, k, cfg, causal=True)
        dense = np.asarray(moba_layout(sel, N, cfg, causal=True).to_dense())
        assert dense.sum(-1).mean() == pytest.approx(moba_keys(cfg, N))

"""The retrieval diagnostics (sparse_attn/diagnostics/retrieval.py) on toys whose answer is known: a planted pair
the pattern excludes has recall 0, a hand-set attention gives the expected mass, and on random inputs the mass
equals a dense numpy softmax restricted to the pattern."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparse_attn import patterns
from sparse_attn.diagnostics import pair_attention_mass, pattern_recall
from sparse_attn.modules.moba import MobaAttentionConfig, moba_layout, moba_selection
from sparse_attn.patterns import abca

N = 16


def test_planted_pair_outside_the_window_has_recall_0():
    win = patterns.sliding_window(N, 2, causal=True)
    got = pattern_recall(win, jnp.array([[10, 10, 10, 3]]), jnp.array([[3, 9, 8, 10]]))
    np.testing.assert_array_equal(got[0, 0], [0, 1, 1, 0])  # 7 back: out of reach; later key: causal


def test_recall_reads_patterns_without_allowed_through_their_dense_oracle():
    zones = abca.compute_zones(abca.fixed_interval_anchors(1, N, 4))
    pat = abca.layer_intervals(zones, causal=True, max_zone=4)
    q, k = jnp.array([[9, 9]]), jnp.array([[8, 1]])
    dense = np.asarray(pat.to_dense())[0, 0]
    np.testing.assert_array_equal(pattern_recall(pat, q, k)[0, 0], [dense[9, 8], dense[9, 1]])


def test_uniform_queries_spread_their_mass_evenly():
    """q = 0: every allowed key gets 1 / (keys in the row); an excluded key gets 0."""
    win = patterns.sliding_window(N, 3, causal=True)
    q = jnp.zeros((1, N, 2, 4))
    k = jax.random.normal(jax.random.PRNGKey(0), (1, N, 1, 4))
    got = pair_attention_mass(q, k, win, jnp.array([[10, 10, 1]]), jnp.array([[7, 2, 0]]))
    np.testing.assert_allclose(got[0], [[0.25, 0.0, 0.5]] * 2, atol=1e-6)


def test_a_planted_match_gets_its_softmax_weight():
    """One key aligned with the query (logit 8), three others orthogonal (logit 0): mass e^8 / (e^8 + 3)."""
    win = patterns.sliding_window(N, 3, causal=True)
    q = jnp.zeros((1, N, 1, 4)).at[0, 10, 0, 0].set(16.0)  # scale 1/2: logit 8 against key 8
    k = jnp.zeros((1, N, 1, 4)).at[0, 8, 0, 0].set(1.0)
    got = pair_attention_mass(q, k, win, jnp.array([[10, 10]]), jnp.array([[8, 9]]))
    want = np.exp(8.0) / (np.exp(8.0) + 3)
    np.testing.assert_allclose(got[0, 0], [want, 1.0 / (np.exp(8.0) + 3)], rtol=1e-5)


def _dense_mass(q, k, mask, qp, kp):
    q, k = np.asarray(q, np.float64), np.asarray(k, np.float64)
    b, n, h, d = q.shape
    r = h // k.shape[2]
    out = np.zeros((b, h, qp.shape[1]))
    for bi in range(b):
        for hi in range(h):
            m = mask[min(bi, mask.shape[0] - 1), min(hi, mask.shape[1] - 1)]
            for p, (i, j) in enumerate(zip(qp[bi], kp[bi], strict=True)):
                if not m[i].any():
                    continue
                s = np.where(m[i], k[bi, :, hi // r] @ q[bi, i, hi] / np.sqrt(d), -np.inf)
                out[bi, hi, p] = np.exp(s[j] - np.logaddexp.reduce(s[m[i]])) if m[i, j] else 0.0
    return out


@pytest.mark.parametrize("kind", ["bigbird", "moba"])
def test_mass_equals_a_dense_softmax_over_the_pattern(kind):
    kq, kk, kp = jax.random.split(jax.random.PRNGKey(1), 3)
    q, k = jax.random.normal(kq, (2, N, 4, 8)), jax.random.normal(kk, (2, N, 2, 8))
    impl = None
    if kind == "bigbird":
        pat = patterns.bigbird(N, 2, 1, 1, 4, jax.random.PRNGKey(2), causal=True, valid_len=jnp.array([N, 11]))
    else:  # per-head random blocks: the "xla" executor refuses them
        impl = "reference"
        cfg = MobaAttentionConfig(block_size=4, top_k=2, causal=True)
        pat = moba_layout(moba_selection(q, k, cfg, causal=True), N, cfg, causal=True)
    qp = jax.random.randint(kp, (2, 12), 0, N)
    kp_ = jnp.maximum(qp - jax.random.randint(jax.random.PRNGKey(3), (2, 12), 0, 9), 0)
    got = pair_attention_mass(q, k, pat, qp, kp_, implementation=impl)
    want = _dense_mass(q, k, np.asarray(pat.to_dense()), np.asarray(qp), np.asarray(kp_))
    np.testing.assert_allclose(got, want, atol=1e-6)
    assert np.any(want > 0) and np.any(want == 0)  # both kinds of pair are in the draw


@pytest.mark.parametrize("q_pos, k_pos, match", [([[16]], [[0]], "q_pos"), ([[0]], [[-1]], "k_pos"),
                                                 ([[0, 1]], [[0]], "same number of pairs")])  # fmt: skip
def test_bad_positions_name_the_argument(q_pos, k_pos, match):
    with pytest.raises(ValueError, match=match):
        pattern_recall(patterns.sliding_window(N, 2), jnp.array(q_pos), jnp.array(k_pos))

"""Score functions against a float64 numpy oracle (the logits modified element-wise, then the masked softmax):
softcap, ALiBi and a learned T5 bias composed, outputs and gradients (the bias table's included) on every executor
that takes one, several pattern types; masked keys stay masked; bad input."""

import math

import jax
import jax.numpy as jnp
import numpy as np
import pytest

import sparse_attn as sa
from sparse_attn import patterns as P
from sparse_attn import score_fns as S

B, N, H, G, D = 2, 24, 4, 2, 8
CAP, BUCKETS, FAR = 4.0, 8, 16


def bucket64(rel):
    """T5's bucket in numpy: half the buckets per direction, exact below half of those, log-spaced up to FAR."""
    half = BUCKETS // 2
    out = np.where(rel > 0, half, 0)
    dist = np.abs(rel)
    exact = half // 2
    far = exact + (np.log(np.maximum(dist, 1) / exact) / math.log(FAR / exact) * (half - exact)).astype(np.int64)
    return out + np.where(dist < exact, dist, np.minimum(far, half - 1))


def oracle(q, k, v, mask_BxHxQxK, table, do):
    """(out, dq, dk, dv, dtable) in float64 for scores softcap(s + table[h, bucket(k - q)] - slope_h |q - k|)."""
    q, k, v, do, table = (np.asarray(x, np.float64) for x in (q, k, v, do, table))
    r = H // G
    kh, vh = np.repeat(k, r, axis=2), np.repeat(v, r, axis=2)
    i, j = np.arange(N)[:, None], np.arange(N)[None]
    slopes = np.asarray(S.alibi_slopes(H), np.float64)[:, None, None]
    bkt = bucket64(j - i)
    pre = np.einsum("bqhd,bkhd->bhqk", q, kh) / math.sqrt(D) + table[:, bkt][None] - slopes * np.abs(i - j)
    s = CAP * np.tanh(pre / CAP)
    m = np.broadcast_to(mask_BxHxQxK, s.shape)
    top = np.max(np.where(m, s, -np.inf), -1, keepdims=True)
    e = np.where(m, np.exp(s - np.where(np.isfinite(top), top, 0)), 0)
    z = e.sum(-1, keepdims=True)
    p = e / np.where(z > 0, z, 1)
    out = np.einsum("bhqk,bkhd->bqhd", p, vh)
    dp = np.einsum("bqhd,bkhd->bhqk", do, vh)
    ds = p * (dp - (p * dp).sum(-1, keepdims=True))
    dpre = ds * (1 - np.tanh(pre / CAP) ** 2)
    dq = np.einsum("bhqk,bkhd->bqhd", dpre, kh) / math.sqrt(D)
    group = lambda x: x.reshape(B, N, G, r, D).sum(3)  # noqa: E731
    dk = group(np.einsum("bhqk,bqhd->bkhd", dpre, q) / math.sqrt(D))
    dv = group(np.einsum("bhqk,bqhd->bkhd", p, do))
    dtable = np.zeros_like(table)
    for c in range(BUCKETS):
        dtable[:, c] = (dpre * (bkt == c)).sum((0, 2, 3))
    return out, dq, dk, dv, dtable


def score_fn(table):
    return S.compose(S.relative_position_bias(table, max_distance=FAR), S.alibi(S.alibi_slopes(H)), S.softcap(CAP))


VL = np.array([N, 17])


def neighbours():
    """Each query: itself, the key 3 back and key 0 (distinct valid slots)."""
    i = np.arange(N)
    idx = np.stack([i, np.maximum(i - 3, 0), np.zeros(N, int)], -1)[None, None]
    valid = np.stack([i >= 0, i - 3 >= 1, (i >= 1) & (i != 3)], -1)[None, None]
    return P.NeighbourList(jnp.asarray(idx, jnp.int32), jnp.asarray(valid))
PATTERNS = {
    "window_globals": lambda: P.longformer(N, 3, 2, valid_len=jnp.asarray(VL)),
    "block_layout": lambda: P.BlockLayout.from_intervals(P.sliding_window(N, 5, causal=True), 8, 8),
    "neighbours": lambda: neighbours(),
    "mask_fn": lambda: P.from_mask_fn(lambda b, h, q, k: (k <= q) & (k % 3 != 1), N, N, block_size=16),
}  # fmt: skip
CASES = [(name, impl) for name in sorted(PATTERNS) for impl in ("reference", "xla", "pallas")
         if (name, impl) != ("neighbours", "pallas")]  # fmt: skip  (neighbour lists have no kernel)


@pytest.mark.parametrize("name,impl", CASES)
def test_scores_and_gradients_match_the_float64_oracle(name, impl):
    """On "pallas" (the Triton kernels, interpret mode) a differentiated table takes the XLA backward; the kernels'
    own backward is checked with the table held fixed."""
    pattern = PATTERNS[name]()
    ks = jax.random.split(jax.random.key(7), 5)
    q = jax.random.normal(ks[0], (B, N, H, D)) * 2
    k, v = (jax.random.normal(x, (B, N, G, D)) for x in ks[1:3])
    do = jax.random.normal(ks[3], (B, N, H, D))
    table = jax.random.normal(ks[4], (H, BUCKETS))

    def run(q, k, v, table):
        return sa.attention(q, k, v, pattern, implementation=impl, score_fn=score_fn(table))

    out, vjp = jax.vjp(run, q, k, v, table)
    got = (out, *vjp(do))
    mask = np.asarray(pattern.to_dense())
    want = oracle(q, k, v, mask, table, do)
    for what, g, w in zip(("out", "dq", "dk", "dv", "dtable"), got, want, strict=True):
        np.testing.assert_allclose(np.asarray(g, np.float64), w, atol=2e-5, rtol=2e-5, err_msg=what)
    rows = ~mask.any(-1)  # [B|1, H|1, N]: no allowed key
    if rows.any():
        b, _, n = np.nonzero(rows)
        assert np.all(np.asarray(got[0])[b, n] == 0)
    dead = ~mask.any((1, 2))  # keys no query attends: exactly zero gradient
    if dead.any():
        b, n = np.nonzero(np.broadcast_to(dead, (B, N)))
        assert np.all(np.asarray(got[2])[b, n] == 0) and np.all(np.asarray(got[3])[b, n] == 0)
    if impl == "pallas":
        _, vjp = jax.vjp(lambda q, k, v: run(q, k, v, table), q, k, v)
        for what, g, w in zip(("dq", "dk", "dv"), vjp(do), want[1:4], strict=True):
            np.testing.assert_allclose(np.asarray(g, np.float64), w, atol=2e-5, rtol=2e-5, err_msg="kernel " + what)


def test_the_buckets_and_slopes_follow_their_definitions():
    rel = np.arange(-40, 41)
    np.testing.assert_array_equal(
        np.asarray(S.relative_position_bucket(jnp.asarray(rel), num_buckets=BUCKETS, max_distance=FAR)), bucket64(rel))
    np.testing.assert_allclose(S.alibi_slopes(8), 2.0 ** (-np.arange(1, 9)), rtol=1e-6)
    np.testing.assert_allclose(S.alibi_slopes(6), [2 ** -2, 2 ** -4, 2 ** -6, 2 ** -8, 2 ** -1, 2 ** -3], rtol=1e-6)


def test_none_picks_an_executor_that_applies_scores_and_bad_input_is_refused():
    from sparse_attn.executors import registry

    pattern = P.causal(N)
    assert registry.takes_scores(type(pattern), sa.resolve_implementation(pattern))
    q = jnp.ones((1, N, 2, D))
    with pytest.raises(ValueError, match="one float score per"):
        sa.attention(q, q, q, pattern, score_fn=lambda s, b, h, i, j: jnp.zeros(3))
    with pytest.raises(ValueError, match="one float score per"):
        sa.attention(q, q, q, pattern, score_fn=lambda s, b, h, i, j: i)
    with pytest.raises(ValueError, match="could not be traced"):
        sa.attention(q, q, q, pattern, score_fn=lambda s: s)
    with pytest.raises(ValueError, match="logits' shape"):  # scalar-consistent, but ignores the broadcast shape
        sa.attention(q, q, q, pattern, implementation="xla", score_fn=lambda s, b, h, i, j: jnp.sum(s))
    with pytest.raises(ValueError, match="cap must be"):
        S.softcap(0)
    with pytest.raises(ValueError, match="table must be"):
        S.relative_position_bias(jnp.ones(8))


@pytest.mark.parametrize("platform", ["cuda", "tpu"])
def test_mask_and_score_functions_lower_for_accelerators(platform):
    """A document mask built from traced ids inside the function, a learned T5 bias and a softcap, forward and
    backward (the bias table's gradient included), exported for a GPU and a TPU without the hardware."""
    from sparse_attn.patterns.mask_fns import and_masks, causal_mask, document_mask

    def loss_and_grads(q, k, v, ids, table):
        def loss(q, k, v, table):
            pattern = P.from_mask_fn(and_masks(causal_mask, document_mask(ids)), N, N, batch=B, block_size=8,
                                     capacity=(3, 3))
            out = sa.attention(q, k, v, pattern, score_fn=score_fn(table))
            return jnp.sum(out.astype(jnp.float32))

        return jax.value_and_grad(loss, argnums=(0, 1, 2, 3))(q, k, v, table)

    sds = jax.ShapeDtypeStruct
    args = (sds((B, N, H, D), jnp.bfloat16), sds((B, N, G, D), jnp.bfloat16), sds((B, N, G, D), jnp.bfloat16),
            sds((B, N), jnp.int32), sds((H, BUCKETS), jnp.float32))
    exported = jax.export.export(jax.jit(loss_and_grads), platforms=[platform])(*args)
    assert exported.platforms == (platform,) and len(exported.out_avals) == 5

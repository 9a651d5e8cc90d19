"""Pattern builders against brute-force definitions; validation; pytree behaviour; statistics."""

import jax
import jax.numpy as jnp
import numpy as np
import pytest

from sparse_attn import patterns as P

N = 40


def brute(n, rule, valid_len=None):
    m = np.zeros((n, n), bool)
    vl = n if valid_len is None else valid_len
    for i in range(vl):
        for j in range(vl):
            m[i, j] = rule(i, j)
    return m


def test_dense_causal_window_match_definitions():
    np.testing.assert_array_equal(P.dense(N).to_dense()[0, 0], brute(N, lambda i, j: True))
    np.testing.assert_array_equal(P.causal(N).to_dense()[0, 0], brute(N, lambda i, j: j <= i))
    np.testing.assert_array_equal(P.sliding_window(N, 3).to_dense()[0, 0], brute(N, lambda i, j: abs(i - j) <= 3))
    np.testing.assert_array_equal(
        P.sliding_window(N, 3, causal=True).to_dense()[0, 0], brute(N, lambda i, j: 0 <= i - j <= 3)
    )


def test_padding_is_honoured_by_every_builder():
    vl = jnp.array([N, 25])
    key = jax.random.PRNGKey(0)
    built = [
        P.dense(N, valid_len=vl),
        P.causal(N, valid_len=vl),
        P.sliding_window(N, 4, valid_len=vl),
        P.longformer(N, 4, 2, valid_len=vl),
        P.bigbird(N, 4, 2, 1, 8, key, valid_len=vl, batch=2),
        P.document_mask(jnp.zeros((2, N), jnp.int32), valid_len=vl),
    ]
    for p in built:
        m = np.asarray(jnp.broadcast_to(p.to_dense(), (2, 1, N, N)))[1, 0]
        assert not m[25:].any() and not m[:, 25:].any(), type(p)
        assert m[:25, :25].any()


def test_longformer_matches_definition():
    got = P.longformer(N, 2, 3).to_dense()[0, 0]
    want = brute(N, lambda i, j: abs(i - j) <= 2 or i < 3 or j < 3)
    np.testing.assert_array_equal(got, want)
    got = P.longformer(N, 2, 3, causal=True).to_dense()[0, 0]
    want = brute(N, lambda i, j: j <= i and (i - j <= 2 or i < 3 or j < 3))
    np.testing.assert_array_equal(got, want)


def test_bigbird_matches_definition_and_depends_only_on_key():
    key = jax.random.PRNGKey(3)
    p = P.bigbird(N, 2, 1, 2, 8, key)
    rb = np.asarray(p.random_blocks[0, 0])
    assert (rb.sum(-1) == 2).all()
    want = brute(N, lambda i, j: abs(i - j) <= 2 or i < 1 or j < 1 or rb[i // 8, j // 8])
    np.testing.assert_array_equal(p.to_dense()[0, 0], want)
    again = P.bigbird(N, 2, 1, 2, 8, key)
    np.testing.assert_array_equal(again.random_blocks, p.random_blocks)
    other = P.bigbird(N, 2, 1, 2, 8, jax.random.PRNGKey(4))
    assert not np.array_equal(other.random_blocks, p.random_blocks)


def test_document_mask_matches_definition():
    seg = np.array([0] * 10 + [1] * 20 + [2] * 10)
    got = P.document_mask(jnp.asarray(seg)[None], causal=True, radius=5).to_dense()[0, 0]
    want = brute(N, lambda i, j: seg[i] == seg[j] and 0 <= i - j <= 5)
    np.testing.assert_array_equal(got, want)
    got = P.document_mask(jnp.asarray(seg)[None]).to_dense()[0, 0]
    np.testing.assert_array_equal(got, brute(N, lambda i, j: seg[i] == seg[j]))


def test_label_bits_and_neighbour_list_dense():
    bits = jnp.asarray(np.random.default_rng(0).integers(0, 4, (1, 1, N, 1)), jnp.uint32)
    p = P.Intervals(P.dense(N).lo, P.dense(N).hi, label_bits=bits)
    b = np.asarray(bits[0, 0, :, 0])
    np.testing.assert_array_equal(p.to_dense()[0, 0], brute(N, lambda i, j: (b[i] & b[j]) != 0))
    idx = jnp.asarray([[[[i, (i + 3) % N, 0] for i in range(N)]]], jnp.int32)
    valid = jnp.asarray([[[[True, True, i % 2 == 0 and i != 0] for i in range(N)]]])
    nl = P.NeighbourList(idx, valid).validate()
    want = brute(N, lambda i, j: j == i or j == (i + 3) % N or (j == 0 and i % 2 == 0))
    np.testing.assert_array_equal(nl.to_dense()[0, 0], want)


def test_block_layout_lists_cover_exactly_the_nonempty_blocks():
    p = P.bigbird(64, 5, 1, 1, 8, jax.random.PRNGKey(0))
    lay = P.BlockLayout.from_intervals(p.mask, 8, 8, random_blocks=p.random_blocks)
    dense = np.asarray(p.to_dense()[0, 0]).reshape(8, 8, 8, 8).transpose(0, 2, 1, 3)
    blocks_any, blocks_all = dense.any((2, 3)), dense.all((2, 3))
    part = np.zeros((8, 8), bool)
    full = np.zeros((8, 8), bool)
    for qb in range(8):
        part[qb, lay.kv_idx[0, 0, qb, : lay.kv_count[0, 0, qb]]] = True
        full[qb, lay.full_idx[0, 0, qb, : lay.full_count[0, 0, qb]]] = True
    assert not (part & full).any()
    np.testing.assert_array_equal(blocks_any & ~(part | full), np.zeros_like(part))  # nothing allowed is missed
    assert (blocks_all[full]).all()  # full blocks need no mask
    tpart = np.zeros((8, 8), bool)
    for kb in range(8):
        tpart[lay.q_idx[0, 0, kb, : lay.q_count[0, 0, kb]], kb] = True
    np.testing.assert_array_equal(tpart, part)
    assert int(lay.overflow) == 0
    small = P.BlockLayout.from_intervals(p.mask, 8, 8, random_blocks=p.random_blocks, capacity=2)
    assert int(small.overflow) > 0
    with pytest.raises(ValueError, match="exceed the list capacity"):
        small.validate()


def test_patterns_are_pytrees_under_jit_and_vmap():
    @jax.jit
    def build(vl):
        return P.sliding_window(N, 3, valid_len=vl).to_dense()

    np.testing.assert_array_equal(build(jnp.array([N]))[0, 0], P.sliding_window(N, 3).to_dense()[0, 0])
    p = P.longformer(N, 2, 1)
    leaves, tree = jax.tree_util.tree_flatten(p)
    assert jax.tree_util.tree_unflatten(tree, leaves).max_global == 1
    per_batch = jax.vmap(lambda r: P.sliding_window(N, 3).hi + r)(jnp.arange(2))
    assert per_batch.shape == (2, 1, 1, N)


def test_per_head_patterns_broadcast():
    lo = jnp.stack([P.sliding_window(N, 1).lo, P.sliding_window(N, 5).lo], axis=1)[:, :, 0]
    hi = jnp.stack([P.sliding_window(N, 1).hi, P.sliding_window(N, 5).hi], axis=1)[:, :, 0]
    p = P.Intervals(lo, hi, reach=(5, 5)).validate(batch=3, heads=2)
    d = p.to_dense()
    assert d.shape == (1, 2, N, N)
    assert int(d[0, 0].sum()) < int(d[0, 1].sum())


@pytest.mark.parametrize(
    "make, match",
    [
        (lambda: P.Intervals(jnp.zeros((1, 1, 4), jnp.float32), jnp.zeros((1, 1, 4), jnp.int32)), "integer dtype"),
        (lambda: P.Intervals(jnp.zeros((1, 4), jnp.int32), jnp.zeros((1, 4), jnp.int32)), "rank 3"),
        (lambda: P.Intervals(jnp.zeros((1, 1, 4), jnp.int32), jnp.full((1, 1, 4), 4, jnp.int32)), "outside"),
        (lambda: P.Intervals(jnp.zeros((1, 1, 4), jnp.int32), jnp.full((1, 1, 4), 3, jnp.int32), reach=(0, 0)),
         "reach"),
        (lambda: P.NeighbourList(jnp.full((1, 1, 4, 2), 7, jnp.int32), jnp.ones((1, 1, 4, 2), bool)), "outside"),
        (lambda: P.NeighbourList(jnp.zeros((1, 1, 4, 2), jnp.int32), jnp.ones((1, 1, 4, 2), bool)), "twice"),
        (lambda: P.NeighbourList(jnp.zeros((1, 1, 4, 2), jnp.int32), jnp.ones((1, 1, 4, 3), bool)), "valid"),
        (lambda: P.sliding_window(8, -1), "radius"),
        (lambda: P.dense(8, valid_len=jnp.array([9])), "valid_len"),
        (lambda: P.longformer(8, 2, 9), "global tokens"),
        (lambda: P.document_mask(jnp.array([[1, 0, 0]])), "non-decreasing"),
    ],
)
def test_bad_input_raises_clear_errors(make, match):
    with pytest.raises(ValueError, match=match):
        make().validate()


def test_batch_and_head_axes_are_checked():
    with pytest.raises(ValueError, match="batch axis"):
        P.dense(8, valid_len=jnp.array([8, 8, 8])).validate(batch=2)


def test_stats_match_brute_force():
    vl = jnp.array([30])
    p = P.longformer(N, 3, 2, causal=True, valid_len=vl)
    m = np.asarray(p.to_dense()[0, 0])
    st = P.pattern_stats(p, head_dim=16, heads=4)
    assert float(st["pairs"]) == m.sum() * 4
    assert int(st["max_keys"]) == m.sum(-1).max()
    off = m & ~np.eye(N, dtype=bool)
    lonely = ((off.sum(-1) == 0) & (np.arange(N) < 30)).sum() * 4
    assert int(st["lonely_queries"]) == lonely
    assert float(st["flops"]) == 4 * m.sum() * 4 * 16

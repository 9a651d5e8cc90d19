"""The allowed sets of docs/labels.md: bitmasks, buckets, candidates, P_share, the dense oracle."""

import math

import jax
import jax.numpy as jnp
import label_oracles as oracles
import numpy as np
import pytest

from sparse_attn.patterns.labels import bits as B
from sparse_attn.patterns.labels import buckets, candidates, stats
from sparse_attn.patterns.labels.base_graph import BaseGraph
from sparse_attn.patterns.labels.pattern import LabelPattern


@pytest.mark.parametrize("d", [5, 32, 33, 64])
def test_bitmask_and_equals_boolean_product(d):
    rng = np.random.default_rng(d)
    z = rng.random((40, d)) < 0.15
    m = B.pack_memberships(jnp.asarray(z))
    assert m.dtype == jnp.uint32 and m.shape == (40, 1 if d <= 32 else 2)
    zz = z.astype(np.int64) @ z.T.astype(np.int64)
    np.testing.assert_array_equal(np.asarray(B.shares(m[:, None], m[None])), zz > 0)
    np.testing.assert_array_equal(np.asarray(B.shared_count(m[:, None], m[None])), zz)
    np.testing.assert_array_equal(np.asarray(B.memberships_from_bits(m, d)), z)
    low = np.where(zz > 0, np.argmax(z[:, None, :] & z[None, :, :], axis=-1), B.NO_LABEL)
    np.testing.assert_array_equal(np.asarray(B.lowest_shared(m[:, None], m[None])), low)


def test_top_k_packing_and_below_masks():
    r = jax.random.normal(jax.random.PRNGKey(0), (30, 64))
    lab = B.top_k_labels(r, 3)
    z = np.zeros((30, 64), bool)
    np.put_along_axis(z, np.argsort(-np.asarray(r), axis=1)[:, :3], True, axis=1)
    np.testing.assert_array_equal(np.asarray(B.pack_labels(lab, 64)), np.asarray(B.pack_memberships(jnp.asarray(z))))
    assert np.all(np.diff(np.asarray(lab), axis=1) > 0)
    m = B.pack_labels(lab, 64)
    for label in (0, 5, 31, 32, 40, 63):
        below = B.memberships_from_bits(B.bits_below(m, jnp.full((30,), label)), 64)
        np.testing.assert_array_equal(np.asarray(below), z & (np.arange(64) < label))


@pytest.mark.parametrize("d,k", [(65, 2), (0, 1), (8, 9), (8, 0)])
def test_clear_errors_for_bad_label_counts(d, k):
    with pytest.raises(ValueError, match="num_labels|top_k"):
        B.check_labels(d, k)
    if 1 <= d <= 64:
        with pytest.raises(ValueError, match="top_k"):
            B.top_k_labels(jnp.zeros((4, d)), k)


@pytest.mark.parametrize("d,k", [(32, 2), (32, 4), (64, 8)])
def test_p_share_formula_against_monte_carlo(d, k):
    rng = np.random.default_rng(k)
    draws = 40_000
    a = np.argsort(rng.random((draws, d)), axis=1) < k  # a uniform k-subset as a boolean row
    b = np.argsort(rng.random((draws, d)), axis=1) < k
    hit = np.mean(np.any(a & b, axis=1))
    ps = stats.p_share(d, k)
    assert abs(hit - ps) < 4 * math.sqrt(ps * (1 - ps) / draws)


@pytest.mark.parametrize("causal", [False, True])
def test_bucket_candidates_equal_the_filter_and_count_raw_pairs(causal):
    rng = np.random.default_rng(3)
    n, d, k = 60, 6, 3  # many multi-label overlaps, so dedup matters
    labels = np.sort(np.argsort(rng.random((n, d)), axis=1)[:, :k], axis=1)
    base = BaseGraph(radius=7, landmark_every=16, causal=causal)
    pairs, raw = candidates.bucket_candidates(labels, d, base, valid_len=55)
    filt = candidates.filter_candidates(labels, base, valid_len=55)
    np.testing.assert_array_equal(pairs, filt)
    assert len(np.unique(pairs, axis=0)) == len(pairs)  # no duplicates
    z = oracles.z_from_labels(labels, d)
    h = oracles.base_graph(n, 7, 16, causal, 55) & ~np.eye(n, dtype=bool)
    assert raw == int(np.sum(np.where(h, z.astype(int) @ z.T.astype(int), 0)))
    assert raw > len(pairs)
    dense = oracles.hard_mask(z, h)
    np.testing.assert_array_equal(np.argwhere(dense), pairs)
    members = candidates.inverted_buckets(labels, d, 55)
    for i, mem in enumerate(members):
        np.testing.assert_array_equal(mem, np.flatnonzero(z[:55, i]))


def test_bucket_layout_ranges_are_windows_inside_buckets():
    n, d, k, vl = 50, 5, 2, 44
    labels = B.top_k_labels(jax.random.normal(jax.random.PRNGKey(2), (n, d)), k)
    base = BaseGraph(radius=6)
    lay = buckets.bucket_layout(labels, d, base, jnp.int32(vl))
    tok, lo, hi = (np.asarray(x) for x in (lay.token_E, lay.lo_E, lay.hi_E))
    lab = np.asarray(labels)
    entry_label = np.array([lab[t][np.asarray(lay.entry_NxK)[t] == e][0] for e, t in enumerate(tok)])
    for e, u in enumerate(tok):
        if u >= vl:
            assert lo[e] > hi[e]
            continue
        want = [f for f in range(len(tok)) if entry_label[f] == entry_label[e] and abs(tok[f] - u) <= 6 and tok[f] < vl]
        assert list(range(lo[e], hi[e] + 1)) == want
    np.testing.assert_array_equal(np.asarray(lay.sizes_L), np.bincount(lab[:vl].ravel(), minlength=d))
    np.testing.assert_array_equal(np.asarray(lay.sizes_L), np.asarray(buckets.bucket_sizes(labels, d, vl)))


@pytest.mark.parametrize("causal", [False, True])
def test_label_pattern_matches_the_spec_definition(causal):
    n, d = 48, 8
    labels = B.top_k_labels(jax.random.normal(jax.random.PRNGKey(4), (2, 1, n, d)), 2)
    vl = jnp.asarray([n, 37])
    base = BaseGraph(radius=5, landmark_every=12, causal=causal)
    dense = np.asarray(LabelPattern(B.pack_labels(labels, d), vl, base).validate(batch=2, heads=4).to_dense())
    for b in range(2):
        z = oracles.z_from_labels(np.asarray(labels[b, 0]), d)
        h = oracles.base_graph(n, 5, 12, causal, int(vl[b]))
        np.testing.assert_array_equal(dense[b, 0], oracles.hard_mask(z, h))
        np.testing.assert_array_equal(np.asarray(base.dense(n, vl))[b], h)
    with pytest.raises(ValueError, match="bits"):
        LabelPattern(jnp.zeros((1, 1, n), jnp.uint32), None, base).validate()
    with pytest.raises(ValueError, match="radius"):
        BaseGraph(radius=-1)

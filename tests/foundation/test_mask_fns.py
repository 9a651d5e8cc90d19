"""Ready-made mask functions against independent numpy masks, and against the pattern builders they equal."""

import numpy as np
import pytest

from sparse_attn import patterns
from sparse_attn.patterns import mask_fns as M

RNG = np.random.default_rng(0)


def _np_mask(rule, b, n):
    """bool[b, 1, n, n] from a Python rule(b, q, k), written without the library."""
    out = np.zeros((b, 1, n, n), bool)
    for bi in range(b):
        for q in range(n):
            for k in range(n):
                out[bi, 0, q, k] = rule(bi, q, k)
    return out


def _packed_ids(b, n):
    return np.sort(RNG.integers(0, 4, (b, n)), axis=1).astype(np.int32)


@pytest.mark.parametrize("n", [1, 7, 19])
def test_each_predicate_matches_its_numpy_rule(n):
    b, r, chunk, dil = 2, 3, 4, 2
    seg = RNG.integers(0, 3, (b, n)).astype(np.int32)  # any ids, not only contiguous runs
    prefix = np.array([0, min(5, n)], np.int32)
    cases = [
        (M.causal_mask, lambda bi, q, k: k <= q),
        (M.sliding_window_mask(r), lambda bi, q, k: abs(q - k) <= r),
        (M.document_mask(seg), lambda bi, q, k: seg[bi, q] == seg[bi, k]),
        (M.prefix_lm_mask(prefix), lambda bi, q, k: k <= q or k < prefix[bi]),
        (M.chunked_mask(chunk), lambda bi, q, k: q // chunk == k // chunk),
        (M.dilated_mask(dil, r), lambda bi, q, k: (q - k) % dil == 0 and abs(q - k) <= r * dil),
        (M.and_masks(M.causal_mask, M.chunked_mask(chunk)), lambda bi, q, k: k <= q and q // chunk == k // chunk),
        (M.or_masks(M.sliding_window_mask(1), M.document_mask(seg)),
         lambda bi, q, k: abs(q - k) <= 1 or seg[bi, q] == seg[bi, k]),
    ]
    for fn, rule in cases:
        np.testing.assert_array_equal(np.asarray(M.evaluate(fn, b, 1, n, n)), _np_mask(rule, b, n))


@pytest.mark.parametrize("n, radius", [(1, 0), (9, 2), (33, 5), (16, 40)])
def test_predicates_equal_the_pattern_builders(n, radius):
    def dense(pattern):  # [B|1, 1, N, N]
        return np.asarray(pattern.to_dense())[:, :1]

    def mask(fn, b=1):
        return np.asarray(M.evaluate(fn, b, 1, n, n))

    np.testing.assert_array_equal(mask(M.causal_mask), dense(patterns.causal(n)))
    np.testing.assert_array_equal(mask(M.sliding_window_mask(radius)), dense(patterns.sliding_window(n, radius)))
    np.testing.assert_array_equal(mask(M.and_masks(M.causal_mask, M.sliding_window_mask(radius))),
                                  dense(patterns.sliding_window(n, radius, causal=True)))
    seg = _packed_ids(2, n)
    np.testing.assert_array_equal(mask(M.document_mask(seg), 2), dense(patterns.document_mask(seg)))
    np.testing.assert_array_equal(mask(M.and_masks(M.causal_mask, M.document_mask(seg)), 2),
                                  dense(patterns.document_mask(seg, causal=True)))


def test_bad_input_is_one_clear_message():
    with pytest.raises(ValueError, match="mask_fn must return bool"):
        M.evaluate(lambda b, h, q, k: q - k, 1, 1, 4, 4)
    with pytest.raises(ValueError, match="does not broadcast"):
        M.evaluate(lambda b, h, q, k: (q < k)[..., :2], 1, 1, 4, 4)
    with pytest.raises(ValueError, match="and_masks takes one or more"):
        M.and_masks()
    with pytest.raises(ValueError, match="or_masks takes one or more"):
        M.or_masks(M.causal_mask, 3)
    with pytest.raises(ValueError, match="chunk"):
        M.chunked_mask(0)
    with pytest.raises(ValueError, match="segment_ids"):
        M.document_mask(np.zeros((4,), np.float32))

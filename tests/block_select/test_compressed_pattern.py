"""The compression pattern (`patterns.compressed`, NSA's compressed branch) against a plain transcription of its
rule, and its errors."""

import numpy as np
import pytest

from sparse_attn.patterns import compressed


def rule(n, block, stride, *, causal, valid_len):
    """bool[B, n, n] over the packed stream: query i attends compressed token c (stream position c) iff i is valid,
    c's keys c * stride ... c * stride + block - 1 all lie inside the valid keys and, when causal, end by i."""
    out = np.zeros((len(valid_len), n, n), bool)
    for b, vl in enumerate(valid_len):
        for i in range(vl):
            for c in range(n):
                last = c * stride + block - 1
                out[b, i, c] = last < vl and (not causal or last <= i)
    return out


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("n, block, stride, valid_len", [(37, 8, 4, [37, 20, 5]), (16, 4, 4, [16, 9]),
                                                         (12, 5, 1, [12, 0]), (3, 4, 2, [3])])  # fmt: skip
def test_intervals_follow_the_rule(n, block, stride, valid_len, causal):
    vl = np.asarray(valid_len, np.int32)
    got = compressed.compressed_intervals(n, block, stride, causal=causal, valid_len=vl).to_dense()
    np.testing.assert_array_equal(np.asarray(got)[:, 0], rule(n, block, stride, causal=causal, valid_len=vl))
    counts = compressed.compressed_counts(n, block, stride, causal=causal, valid_len=vl)
    assert int(np.max(counts)) <= compressed.num_compressed(n, block, stride)


def test_block_starts_and_count():
    assert compressed.num_compressed(37, 8, 4) == 8  # starts 0, 4, ..., 28; block 28..35 is the last inside 37
    np.testing.assert_array_equal(compressed.block_starts(37, 8, 4), np.arange(8) * 4)
    assert compressed.num_compressed(3, 4, 2) == 0


def test_overlap_weights():
    w = compressed.overlap_weights(32, 8, 8, 8)
    np.testing.assert_array_equal(w, np.eye(4, dtype=np.float32))  # coinciding blockings: p_slc = p_cmp
    w = compressed.overlap_weights(37, 8, 4, 16)  # token c covers c*4 .. c*4+7
    np.testing.assert_allclose(w.sum(1), 1.0)
    np.testing.assert_allclose(w[3], [0.5, 0.5, 0.0])  # keys 12..19 straddle blocks 0 and 1
    np.testing.assert_allclose(w[5], [0.0, 1.0, 0.0])  # keys 20..27
    np.testing.assert_allclose(w[7], [0.0, 0.5, 0.5])  # keys 28..35


@pytest.mark.parametrize("block, stride, match", [(4, 8, "compress_stride"), (0, 1, "compress_block"),
                                                  (4, 0, "compress_stride")])  # fmt: skip
def test_bad_compression_names_the_argument(block, stride, match):
    with pytest.raises(ValueError, match=match):
        compressed.check_compression(block, stride)

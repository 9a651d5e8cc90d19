"""Compressed tokens (NSA's compression branch): overlapping key blocks, each summarised into one token.

Compressed token c summarises keys `c * stride ... c * stride + block - 1`; there are
`num_compressed(n, block, stride)` of them, none reaching past the sequence. Query i may attend compressed token c
iff i is valid and every key of c's block is valid and, when causal, at or before i (the block *ends* by i: a
token summarising later keys would leak them).

The compressed tokens are packed at positions 0 ... M - 1 of a length-n stream (M <= n), so the rule is one
interval per query, `[0, count(i) - 1]` (`compressed_intervals`), that every `Intervals` executor runs; the
stream's positions are not times, so the pattern itself is not causal (the count is).
"""

from __future__ import annotations

import jax.numpy as jnp
import numpy as np

from sparse_attn.patterns import common
from sparse_attn.patterns.intervals import Intervals


def check_compression(block: int, stride: int) -> tuple[int, int]:
    """(block, stride) as static ints, 1 <= stride <= block, else ValueError naming the argument."""
    block = common.static_int("compress_block", block, low=1)
    stride = common.static_int("compress_stride", stride, low=1)
    if stride > block:
        raise ValueError(f"compress_stride ({stride}) must be <= compress_block ({block}): a larger stride skips keys")
    return block, stride


def num_compressed(n: int, block: int, stride: int) -> int:
    """M: compressed tokens of a length-n sequence (0 when n < block)."""
    return max(0, (n - block) // stride + 1)


def block_starts(n: int, block: int, stride: int) -> np.ndarray:
    """int32[M]: the first key of each compressed token's block."""
    return np.arange(num_compressed(n, block, stride), dtype=np.int32) * stride


def compressed_counts(n: int, block: int, stride: int, *, causal: bool, valid_len=None):
    """int32[B|1, N]: compressed tokens query i may attend (always the first `count` of them; 0 when padded)."""
    n = common.static_int("n (sequence length)", n, low=1)
    block, stride = check_compression(block, stride)
    valid_len = common.valid_len_array(valid_len, n)
    vl = jnp.full((1,), n, jnp.int32) if valid_len is None else valid_len
    i = jnp.arange(n, dtype=jnp.int32)[None, :]
    in_valid = jnp.maximum((vl[:, None] - block) // stride + 1, 0)  # blocks wholly inside the valid keys
    ended = jnp.maximum((i + 1 - block) // stride + 1, 0) if causal else in_valid
    count = jnp.minimum(ended, in_valid)
    return jnp.where(i < vl[:, None], count, 0).astype(jnp.int32)


def compressed_intervals(n: int, block: int, stride: int, *, causal: bool, valid_len=None) -> Intervals:
    """The rule over the packed stream (module docstring): lo = 0, hi = count - 1, leading axes [B|1, 1]."""
    count = compressed_counts(n, block, stride, causal=causal, valid_len=valid_len)[:, None, :]
    lo = jnp.where(count > 0, 0, 1).astype(jnp.int32)
    return Intervals(lo, count - 1)


def overlap_weights(n: int, block: int, stride: int, select_block: int) -> np.ndarray:
    """float32[M, ceil(n / select_block)]: the fraction of compressed token c's keys that lie in selection block j.

    NSA derives selection-block importance from the compression branch's attention probabilities (eq. 9 of the
    paper); here each compressed token's probability is spread over the selection blocks its keys fall in, by
    overlap. When the two blockings coincide (block = stride = select_block) this is the identity, the paper's
    special case `p_slc = p_cmp`.
    """
    select_block = common.static_int("select_block", select_block, low=1)
    starts = block_starts(n, block, stride)
    nkb = -(-n // select_block)
    j0 = np.arange(nkb) * select_block
    lo = np.maximum(starts[:, None], j0[None, :])
    hi = np.minimum(starts[:, None] + block, j0[None, :] + select_block)
    return (np.maximum(hi - lo, 0) / block).astype(np.float32)

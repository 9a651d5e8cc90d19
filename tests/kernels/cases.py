"""Pattern cases for the kernel tests: every pattern kind, small enough for interpret mode."""

from __future__ import annotations

import dataclasses

import jax
import jax.numpy as jnp
import numpy as np

from sparse_attn.patterns import baselines
from sparse_attn.patterns.block_layout import BlockLayout
from sparse_attn.patterns.intervals import Intervals

B, H, G, D = 2, 4, 2, 32


def _labels(n: int, heads: int, words: int, seed: int) -> jax.Array:
    """uint32[1, heads, n, words]: each token holds 1-2 of 40 labels; some tokens hold none (rows with no key)."""
    rng = np.random.default_rng(seed)
    bits = np.zeros((1, heads, n, words), np.uint32)
    for h in range(heads):
        for i in range(n):
            if rng.random() < 0.05:
                continue
            for lab in rng.choice(32 * words, size=rng.integers(1, 3), replace=False):
                bits[0, h, i, lab // 32] |= np.uint32(1) << np.uint32(lab % 32)
    return jnp.asarray(bits)


def random_intervals(n: int, seed: int, *, empty_block: tuple[int, int] | None = (64, 128)) -> Intervals:
    """Per-row random ranges, ~10% empty rows, and optionally one query block with no key at all."""
    rng = np.random.default_rng(seed)
    lo = rng.integers(0, n, size=(B, 1, n))
    width = rng.integers(0, n // 3, size=(B, 1, n))
    hi = np.minimum(lo + width, n - 1)
    empty = rng.random((B, 1, n)) < 0.1
    if empty_block is not None:
        empty[..., empty_block[0] : empty_block[1]] = True
    lo, hi = np.where(empty, 1, lo), np.where(empty, 0, hi)
    return Intervals(jnp.asarray(lo, jnp.int32), jnp.asarray(hi, jnp.int32))


def random_layout(n: int, block: int, seed: int) -> BlockLayout:
    """Random whole blocks (BigBird-like but arbitrary) over random intervals, with an empty query block."""
    mask = random_intervals(n, seed)
    nb = n // block
    rb = jax.random.uniform(jax.random.key(seed), (B, 1, nb, nb)) < 0.3
    rb = rb.at[:, :, 1].set(False)  # query block 1 has neither range nor random block: an empty query block
    return BlockLayout.from_intervals(mask, block, block, random_blocks=rb, max_random=nb)


def make(kind: str, n: int = 256) -> Intervals | BlockLayout:
    if kind == "dense":
        return baselines.dense(n)
    if kind == "causal":
        return baselines.causal(n, valid_len=jnp.array([n, n - 37]))
    if kind == "window":
        return baselines.sliding_window(n, 45)
    if kind == "window_causal":
        return baselines.sliding_window(n, 70, causal=True)
    if kind == "longformer":
        return baselines.longformer(n, 30, 3, valid_len=jnp.array([n - 56, n]))
    if kind == "bigbird":
        return baselines.bigbird(n, 20, 2, 1, 64, jax.random.key(3), batch=B)
    if kind == "document":  # packed documents, one of a single token
        seg = np.repeat(np.arange(5), [40, 90, 1, 60, n - 191])[None].repeat(B, 0)
        return baselines.document_mask(jnp.asarray(seg, jnp.int32), causal=True)
    if kind == "labels":  # per-head label sets over a causal window; pattern heads H' = H
        win = baselines.sliding_window(n, 100, causal=True)
        return dataclasses.replace(win, label_bits=_labels(n, H, 2, 0))
    if kind == "random":
        return random_intervals(n, 1)
    if kind == "random_layout":
        return random_layout(n, 64, 2)
    raise ValueError(kind)


KINDS = ("dense", "causal", "window", "window_causal", "longformer", "bigbird", "document", "labels", "random",
         "random_layout")  # fmt: skip

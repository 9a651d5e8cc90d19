"""Inverted label buckets B_i = {u : z_ui = 1} and the bucket layout the work-skipping executor reads.

Every token is copied into its k buckets; entries are sorted by (label, position), so each bucket is a contiguous
run sorted by position and u's window becomes one contiguous range of entries inside the bucket of each label.
A pair (u, v) sharing several labels appears in each of their shared buckets; only the entry of the lowest shared
label keeps it (docs/labels.md, "Buckets and candidates"), tested per pair as `(below_E & bits_of_v) == 0`.
"""

from __future__ import annotations

from typing import NamedTuple

import jax
import jax.numpy as jnp

from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels.base_graph import BaseGraph


class BucketLayout(NamedTuple):
    """Per sequence (vmap over batch / label heads). E = N * k entries, padding tokens sorted last.

    token_E: int32[E] position of each entry's token.
    lo_E, hi_E: int32[E] inclusive range of key entries (same bucket, inside the token's window); empty: lo > hi.
    below_E: uint32[E, W] the token's labels strictly below the entry's label (the dedup test).
    bits_E: uint32[E, W] the token's labels (the key side of the dedup test).
    entry_NxK: int32[N, K] where each token's k entries landed.
    sizes_L: int32[d] bucket sizes |B_i| over valid tokens.
    """

    token_E: jax.Array
    lo_E: jax.Array
    hi_E: jax.Array
    below_E: jax.Array
    bits_E: jax.Array
    entry_NxK: jax.Array
    sizes_L: jax.Array


def bucket_layout(labels_NxK: jax.Array, num_labels: int, base: BaseGraph, valid_len=None) -> BucketLayout:
    """Builds the layout on device in O(Nk log Nk) (one sort and two binary searches per entry).

    Args:
      labels_NxK: int32[N, k] distinct labels per token (e.g. `bits.top_k_labels`).
      num_labels: d.
      base: the window part of H is used here; landmarks are a separate pass of the executor.
      valid_len: int32 scalar or None.
    """
    n, k = labels_NxK.shape
    bits_lib.check_labels(num_labels, k)
    vl = jnp.int32(n) if valid_len is None else jnp.asarray(valid_len, jnp.int32)
    pos_N = jnp.arange(n, dtype=jnp.int32)
    alive_N = pos_N < vl
    bits_NxW = bits_lib.pack_labels(labels_NxK, num_labels)
    # Padding tokens get the sentinel label d, so they sort after every real bucket.
    lab_NxK = jnp.where(alive_N[:, None], labels_NxK.astype(jnp.int32), num_labels)
    key_NxK = lab_NxK * n + pos_N[:, None]
    order_E = jnp.argsort(key_NxK.reshape(-1))
    key_E = key_NxK.reshape(-1)[order_E]
    token_E = (order_E // k).astype(jnp.int32)
    label_E = lab_NxK.reshape(-1)[order_E]
    lo_pos = jnp.maximum(token_E - base.radius, 0)
    hi_pos = jnp.minimum(token_E if base.causal else token_E + base.radius, vl - 1)
    lo_E = jnp.searchsorted(key_E, label_E * n + lo_pos, side="left", method="sort").astype(jnp.int32)
    hi_E = jnp.searchsorted(key_E, label_E * n + hi_pos, side="right", method="sort").astype(jnp.int32) - 1
    alive_E = label_E < num_labels
    lo_E = jnp.where(alive_E, lo_E, 1)
    hi_E = jnp.where(alive_E, hi_E, 0)
    bits_E = bits_NxW[token_E]
    below_E = bits_lib.bits_below(bits_E, label_E)
    entry_NxK = jnp.zeros((n * k,), jnp.int32).at[order_E].set(jnp.arange(n * k, dtype=jnp.int32)).reshape(n, k)
    sizes_L = jnp.zeros((num_labels,), jnp.int32).at[lab_NxK.reshape(-1)].add(1, mode="drop")
    return BucketLayout(token_E, lo_E, hi_E, below_E, bits_E, entry_NxK, sizes_L)


def bucket_sizes(labels_NxK: jax.Array, num_labels: int, valid_len=None) -> jax.Array:
    """int32[d]: |B_i| over valid tokens (the hard sizes c_i of the balance losses)."""
    n = labels_NxK.shape[0]
    alive = jnp.arange(n) < (n if valid_len is None else valid_len)
    lab = jnp.where(alive[:, None], labels_NxK, num_labels)
    return jnp.zeros((num_labels,), jnp.int32).at[lab.reshape(-1)].add(1, mode="drop")

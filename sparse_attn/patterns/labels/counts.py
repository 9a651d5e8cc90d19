"""Allowed keys per query of the hard label pattern in O(N 2^k log N), without an N x N mask.

A key v in u's window is allowed iff it shares one of u's k labels, so by inclusion-exclusion over the non-empty
subsets T of u's labels, keys(u) = sum_T (-1)^(|T|+1) #{v in window(u) : T ⊆ labels(v)}. Each term is a range
count among the tokens that carry T: entries are sorted by (T, position) once per subset size, and u's window
is two binary searches inside its T-group. Landmarks beyond the window are a dense [N, L] test (L = N / stride).
Meant for the small k of label attention (2^k - 1 subsets); the tests compare it with `LabelPattern.to_dense`.
"""

from __future__ import annotations

import itertools

import jax
import jax.numpy as jnp

from sparse_attn.patterns.labels import bits as bits_lib
from sparse_attn.patterns.labels.base_graph import BaseGraph


def _lower_bound(sorted_E, x_Q, lo_Q, hi_Q):
    """First index in [lo, hi) whose value is >= x (hi if none): a vectorised binary search."""
    steps = max(int(sorted_E.shape[0]).bit_length(), 1)

    def body(_, bounds):
        lo, hi = bounds
        mid = (lo + hi) // 2
        right = (mid < hi) & (sorted_E[jnp.minimum(mid, sorted_E.shape[0] - 1)] < x_Q)
        return jnp.where(right, mid + 1, lo), jnp.where(right | (mid >= hi), hi, mid)

    return jax.lax.fori_loop(0, steps, body, (lo_Q, hi_Q))[0]


def _subset_counts(lab_NxK, size: int, lo_N, hi_N) -> list:
    """Per subset of `size` label slots (in `itertools.combinations` order), int32[N]: tokens v with pos in
    [lo_u, hi_u] whose labels include u's labels at those slots.

    lab_NxK must be sorted along k (so a subset is the same tuple wherever it occurs) and hold a sentinel for
    padding tokens. Every token is entered once per subset of its labels of this size and the entries are sorted
    once by (subset, position); each of u's subsets then counts inside its group by two binary searches.
    """
    n, k = lab_NxK.shape
    combos = list(itertools.combinations(range(k), size))
    pos = jnp.arange(n, dtype=jnp.int32)
    keys = [jnp.concatenate([lab_NxK[:, c[j]] for c in combos]) for j in range(size)]  # [C N] each
    pos_E = jnp.tile(pos, len(combos))
    e = pos_E.shape[0]
    idx = jnp.arange(e, dtype=jnp.int32)
    *keys_s, pos_s, perm_E = jax.lax.sort(keys + [pos_E, idx], num_keys=size + 1)
    new = jnp.concatenate([jnp.ones((1,), bool), jnp.any(jnp.stack([x[1:] != x[:-1] for x in keys_s]), 0)])
    last = jnp.concatenate([new[1:], jnp.ones((1,), bool)])
    start_E = jax.lax.cummax(jnp.where(new, idx, 0))
    end_E = jax.lax.cummin(jnp.where(last, idx + 1, e), reverse=True)
    rank_E = jnp.zeros((e,), jnp.int32).at[perm_E].set(idx)  # where each (subset, position) entry landed
    out = []
    for c in range(len(combos)):
        mine = rank_E[c * n + pos]
        gs, ge = start_E[mine], end_E[mine]
        out.append(_lower_bound(pos_s, hi_N + 1, gs, ge) - _lower_bound(pos_s, lo_N, gs, ge))
    return out


def window_key_counts(labels_NxK, num_labels: int, base: BaseGraph, valid_len=None) -> jax.Array:
    """int32[N]: keys each query attends in the window part of the pattern (self included; 0 on padding)."""
    n, k = labels_NxK.shape
    bits_lib.check_labels(num_labels, k)
    vl = jnp.int32(n) if valid_len is None else jnp.asarray(valid_len, jnp.int32)
    pos = jnp.arange(n, dtype=jnp.int32)
    alive = pos < vl
    lab = jnp.sort(jnp.where(alive[:, None], labels_NxK.astype(jnp.int32), num_labels), axis=1)
    # A repeated label counts once: repeats become labels of their own slot that no other token holds (the bits
    # hold one label either way), so their subsets match the token itself only and cancel.
    slot = num_labels + 1 + pos[:, None] * k + jnp.arange(k, dtype=jnp.int32)[None, :]
    repeat = jnp.concatenate([jnp.zeros((n, 1), bool), lab[:, 1:] == lab[:, :-1]], axis=1)
    lab = jnp.sort(jnp.where(repeat, slot, lab), axis=1)
    lo = jnp.maximum(pos - base.radius, 0)
    hi = jnp.minimum(pos if base.causal else pos + base.radius, vl - 1)
    total = jnp.zeros((n,), jnp.int32)
    for size in range(1, k + 1):
        sign = 1 if size % 2 else -1
        for count in _subset_counts(lab, size, lo, hi):
            total = total + sign * count
    return jnp.where(alive, total, 0)


def landmark_key_counts(bits_NxW, base: BaseGraph, valid_len=None) -> jax.Array:
    """int32[N]: landmarks outside each query's window that it attends (they share a label)."""
    n = bits_NxW.shape[0]
    if not base.landmark_every:
        return jnp.zeros((n,), jnp.int32)
    vl = n if valid_len is None else valid_len
    lm = jnp.asarray(base.landmarks(n))
    pos = jnp.arange(n, dtype=jnp.int32)
    ok = base.landmark_edge(pos[:, None], lm[None, :]) & (pos[:, None] < vl) & (lm[None, :] < vl)
    ok = ok & bits_lib.shares(bits_NxW[:, None, :], bits_NxW[lm][None, :, :])
    return jnp.sum(ok, axis=-1, dtype=jnp.int32)


def label_key_counts(labels_NxK, num_labels: int, base: BaseGraph, valid_len=None) -> jax.Array:
    """int32[N]: allowed keys per query of the hard label pattern (window + landmarks, self included)."""
    bits = bits_lib.pack_labels(labels_NxK, num_labels)
    return window_key_counts(labels_NxK, num_labels, base, valid_len) + landmark_key_counts(bits, base, valid_len)

"""Candidate edges C(u) = ⋃_i (B_i ∩ N_H(u)) \\ {u} two ways, as host (numpy) functions (docs/labels.md,
"Buckets and candidates").

`bucket_candidates` enumerates pairs inside each inverted bucket and keeps a pair only in its lowest shared
label's bucket; `filter_candidates` tests m_u & m_v on every edge of H. They must agree (a tested oracle); both are
for statistics and tests on small n — the executor never materialises pair lists.
"""

from __future__ import annotations

import numpy as np

from sparse_attn.patterns.labels.base_graph import BaseGraph


def _bitsets(labels_NxK: np.ndarray) -> np.ndarray:
    """uint64[N] label bitmask (host only: numpy has 64-bit ints without jax_enable_x64)."""
    out = np.zeros(labels_NxK.shape[0], np.uint64)
    for j in range(labels_NxK.shape[1]):
        out |= np.left_shift(np.uint64(1), labels_NxK[:, j].astype(np.uint64))
    return out


def _ctz64(x: np.ndarray) -> np.ndarray:
    low = x & (~x + np.uint64(1))
    return np.array([int(v).bit_length() - 1 for v in low], np.int64)


def inverted_buckets(labels_NxK, num_labels: int, valid_len: int | None = None) -> list[np.ndarray]:
    """B_i as sorted int arrays of token positions, one per label."""
    labels = np.asarray(labels_NxK)
    n = labels.shape[0]
    vl = n if valid_len is None else int(valid_len)
    return [np.flatnonzero(np.any(labels[:vl] == i, axis=1)) for i in range(num_labels)]


def _neighbours(base: BaseGraph, u: int, n: int) -> np.ndarray:
    """Sorted N_H(u) \\ {u} over positions < n."""
    lo, hi = max(u - base.radius, 0), (u if base.causal else min(u + base.radius, n - 1))
    win = np.arange(lo, hi + 1)
    lms = base.landmarks(n)
    lms = lms[lms <= u] if base.causal else lms
    nb = np.union1d(win, lms)
    return nb[nb != u]


def bucket_candidates(labels_NxK, num_labels: int, base: BaseGraph, valid_len: int | None = None):
    """(pairs int64[P, 2] sorted (u, v), raw) from the buckets with lowest-shared-label dedup.

    raw counts every (u, v, i) with u, v ∈ B_i and v ∈ N_H(u) \\ {u} before dedup (= Σ_{E(H)} |S_u ∩ S_v|).
    """
    labels = np.asarray(labels_NxK)
    n = labels.shape[0]
    vl = n if valid_len is None else int(valid_len)
    m = _bitsets(labels)
    buckets = inverted_buckets(labels, num_labels, vl)
    pairs, raw = [], 0
    for i, members in enumerate(buckets):
        for u in members:
            nb = _neighbours(base, int(u), vl)
            vs = members[np.isin(members, nb, assume_unique=True)]  # B_i ∩ N_H(u): a sorted merge
            raw += len(vs)
            if len(vs):
                owner = _ctz64(m[u] & m[vs])
                vs = vs[owner == i]
                pairs.extend((int(u), int(v)) for v in vs)
    pairs = np.array(sorted(pairs), np.int64).reshape(-1, 2)
    return pairs, raw


def filter_candidates(labels_NxK, base: BaseGraph, valid_len: int | None = None) -> np.ndarray:
    """int64[P, 2] sorted (u, v): every edge of H with m_u & m_v != 0, self excluded (the neighbour filter)."""
    labels = np.asarray(labels_NxK)
    n = labels.shape[0]
    vl = n if valid_len is None else int(valid_len)
    m = _bitsets(labels)
    pairs = []
    for u in range(vl):
        nb = _neighbours(base, u, vl)
        keep = nb[(m[u] & m[nb]) != 0]
        pairs.extend((u, int(v)) for v in keep)
    return np.array(pairs, np.int64).reshape(-1, 2)

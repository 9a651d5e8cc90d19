"""Jones normal form: read the canonical word off a diagram in O(n²) (docs/noncrossing.md,
"Diagram algebra").

The NF is a product of decreasing runs ``(e_{j_1} … e_{k_1}) … (e_{j_r} … e_{k_r})`` with both the heads ``j_s``
and the tails ``k_s`` strictly increasing. It is the shortlex-minimal word of its diagram.
"""

from __future__ import annotations

import itertools
from collections.abc import Iterator

import numpy as np

from sparse_attn.patterns.noncrossing import diagram_np


def _undo_run(p_2N: np.ndarray, m: int, k: int) -> np.ndarray:
    """D' with ``D = D' · (e_{m-1} … e_k)`` and D' straight at m; needs the bottom cup (k, k+1) in D."""
    n = p_2N.shape[0] // 2

    def image(x):  # where a point of D sits in D' (the run shifts bottoms k+2..m left by two)
        if x < n:
            return x
        y = x - n
        return n + y - 2 if k + 2 <= y <= m else x

    out = np.full(2 * n, -1, np.int64)
    far_end = p_2N[m]  # top m's path in D ran D' bottom m-1 -> run's top cap -> D' bottom m -> top m
    for x in range(2 * n):
        if x in (m, far_end) or x in (n + k, n + k + 1):
            continue
        out[image(x)] = image(p_2N[x])
    out[n + m - 1], out[image(far_end)] = image(far_end), n + m - 1
    out[m], out[n + m] = n + m, m
    return out


def diagram_to_jones_nf(p_2N) -> list[int]:
    """The Jones normal form word of a valid diagram."""
    p = np.asarray(p_2N, np.int64).copy()
    if not diagram_np.is_valid(p):
        raise ValueError("not a valid TL diagram (fixed-point-free, involutive, planar partner array)")
    n = p.shape[0] // 2
    runs: list[list[int]] = []
    for m in range(n - 1, 0, -1):
        if p[m] == n + m:
            continue
        ks = [x for x in range(m) if p[n + x] == n + x + 1]
        if not ks:
            raise AssertionError(f"no bottom cup left of {m}: not reachable by a normal form (bug)")
        k = ks[-1]
        runs.insert(0, list(range(m - 1, k - 1, -1)))
        p = _undo_run(p, m, k)
    if not np.array_equal(p, diagram_np.identity(n)):
        raise AssertionError("normal-form peeling did not end at the identity (bug)")
    return [i for run in runs for i in run]


def is_jones_nf(word) -> bool:
    """Whether ``word`` is a product of decreasing runs with strictly increasing heads and tails."""
    w = [int(i) for i in word]
    runs, s = [], 0
    for t in range(1, len(w) + 1):
        if t == len(w) or w[t] != w[t - 1] - 1:
            runs.append((w[s], w[t - 1]))
            s = t
    return all(j1 < j2 and k1 < k2 for (j1, k1), (j2, k2) in itertools.pairwise(runs))


def all_jones_nfs(n: int) -> Iterator[list[int]]:
    """Every NF word of TL_n: pairs of strictly increasing heads j and tails k with k_s <= j_s."""
    m = n - 1

    def rec(prev_j, prev_k):
        yield []
        for j in range(prev_j + 1, m):
            for k in range(prev_k + 1, j + 1):
                for rest in rec(j, k):
                    yield list(range(j, k - 1, -1)) + rest

    yield from rec(-1, -1)

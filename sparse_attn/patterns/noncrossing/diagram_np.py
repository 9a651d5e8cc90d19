"""Temperley–Lieb diagrams on the host (numpy): the oracle-grade implementation.

A diagram on n strands is a partner array ``p_2N`` (int): top point ``a`` has index ``a``, bottom point ``b`` has
index ``n + b``, and ``p[x]`` is the partner of ``x``. ``D1 · D2`` puts D1 on top of D2; the word
``(i_1, …, i_T)`` is ``e_{i_1} · … · e_{i_T}`` (docs/noncrossing.md, "Diagram algebra"). Closed loops are counted,
never stored.
"""

from __future__ import annotations

from collections.abc import Iterator, Sequence

import numpy as np


def check_word(word, n: int) -> np.ndarray:
    """Validates a word of generator indices for TL_n; returns it as ``int64[T]``.

    Raises ValueError for a wrong rank, a non-integer dtype, or an index outside ``0..n-2``.
    """
    if n < 1:
        raise ValueError(f"TL_n needs n >= 1 strands, got n={n}")
    w = np.asarray(word)
    if w.ndim != 1:
        raise ValueError(f"word must be 1-D (a sequence of generator indices), got shape {w.shape}")
    if w.size == 0:
        return np.zeros((0,), np.int64)
    if not np.issubdtype(w.dtype, np.integer):
        raise ValueError(f"word must have an integer dtype, got {w.dtype}")
    if w.min() < 0:
        raise ValueError(f"word has a negative generator index {int(w.min())}")
    if w.max() > n - 2:
        raise ValueError(f"word has generator index {int(w.max())} >= n-1 = {n - 1} (TL_{n} has e_0..e_{n - 2})")
    return w.astype(np.int64)


def identity(n: int) -> np.ndarray:
    """All straight lines: top a <-> bottom a."""
    a = np.arange(n)
    return np.concatenate([a + n, a])


def generator(n: int, i: int) -> np.ndarray:
    """``e_i``: top cap (i, i+1), bottom cup (i, i+1), straight elsewhere."""
    check_word([i], n)
    p = identity(n)
    p[i], p[i + 1] = i + 1, i
    p[n + i], p[n + i + 1] = n + i + 1, n + i
    return p


def rmul_gen(p_2N: np.ndarray, i: int, creator_2N: np.ndarray | None = None, gen_id: int = -1) -> int:
    """In place ``D <- D · e_i`` in O(1); returns the number of closed loops formed (0 or 1).

    If ``creator_2N`` is given, the arcs this generator creates (the joined arc and the new bottom cup) record
    ``gen_id`` in it (the creator gate, docs/noncrossing.md).
    """
    n = p_2N.shape[0] // 2
    x, y = n + i, n + i + 1
    a, b = p_2N[x], p_2N[y]
    if a == y:  # the old cup closes into a loop; the bottom cup is now e_i's own
        if creator_2N is not None:
            creator_2N[[x, y]] = gen_id
        return 1
    p_2N[a], p_2N[b] = b, a
    p_2N[x], p_2N[y] = y, x
    if creator_2N is not None:
        creator_2N[[a, b, x, y]] = gen_id
    return 0


def lmul_gen(p_2N: np.ndarray, i: int) -> int:
    """In place ``D <- e_i · D`` in O(1); returns the number of closed loops formed (0 or 1)."""
    x, y = i, i + 1
    a, b = p_2N[x], p_2N[y]
    if a == y:
        return 1
    p_2N[a], p_2N[b] = b, a
    p_2N[x], p_2N[y] = y, x
    return 0


def word_to_diagram(word, n: int) -> tuple[np.ndarray, int]:
    """``D(w)`` and its loop count, by right multiplication in O(n + T)."""
    w = check_word(word, n)
    p = identity(n)
    loops = 0
    for i in w:
        loops += rmul_gen(p, int(i))
    return p, loops


def compose(p1_2N: np.ndarray, p2_2N: np.ndarray) -> tuple[np.ndarray, int]:
    """``D1 · D2`` in O(n) and the number of closed loops formed in the glued middle row."""
    n = p1_2N.shape[0] // 2
    if p2_2N.shape != p1_2N.shape:
        raise ValueError(f"diagrams differ in size: {p1_2N.shape} vs {p2_2N.shape}")
    res = np.full(2 * n, -1, np.int64)
    seen = np.zeros(n, bool)  # middle points already on a boundary path

    def from_d1(x):  # x: a point of D1 just reached; walk until a boundary point of the result
        while True:
            if x < n:
                return x
            m = x - n
            seen[m] = True
            y = p2_2N[m]
            if y >= n:
                return y
            seen[y] = True
            x = p1_2N[n + y]

    def from_d2(y):  # y: a point of D2 just reached
        while True:
            if y >= n:
                return y
            seen[y] = True
            x = p1_2N[n + y]
            if x < n:
                return x
            seen[x - n] = True
            y = p2_2N[x - n]

    for a in range(n):
        if res[a] == -1:
            end = from_d1(p1_2N[a])
            res[a], res[end] = end, a
    for b in range(n):
        if res[n + b] == -1:
            end = from_d2(p2_2N[n + b])
            res[n + b], res[end] = end, n + b
    loops = 0
    for m in range(n):
        if seen[m]:
            continue
        loops += 1
        cur = m
        while True:  # middle m -> its D2 partner (middle) -> that point's D1 partner (middle) -> ...
            seen[cur] = True
            nxt = p2_2N[cur]
            seen[nxt] = True
            cur = p1_2N[n + nxt] - n
            if cur == m:
                break
    return res, loops


def cyclic_position(n: int) -> np.ndarray:
    """Position of each point in the cyclic order 0..n-1, n+(n-1), …, n+0."""
    b = np.arange(n)
    return np.concatenate([b, 2 * n - 1 - b])


def is_valid(p_2N) -> bool:
    """Fixed-point-free involution that is non-crossing in the cyclic boundary order."""
    p = np.asarray(p_2N)
    if p.ndim != 1 or p.shape[0] % 2 or not np.issubdtype(p.dtype, np.integer):
        return False
    two_n = p.shape[0]
    if two_n == 0:
        return True
    if p.min() < 0 or p.max() >= two_n:
        return False
    x = np.arange(two_n)
    if np.any(p == x) or np.any(p[p] != x):
        return False
    pos = cyclic_position(two_n // 2)
    order = np.argsort(pos)
    stack = []
    for c in range(two_n):  # a non-crossing matching closes arcs in stack order
        pt = order[c]
        if pos[p[pt]] < c:
            if not stack or stack[-1] != p[pt]:
                return False
            stack.pop()
        else:
            stack.append(pt)
    return True


def through_strands(p_2N: np.ndarray) -> list[tuple[int, int]]:
    """Propagating lines ``(a, b)``: top a <-> bottom b, sorted by a."""
    n = p_2N.shape[0] // 2
    return [(a, int(p_2N[a]) - n) for a in range(n) if p_2N[a] >= n]


def caps(p_2N: np.ndarray) -> list[tuple[int, int]]:
    """Top arcs ``(a, a')`` with a < a'."""
    n = p_2N.shape[0] // 2
    return [(a, int(p_2N[a])) for a in range(n) if a < p_2N[a] < n]


def cups(p_2N: np.ndarray) -> list[tuple[int, int]]:
    """Bottom arcs ``(b, b')`` with b < b'."""
    n = p_2N.shape[0] // 2
    return [(b, int(p_2N[n + b]) - n) for b in range(n) if n + b < p_2N[n + b]]


def rank(p_2N: np.ndarray) -> int:
    return len(through_strands(p_2N))


def _matchings(points: Sequence[int]) -> Iterator[list[tuple[int, int]]]:
    """Non-crossing perfect matchings of points listed in cyclic order (docs/noncrossing.md, "Diagram algebra")."""
    if not points:
        yield []
        return
    for j in range(1, len(points), 2):  # the first point pairs at odd offset
        for inside in _matchings(points[1:j]):
            for outside in _matchings(points[j + 1 :]):
                yield [(points[0], points[j])] + inside + outside


def all_diagrams(n: int) -> list[np.ndarray]:
    """Every TL_n diagram (C_n of them), as partner arrays."""
    pos = cyclic_position(n)
    order = [int(x) for x in np.argsort(pos)]
    out = []
    for m in _matchings(order):
        p = np.empty(2 * n, np.int64)
        for x, y in m:
            p[x], p[y] = y, x
        out.append(p)
    return out


def brick_wall_layers(n: int, depth: int, start: str = "even") -> list[list[int]]:
    """``depth`` alternating layers of generators; ``start`` = "even" (L_e first) or "odd" (L_o first)."""
    if start not in ("even", "odd"):
        raise ValueError(f"start must be 'even' or 'odd', got {start!r}")
    first = 0 if start == "even" else 1
    return [list(range((first + t) % 2, n - 1, 2)) for t in range(depth)]


def brick_wall_word(n: int, depth: int, start: str = "even") -> list[int]:
    return [i for layer in brick_wall_layers(n, depth, start) for i in layer]
